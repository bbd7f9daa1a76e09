"""Loads a recipe file: the reader's YAML, the schema's sections and the resolved items, as one RecipeFile.

The resolved recipe, every default filled in, is saved beside each run's outputs so a run can be
repeated exactly (`save_resolved`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import shlex
from collections.abc import Sequence
from typing import Any

import yaml

from tfopt._atomic import write_atomic
from tfopt._version import __version__
from tfopt.errors import RecipeFileError
from tfopt.recipe_file.reader import Locations, apply_override, parse_override, read_text, read_yaml, show, type_name
from tfopt.recipe_file.resolve import (
    SECTION_HELP,
    check_training_names,
    resolve_data,
    resolve_model,
    resolve_recipe_item,
    resolve_recipes,
    yaml_safe,
)
from tfopt.recipe_file.schema import (
    DataSection,
    ModelSection,
    ProfileSection,
    ReportSection,
    RuntimeSection,
    TrainSection,
    check_name,
    check_section,
    fail,
    reject_unknown,
)

_SECTIONS = ("name", "description", "runtime", "model", "data", "train", "recipes", "profile", "report")
_REQUIRED = ("model", "data")


@dataclasses.dataclass(frozen=True)
class RecipeFile:
    """A validated recipe file with every default filled in.

    Attributes:
        path: The file it was read from (None when built from text).
        name: The recipe's name; run directories are called `<name>-<timestamp>`.
        description: Free text, shown by `tfopt-recipe list` and in the report.
        model: The model to build and its arguments.
        data: The data source and its arguments.
        train: How the model is compiled and trained after the recipes are applied.
        recipes: The constructed recipe objects in file order, "default" (tfopt's default recipes, each
            deciding by the hardware) or "auto" (tfopt measures candidates on this machine and keeps
            what helps, within `profile.tune_budget_seconds`).
        profile: How the before/after measurements are taken.
        report: What the report contains.
        runtime: How the process is set up before TensorFlow starts (GPU memory, the GPUs' threads).

    Example:
        >>> recipe = load_recipe("recipes/small_cnn.yaml")
        >>> recipe.name, recipe.model.name, recipe.data.source
        ('small_cnn', 'small_cnn', 'image_folder')
    """

    path: pathlib.Path | None
    name: str
    description: str
    model: ModelSection
    data: DataSection
    train: TrainSection
    recipes: tuple[Any, ...] | str
    profile: ProfileSection
    report: ReportSection
    runtime: RuntimeSection = dataclasses.field(default_factory=RuntimeSection)
    locations: Locations = dataclasses.field(default=None, compare=False, repr=False)

    def where(self, *path: str | int) -> str:
        """Where a key path was set: "recipes/resnet.yaml, line 12" or "--set train.epochs=3"."""
        return self.locations.where(path)

    def wrote(self, *path: str | int) -> bool:
        """Whether the file or a `--set` option wrote the key path, rather than leaving it to its default."""
        return self.locations.wrote(path)

    def error(self, path: Sequence[str | int], message: str) -> RecipeFileError:
        """A RecipeFileError for `path`, its location appended: for errors found after loading."""
        return RecipeFileError(f"{message} ({self.locations.where(tuple(path))})")

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe as plain YAML-safe data; `load_recipe` of its dump gives an equal recipe."""
        recipes = (
            self.recipes
            if isinstance(self.recipes, str)
            else [{recipe.name: yaml_safe(recipe.get_config())} for recipe in self.recipes]
        )
        return {
            "name": self.name,
            "description": self.description,
            "runtime": yaml_safe(dataclasses.asdict(self.runtime)),
            "model": {"name": self.model.name, **yaml_safe(self.model.kwargs)},
            "data": {"source": self.data.source, "batch_size": self.data.batch_size, **yaml_safe(self.data.kwargs)},
            "train": yaml_safe(dataclasses.asdict(self.train)),
            "recipes": recipes,
            "profile": yaml_safe(dataclasses.asdict(self.profile)),
            "report": yaml_safe(dataclasses.asdict(self.report)),
        }


@dataclasses.dataclass(frozen=True)
class RecipeDocument:
    """A recipe file read once: its sections with the `--set` overrides applied, and where each key came from.

    `tfopt-recipe` reads the file once and hands this to what must run before TensorFlow starts
    (`recipe_item_settings`) and then to `load_recipe`, so the file is parsed once per run.

    Example:
        >>> document = read_recipe("recipes/small_cnn.yaml")
        >>> document.path.name, load_recipe(document).name
        ('small_cnn.yaml', 'small_cnn')
    """

    raw: dict
    locations: Locations
    path: pathlib.Path


def read_recipe(path: str | os.PathLike, overrides: Sequence[str] = ()) -> RecipeDocument:
    """Reads a recipe file's YAML and applies the overrides, checking nothing beyond that.

    Raises:
        RecipeFileError: The file is missing, is not YAML, is not a mapping, or an override is malformed.

    Example:
        >>> read_recipe("recipes/small_cnn.yaml", ["train.epochs=1"]).raw["train"]["epochs"]
        1
    """
    if not isinstance(path, (str, os.PathLike)):
        raise RecipeFileError(
            f"A recipe file is named by a path (a str or a pathlib.Path), not a {type(path).__name__}."
        )
    raw, locations = _read(path, overrides)
    return RecipeDocument(raw, locations, pathlib.Path(path))


def load_recipe(
    path: str | os.PathLike | RecipeDocument, overrides: Sequence[str] = (), *, dry: bool = False
) -> RecipeFile:
    """Reads, checks and resolves a recipe file.

    Relative paths inside the file (`data.path`, `data.data_dir`, `profile.logdir`) are relative to the
    file's directory, so a recipe works from any working directory; paths given with `--set` are
    relative to the working directory, where the user typed them.

    Args:
        path: The YAML recipe file, or the `RecipeDocument` `read_recipe` made of it (then `overrides` are
            already applied and must be empty).
        overrides: `key.path=value` strings applied on top of the file before checking (the CLI's
            `--set`); values are parsed as YAML, so `train.epochs=2` is an integer and
            `data.image_size=[32, 32]` a list. List items are addressed by index: `recipes.0.xla.jit_compile=true`.
        dry: Check the file without running or fetching anything it names (`tfopt-recipe validate`,
            `--dry-run`): a model's import path is found but its module not imported (a recipe naming
            one runs that module's code when it runs, as a script does), so the model's arguments are
            checked by `run`; a tfds dataset with `download: true` that is not prepared yet is not
            downloaded. The model's `builder` or the data's `source_object` is then None.

    Returns:
        The resolved recipe.

    Raises:
        RecipeFileError: The file is missing or malformed, or a value is wrong; the message names the
            file, the line, the key path, the value received, what was expected and the fix.

    Example:
        >>> load_recipe("recipes/resnet.yaml", overrides=["data.image_size=[32, 32]"]).data.kwargs["image_size"]
        [32, 32]
    """
    document = path if isinstance(path, RecipeDocument) else read_recipe(path, overrides)
    if overrides and isinstance(path, RecipeDocument):
        raise ValueError("load_recipe: the overrides of a RecipeDocument are applied by read_recipe; pass none here.")
    return _resolve(document.raw, document.locations, document.path, dry=dry)


def runtime_settings(document: RecipeDocument) -> RuntimeSection:
    """The file's `runtime:` section, checked without initialising TensorFlow (`tfopt.run.process` applies
    it before `load_recipe`, which initialises TensorFlow's devices).

    Raises:
        RecipeFileError: A setting is invalid, or settings exclude each other (naming the line).

    Example:
        >>> runtime_settings(read_recipe("recipes/small_cnn.yaml", ["runtime.gpu_memory_growth=true"]))
        RuntimeSection(gpu_memory_growth=True, gpu_memory_limit_bytes=None, gpu_thread_mode=None, gpu_thread_count=None)
    """
    return _runtime(document.raw, document.locations, _bases(document.path))


def recipe_item_settings(document: RecipeDocument, name: str) -> dict[str, Any] | None:
    """The settings of the file's recipe item `name`, read without initialising TensorFlow.

    A worker of a multi-worker cluster must make its MultiWorkerMirroredStrategy (`distribution`) before
    TensorFlow's first op, which `load_recipe` reaches (it checks optimizer names and data sources), so
    `tfopt-recipe` reads that item first, joins, and then loads the whole recipe.

    Args:
        document: The recipe file as `read_recipe` read it.
        name: A recipe name, e.g. "distribution".

    Returns:
        The item's `get_config()` (its constructor arguments, defaults filled in), or None when the
        recipe list has no such item.

    Raises:
        RecipeFileError: The file is malformed or the item is invalid (naming its line).

    Example:
        >>> recipe_item_settings(read_recipe("recipes/small_cnn.yaml"), "distribution")["strategy"]
        'auto'
        >>> recipe_item_settings(read_recipe("recipes/small_cnn.yaml"), "grad_accum") is None
        True
    """
    raw, locations = document.raw, document.locations
    items = raw.get("recipes")
    if not isinstance(items, list):
        return None
    for index, item in enumerate(items):
        item_name = item if isinstance(item, str) else next(iter(item), None) if isinstance(item, dict) else None
        if item_name == name:
            return resolve_recipe_item(item, ("recipes", index), locations).get_config()
    return None


def _read(path: str | os.PathLike, overrides: Sequence[str]) -> tuple[dict, Locations]:
    """The file's mapping of sections with the `--set` overrides applied, and where each key came from."""
    label = os.fspath(path)
    raw, lines = read_yaml(read_text(pathlib.Path(path), label), label)
    locations = Locations(label, lines)
    if raw is None:
        raise RecipeFileError(
            f"Recipe file {label} is empty. Expected a mapping with at least `model:` and "
            "`data:` sections; see recipes/small_cnn.yaml for a complete example."
        )
    if not isinstance(raw, dict):
        raise fail(
            locations,
            (),
            f"A recipe file must be a mapping of sections ({', '.join(_SECTIONS)}); "
            f"received a {type_name(raw)}: {show(raw)}.",
        )
    for override in overrides:
        key_path, value = parse_override(override)
        apply_override(raw, key_path, value, locations, override)
    return raw, locations


def save_resolved(recipe: RecipeFile, path: str | os.PathLike) -> pathlib.Path:
    """Writes the resolved recipe as YAML, atomically (a reader never sees half a file).

    Args:
        recipe: The recipe to save.
        path: The file to write; its directory must exist.

    Returns:
        The path written.

    Example:
        >>> save_resolved(load_recipe("recipes/small_cnn.yaml"), "resolved.yaml")  # doctest: +SKIP
    """
    path = pathlib.Path(path)
    header = (
        f"# Resolved by tfopt {__version__} on {datetime.datetime.now().isoformat(timespec='seconds')}"
        f" from {recipe.path or 'text'}: every default is filled in.\n"
        f"# Repeat this run with: tfopt-recipe run {shlex.quote(os.fspath(path))}\n"
    )
    return write_atomic(path, header + yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=None))


