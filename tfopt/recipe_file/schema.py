"""The fixed sections of a recipe file (`train:`, `profile:`, `report:`) and how their values are checked.

Like TF Model Garden's configs, the schema is strict: an unknown key, a wrong type or an out-of-range
value is a `RecipeFileError` saying what was received, what was expected and the closest valid key, so
a typo never falls back to a default silently. Each setting's type and range live beside its default,
in the dataclass field's metadata, so the check and the documentation cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from tfopt.errors import RecipeFileError
from tfopt.recipe_file.reader import Locations, dotted, show, type_name
from tfopt.runtime import GPU_THREAD_MODES
from tfopt.suggest import did_you_mean

REPORT_FORMATS = ("html", "markdown", "json")
"""Report formats a run can write; each is `tfopt.profiling.report.Report.save` of report.<suffix>."""
REPORT_SUFFIXES = {"html": ".html", "markdown": ".md", "json": ".json"}


def _setting(
    default: Any,
    kind: Any,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    nullable: bool = False,
    choices: tuple[str, ...] = (),
) -> Any:
    if kind is int and at_most is None:
        at_most = _MOST_INT
    metadata = {
        "kind": kind,
        "at_least": at_least,
        "above": above,
        "at_most": at_most,
        "nullable": nullable,
        "choices": choices,
    }
    return dataclasses.field(default=default, metadata=metadata)


# TensorFlow counts steps and sizes batches in 32-bit integers: a larger count fails deep inside it, late.
_MOST_INT = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class TrainSection:
    """How the model is compiled and trained after the recipes are applied (`train:`). A model its function
    returns compiled keeps its own compile: optimizer, learning_rate, loss and metrics are then not used.

    `checkpoint_every_steps` bounds what a killed run loses: `tfopt-recipe run FILE --out RUN --resume`
    restarts from the newest checkpoint (also written at every epoch end).
    """

    optimizer: str = _setting("adam", str)
    learning_rate: float = _setting(0.001, float, above=0)
    loss: str = _setting("sparse_categorical_crossentropy", str)
    metrics: tuple[str, ...] = _setting(("accuracy",), list)
    epochs: int = _setting(1, int, at_least=0)
    steps_per_epoch: int | None = _setting(None, int, at_least=1, nullable=True)
    batch_size: int | None = _setting(None, int, at_least=1, nullable=True)
    seed: int = _setting(0, int, at_least=0, at_most=2**32 - 1)  # NumPy's seeds, which Keras' seeding sets
    checkpoint_every_steps: int = _setting(100, int, at_least=1)


@dataclasses.dataclass(frozen=True)
class ProfileSection:
    """How the before/after measurements are taken (`profile:`); logdir None means `<run>/tensorboard`.

    `tune_budget_seconds` is the time `recipes: auto` may spend timing candidate recipes.
    """

    steps: int = _setting(20, int, at_least=2, at_most=100_000)  # measured twice at least: a bound a run ends in
    warmup_steps: int = _setting(5, int, at_least=1, at_most=100_000)
    logdir: str | None = _setting(None, "path", nullable=True)
    tune_budget_seconds: float = _setting(120.0, float, above=0)


@dataclasses.dataclass(frozen=True)
class ReportSection:
    """What the report holds (`report:`): report.html/.md/.json, all rendered by `tfopt.profiling.report`
    from one set of numbers; price_per_hour adds the cost per epoch before and after."""

    formats: tuple[str, ...] = _setting(REPORT_FORMATS, list, choices=REPORT_FORMATS)
    price_per_hour: float | None = _setting(None, float, at_least=0, nullable=True)


@dataclasses.dataclass(frozen=True)
class RuntimeSection:
    """How the process that runs the recipe is set up (`runtime:`), before TensorFlow initialises its
    devices: settings of the process, not recipes (see `tfopt.runtime`).

    `gpu_memory_growth: true` allocates GPU memory as needed (by default TensorFlow reserves nearly all of
    every GPU at start); `gpu_memory_limit_bytes` caps this process' memory on each GPU instead (with
    growth false or unset). Both unset: TensorFlow's default.

    `gpu_thread_mode: gpu_private` gives each GPU threads of its own to launch kernels from
    (TF_GPU_THREAD_MODE; `gpu_thread_count` of them, else the environment's TF_GPU_THREAD_COUNT, else
    TensorFlow's 2). Unset: the environment's TF_GPU_THREAD_MODE, else TensorFlow's `global`.
    """

    gpu_memory_growth: bool | None = _setting(None, bool, nullable=True)
    gpu_memory_limit_bytes: int | None = _setting(None, int, at_least=2**20, at_most=2**50, nullable=True)
    gpu_thread_mode: str | None = _setting(None, str, nullable=True, choices=GPU_THREAD_MODES)
    gpu_thread_count: int | None = _setting(None, int, at_least=1, nullable=True)


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """The model to build (`model:`).

    Attributes:
        name: A tfopt built-in, a keras.applications name, or an import path `package.module:function`.
        kwargs: The builder's keyword arguments, defaults filled in.
        given: The keyword arguments the file wrote; `input_shape` and `classes` are taken from the
            data when not given.
        builder: The function that builds the model; None for an import path found but not imported
            when the recipe was loaded without running its code (`load_recipe(..., dry=True)`).
    """

    name: str
    kwargs: dict[str, Any]
    given: frozenset[str]
    builder: Any = dataclasses.field(compare=False, repr=False)

    @property
    def is_import_path(self) -> bool:
        """Whether the model is the user's own function (`package.module:function`), which may compile it."""
        return ":" in self.name


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The data source (`data:`): its name, the batch size and the source's keyword arguments.

    Attributes:
        source: A name from `tfopt.data.SOURCES`.
        batch_size: Examples per training step.
        kwargs: The source's keyword arguments, defaults filled in.
        source_object: The constructed source (constructing it is how its arguments are checked); None
            for a dataset still to be downloaded when the recipe was loaded without fetching anything
            (`load_recipe(..., dry=True)`).
    """

    source: str
    batch_size: int
    kwargs: dict[str, Any]
    source_object: Any = dataclasses.field(compare=False, repr=False)


def fail(locations: Locations, path: tuple, message: str) -> RecipeFileError:
    return RecipeFileError(f"{message.rstrip('. ')} ({locations.where(path)}).")


def reject_unknown(mapping: dict, valid: Sequence[str], path: tuple, locations: Locations, what: str) -> None:
    for key, value in mapping.items():
        if key not in valid:
            hint = did_you_mean(key, valid)
            raise fail(
                locations,
                (*path, key),
                f"{dotted((*path, key))}: unknown {what} {key!r} (received {key}: {show(value)}).{hint} "
                f"Valid: {', '.join(valid) or '(none)'}",
            )


def _expected(metadata: dict) -> str:
    kind = metadata["kind"]
    text = {
        bool: "true or false",
        int: "an integer",
        float: "a number",
        str: "a string",
        "path": "a path",
        list: "a list of strings",
    }[kind]
    if metadata["choices"]:
        text += f" from {', '.join(metadata['choices'])}"
    if metadata["at_least"] is not None:
        text += f" >= {metadata['at_least']}"
    if metadata["above"] is not None:
        text += f" > {metadata['above']}"
    if metadata["at_most"] is not None:
        text += f" and <= {metadata['at_most']:,}"
    return text + (" or null" if metadata["nullable"] else "")


def check_setting(value: Any, metadata: dict, path: tuple, locations: Locations, bases: dict) -> Any:
    kind = metadata["kind"]
    if value is None and metadata["nullable"]:
        return None
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    valid_type = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        float: numeric,
        str: isinstance(value, str),
        "path": isinstance(value, str) and value != "",
        list: isinstance(value, list) and all(isinstance(item, str) for item in value),
    }[kind]
    out_of_range = (
        valid_type
        and numeric
        and (
            not math.isfinite(value)  # nan passes every comparison below
            or (metadata["at_least"] is not None and value < metadata["at_least"])
            or (metadata["above"] is not None and value <= metadata["above"])
            or (metadata["at_most"] is not None and value > metadata["at_most"])
        )
    )
    if not valid_type or out_of_range:
        problem = "is out of range" if out_of_range else f"is a {type_name(value)}"
        raise fail(locations, path, f"{dotted(path)}: {show(value)} {problem}; expected {_expected(metadata)}")
    if kind is str and metadata["choices"] and value not in metadata["choices"]:
        raise fail(
            locations,
            path,
            f"{dotted(path)}: {value!r} is not one of {', '.join(metadata['choices'])}."
            + did_you_mean(value, metadata["choices"]),
        )
    if kind is list:
        for index, item in enumerate(value):
            if metadata["choices"] and item not in metadata["choices"]:
                raise fail(
                    locations,
                    (*path, index),
                    f"{dotted(path)}: {item!r} is not one of {', '.join(metadata['choices'])}",
                )
        if not value:
            raise fail(locations, path, f"{dotted(path)}: received an empty list; expected {_expected(metadata)}")
        return tuple(value)
    if kind == "path":  # a directory to write (profile.logdir), made where it is missing
        directory = absolute(value, path, locations, bases)
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise fail(
                locations,
                path,
                f"{dotted(path)}: {directory} is a file, not a directory; name a directory (made if missing)",
            )
        return directory
    return float(value) if kind is float else value


def absolute(value: str, path: tuple, locations: Locations, bases: dict) -> str:
    base = bases["option"] if locations.is_option(path) else bases["file"]
    return os.path.normpath(base / os.path.expanduser(value))


def check_section(cls: type, raw: Any, path: tuple, locations: Locations, bases: dict) -> Any:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise fail(locations, path, f"{dotted(path)}: expected a mapping of settings, received {show(raw)}")
    fields = dataclasses.fields(cls)
    reject_unknown(raw, [field.name for field in fields], path, locations, f"key of {path[0]}")
    return cls(
        **{
            field.name: check_setting(raw[field.name], field.metadata, (*path, field.name), locations, bases)
            for field in fields
            if field.name in raw
        }
    )


def check_name(name: Any, locations: Locations) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise fail(
            locations,
            ("name",),
            f"name: {show(name)} cannot name a run directory; expected letters, "
            "digits, '_', '.' or '-' (at most 64), e.g. name: resnet50-imagenet",
        )
    return name
