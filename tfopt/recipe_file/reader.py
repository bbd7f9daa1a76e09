"""Reading a recipe file's YAML: safe loading that remembers the line of every key, and `--set` overrides.

A recipe file is data, never code: it is read with YAML's safe loader, so `!!python/...` tags are
rejected. Every key and list item keeps the line it came from (`Locations`), so a mistake found much
later, while resolving a model or a data source, can still name the line; a value replaced by `--set`
names that option instead. Duplicate keys are errors (YAML would silently keep the last one), and alias
expansion and size are bounded. A `--set` value is read by the same loader within the same bounds: the
command line is an input channel like the file.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import yaml

from tfopt.errors import RecipeFileError

_MAX_NODES = 100_000
# A recipe file is a few dozen lines; a file or a `--set` value past this is a mistake (and below Linux's
# 128 KiB limit on one command-line argument, so the same bound holds on both channels).
MOST_BYTES = 100_000
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"


class SafeLoader(yaml.SafeLoader):
    """YAML's safe loader, reading `1e-3` as a float as YAML 1.2 does (PyYAML's 1.1 rules need `1.0e-3`
    and would hand a learning rate over as the string '1e-3')."""


SafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


class Locations:
    """Where each key path of a recipe came from: a line of the file, or a `--set` option."""

    def __init__(self, label: str, lines: dict[tuple, int]):
        self.label = label
        self._lines = dict(lines)
        self._options: dict[tuple, str] = {}

    def where(self, path: tuple) -> str:
        """The location of `path`, or of its closest enclosing key that has one; a key only a `--set` option wrote
        below it (a section the option made: `--set bogus.key=1`) is that option's."""
        path = tuple(path)
        options_below = [option for key, option in self._options.items() if key[: len(path)] == path]
        if options_below and not any(key[: len(path)] == path for key in self._lines):
            return options_below[0]
        for end in range(len(path), -1, -1):
            prefix = path[:end]
            if prefix in self._options:
                return self._options[prefix]
            if prefix in self._lines:
                return f"{self.label}, line {self._lines[prefix]}"
        return self.label

    def wrote(self, path: tuple) -> bool:
        """Whether the file or a `--set` option wrote `path` (rather than leaving it to its default)."""
        return tuple(path) in self._lines or self.is_option(path)

    def is_option(self, path: tuple) -> bool:
        """Whether `path` was set by a `--set` option rather than the file."""
        return any(tuple(path[:end]) in self._options for end in range(len(path), -1, -1))

    def override(self, path: tuple, option: str) -> None:
        """Records that `option` replaced the value at `path` and everything below it."""
        for table in (self._lines, self._options):
            for key in [key for key in table if key[: len(path)] == path]:
                del table[key]
        self._options[path] = option


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """Splits a `--set` option `key.path=value` into its key path and its YAML-parsed value.

    Raises:
        RecipeFileError: There is no `=`, the key path is empty, or the value is not valid YAML.

    Example:
        >>> parse_override("data.image_size=[32, 32]")
        (('data', 'image_size'), [32, 32])
    """
    key, separator, value_text = text.partition("=")
    parts = tuple(key.strip().split("."))
    if not separator or not all(part.strip() for part in parts):
        raise RecipeFileError(
            f"--set {text!r}: expected key.path=value, e.g. --set train.epochs=3 or --set data.image_size=[32,32]."
        )
    label = f"--set {key.strip()}"
    if len(value_text.encode("utf-8", "surrogateescape")) > MOST_BYTES:
        raise RecipeFileError(
            f"{label}: the value is {len(value_text):,} characters, longer than the {MOST_BYTES:,} bytes a "
            "recipe file may hold. Put large values in the recipe file, or in a file it names."
        )
    try:
        yaml.compose(value_text, Loader=SafeLoader)  # its syntax alone: aliases are not expanded yet
    except yaml.YAMLError as error:
        raise RecipeFileError(
            f"--set {text!r}: the value is not valid YAML ({yaml_problem(error)}). "
            "Quote strings that contain ': ' or '#'."
        ) from None
    except RecursionError:
        pass  # read_yaml says it
    value, _ = read_yaml(value_text, label)
    return tuple(part.strip() for part in parts), value


def read_text(path: pathlib.Path, label: str) -> str:
    try:
        # Read to one byte past the bound, whatever the file is: a device (/dev/zero) or a pipe has no size.
        with open(path, "rb") as file:
            content = file.read(MOST_BYTES + 1)
        if len(content) > MOST_BYTES:
            raise RecipeFileError(
                f"Recipe file {label} holds more than the {MOST_BYTES:,} bytes a recipe file may hold: a "
                "recipe is a few dozen lines of settings. Check that it is the recipe you meant."
            )
        return content.decode("utf-8-sig")  # an editor's byte-order mark is no part of the first key
    except FileNotFoundError:
        raise RecipeFileError(
            f"Recipe file {label} does not exist (looked for {path.resolve()}). Check the "
            "path; the shipped recipes are in the recipes/ directory of tfopt."
        ) from None
    except IsADirectoryError:
        try:
            inside = sorted(item.name for item in path.iterdir() if item.suffix in (".yaml", ".yml"))
        except OSError:
            inside = []
        raise RecipeFileError(
            f"{label} is a directory; expected a YAML recipe file"
            + (f", such as {label.rstrip('/')}/{inside[0]}." if inside else " (none is in it).")
        ) from None
    except UnicodeDecodeError as error:
        raise RecipeFileError(
            f"Recipe file {label} is not UTF-8 text ({error.reason} at byte {error.start}); save it as UTF-8."
        ) from None
    except OSError as error:
        raise RecipeFileError(f"Cannot read recipe file {label}: {error.strerror}.") from None