def _resolve(raw: dict, locations: Locations, file_path: pathlib.Path, *, dry: bool) -> RecipeFile:
    reject_unknown(raw, _SECTIONS, (), locations, "section")
    for section in _REQUIRED:
        if section not in raw:
            raise fail(
                locations, (), f"The recipe has no `{section}:` section; it is required. {SECTION_HELP[section]}"
            )
    bases = _bases(file_path)
    name = check_name(raw.get("name", file_path.stem), locations)
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise fail(
            locations,
            ("description",),
            f"description: {show(description)} is a {type_name(description)}; expected a string",
        )
    # Cheap checks first, so a typo is reported before TensorFlow is imported or data is touched.
    runtime = _runtime(raw, locations, bases)
    train = check_section(TrainSection, raw.get("train"), ("train",), locations, bases)
    profile = check_section(ProfileSection, raw.get("profile"), ("profile",), locations, bases)
    report = check_section(ReportSection, raw.get("report"), ("report",), locations, bases)
    recipes = resolve_recipes(raw.get("recipes", "default"), locations)  # needs no TensorFlow either
    model = resolve_model(raw["model"], locations, bases, import_code=not dry)
    check_training_names(train, locations)
    data = resolve_data(raw["data"], train, locations, bases, fetch=not dry)
    return RecipeFile(
        path=file_path,
        name=name,
        description=description,
        model=model,
        data=data,
        train=dataclasses.replace(train, batch_size=data.batch_size),
        recipes=recipes,
        profile=profile,
        report=report,
        runtime=runtime,
        locations=locations,
    )


def _bases(file_path: pathlib.Path) -> dict[str, pathlib.Path]:
    """What relative paths are relative to: the file's directory, or for `--set` the working directory."""
    return {"file": file_path.resolve().parent, "option": pathlib.Path.cwd()}


def _runtime(raw: dict, locations: Locations, bases: dict) -> RuntimeSection:
    section = check_section(RuntimeSection, raw.get("runtime"), ("runtime",), locations, bases)
    if section.gpu_memory_growth and section.gpu_memory_limit_bytes is not None:
        raise fail(
            locations,
            ("runtime", "gpu_memory_growth"),
            f"runtime: gpu_memory_growth: true and gpu_memory_limit_bytes: {section.gpu_memory_limit_bytes} "
            "exclude each other (TensorFlow refuses memory growth on a device with a memory limit). Set "
            "gpu_memory_growth: false to cap memory, or drop gpu_memory_limit_bytes to grow as needed",
        )
    if section.gpu_thread_count is not None and section.gpu_thread_mode in (None, "global"):
        raise fail(
            locations,
            ("runtime", "gpu_thread_count"),
            f"runtime: gpu_thread_count: {section.gpu_thread_count} needs threads of the GPUs' own to count: add "
            "gpu_thread_mode: gpu_private (or gpu_shared), or drop gpu_thread_count",
        )
    return section