def read_yaml(text: str, label: str) -> tuple[Any, dict[tuple, int]]:
    """Parses YAML with the safe loader, recording the line of every key and list item."""
    loader = SafeLoader(text)
    lines: dict[tuple, int] = {}
    try:
        node = loader.get_single_node()
        if node is None:
            return None, lines
        lines[()] = node.start_mark.line + 1
        return _construct(loader, node, (), lines, [0], label), lines
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        hint = (
            ". Recipe files are plain data read with YAML's safe loader: tags that create Python "
            "objects (!!python/...) are not allowed; name a model by import path instead"
            if "constructor for the tag" in str(error.problem)
            else ". YAML indents with spaces: replace the tab with spaces"
            if "'\\t'" in str(error.problem)
            else ""
        )
        problem = yaml_problem(error).replace("tag:yaml.org,2002:", "!!").rstrip(".")
        raise RecipeFileError(f"{label} is not a valid recipe file: {problem}{hint} ({label}{where}).") from None
    except yaml.YAMLError as error:
        raise RecipeFileError(f"{label} is not valid YAML: {error}") from None
    except RecursionError:
        raise RecipeFileError(
            f"{label} nests its values thousands of levels deep; a recipe file is a few "
            "levels of plain mappings and lists."
        ) from None
    finally:
        loader.dispose()


def _construct(loader: Any, node: Any, path: tuple, lines: dict, visited: list[int], label: str) -> Any:
    visited[0] += 1
    if visited[0] > _MAX_NODES:
        raise RecipeFileError(
            f"{label} expands to more than {_MAX_NODES} YAML nodes (aliases that "
            "reference aliases?); a recipe file is a few dozen lines."
        )
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_object(node, deep=True)
    if node.tag not in (_MAP_TAG, _SEQ_TAG):
        tag = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise RecipeFileError(
            f"{label}: the tag {tag} is not allowed (at {dotted(path) or 'the top'}). Recipe "
            "files are plain data read with YAML's safe loader: they hold mappings, lists and "
            f"scalars, and name a model by import path instead ({label}, line {line})."
        )
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            items.append(_construct(loader, item, (*path, index), lines, visited, label))
        return items
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        key_line = key_node.start_mark.line + 1
        if not isinstance(key, str):
            raise RecipeFileError(
                f"{label}: key {show(key)} under {dotted(path) or 'the top'} is a "
                f"{type_name(key)}, expected a string (YAML reads yes/no/on/off as "
                f"booleans: quote the key) ({label}, line {key_line})."
            )
        if key in seen:
            raise RecipeFileError(
                f"{label}: key {dotted((*path, key))} appears twice (first on line "
                f"{seen[key]}); YAML would silently keep the last one. Delete "
                f"one ({label}, line {key_line})."
            )
        seen[key] = key_line
    # Merge keys (`<<: *defaults`) are flattened into the mapping first, so the mapping's own keys win.
    loader.flatten_mapping(node)
    mapping: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str):
            raise RecipeFileError(
                f"{label}: a merge key (<<) under {dotted(path) or 'the top'} brings in the "
                f"non-string key {show(key)} ({label}, line {key_node.start_mark.line + 1})."
            )
        lines[(*path, key)] = key_node.start_mark.line + 1
        mapping[key] = _construct(loader, value_node, (*path, key), lines, visited, label)
    return mapping


def yaml_problem(error: yaml.YAMLError) -> str:
    if isinstance(error, yaml.MarkedYAMLError):
        return " ".join(part for part in (error.context, error.problem) if part)
    return str(error)


def apply_override(raw: dict, path: tuple[str, ...], value: Any, locations: Locations, text: str) -> None:
    target: Any = raw
    resolved: list[str | int] = []
    for index, part in enumerate(path):
        last = index == len(path) - 1
        if isinstance(target, list):
            if not part.isdigit() or int(part) >= len(target):
                raise RecipeFileError(
                    f"--set {text}: {dotted(tuple(resolved))} is a list of {len(target)} "
                    f"items; expected an index from 0 to {len(target) - 1}, received {part!r}."
                )
            part = int(part)
        elif not isinstance(target, dict):
            raise RecipeFileError(
                f"--set {text}: {dotted(tuple(resolved))} is {show(target)}, not a mapping, so it has no key {part!r}."
            )
        resolved.append(part)
        if last:
            target[part] = value
        else:
            if isinstance(target, dict) and target.get(part) is None:
                target[part] = {}
            target = target[part]
    locations.override(tuple(resolved), f"--set {text}")


def dotted(path: Sequence[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def type_name(value: Any) -> str:
    names = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "list",
        dict: "mapping",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)
