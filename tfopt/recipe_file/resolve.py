"""Resolving the open-ended sections of a recipe file: the model, the data source and the recipe items.

These are checked the way they will be used: the model function's signature decides its valid
arguments, a data source is checked by constructing it, and a recipe item by constructing the recipe
(its constructor is its schema). A constructor's error points at the line of the argument its `setting`
names, and a clash of recipes at the later of the two items its `recipes` name.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Sequence
from typing import Any

from tfopt.errors import RecipeClashError, TfoptError
from tfopt.recipe_file.reader import Locations, dotted, show
from tfopt.recipe_file.schema import (
    DataSection,
    ModelSection,
    TrainSection,
    absolute,
    check_setting,
    fail,
    reject_unknown,
)
from tfopt.suggest import did_you_mean

_PATH_KEYS = ("path", "data_dir", "x", "y")  # x, y: the numpy source's .npz/.npy files
_FILLED_FROM_DATA = ("input_shape", "classes")
_DEFAULT_BATCH_SIZE = 32
SECTION_HELP = {
    "model": "Name a model, e.g. `model: {name: small_cnn}`, `model: {name: ResNet50, weights: null}` or "
    "`model: {name: my_package.models:build_model}`.",
    "data": "Name a data source, e.g. `data: {source: image_folder}` (tfopt's embedded dataset) or "
    "`data: {source: synthetic, kind: image}`.",
}


def _parameters(function: Any) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters of `function`, and whether it also takes **kwargs."""
    parameters = inspect.signature(function).parameters
    named = {
        name: parameter
        for name, parameter in parameters.items()
        if parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
    }
    return named, any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values())


def yaml_safe(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return [yaml_safe(item) for item in value]
    if isinstance(value, dict):
        return {key: yaml_safe(item) for key, item in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def _is_yaml_safe(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_yaml_safe(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_yaml_safe(item) for key, item in value.items())
    return value is None or isinstance(value, (bool, int, float, str))


def _fill_defaults(kwargs: dict, parameters: dict[str, inspect.Parameter], skip: Sequence[str]) -> dict:
    filled = dict(kwargs)
    for name, parameter in parameters.items():
        if (
            name not in filled
            and name not in skip
            and parameter.default is not parameter.empty
            and _is_yaml_safe(parameter.default)
        ):
            filled[name] = yaml_safe(parameter.default)
    return filled


def _setting_path(path: tuple, written: dict, error: Exception) -> tuple:
    """The key path of the setting `error` is about where the file wrote it, else `path` itself.

    A constructor names the setting in `TfoptError.setting`; a setting left to its default, or an error
    about no single one (or not a tfopt error), points at the mapping that holds the settings.
    """
    setting = getattr(error, "setting", None)
    return (*path, setting) if setting is not None and setting in written else path


def resolve_model(raw: Any, locations: Locations, bases: dict, *, import_code: bool = True) -> ModelSection:
    from tfopt import models

    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, dict) or "name" not in raw:
        raise fail(
            locations,
            ("model",),
            f"model: received {show(raw)}; expected a mapping with a `name:`. {SECTION_HELP['model']}",
        )
    name = raw["name"]
    try:
        builder = models.resolve_model(name, search_paths=[bases["file"], bases["option"]], import_code=import_code)
    except ValueError as error:
        raise fail(locations, ("model", "name"), f"model.name: {error}") from None
    kwargs = {key: value for key, value in raw.items() if key != "name"}
    if builder is None:  # an import path found but not imported: its arguments are checked when it runs
        return ModelSection(name=name, kwargs=kwargs, given=frozenset(kwargs), builder=None)
    parameters, takes_any = _parameters(builder)
    if not takes_any:
        reject_unknown(
            kwargs, [key for key in parameters if key != "name"], ("model",), locations, f"argument of model {name}"
        )
    missing = [
        key
        for key, parameter in parameters.items()
        if parameter.default is parameter.empty and key not in kwargs and key not in _FILLED_FROM_DATA
    ]
    if missing:
        raise fail(
            locations, ("model",), f"model {name} needs the argument(s) {', '.join(missing)}; add them under `model:`"
        )
    for key, value in kwargs.items():  # the values tfopt's own models take, as they check them first
        try:
            models.check_arguments(name, **{key: value})
        except ValueError as error:
            raise fail(locations, ("model", key), f"model.{error}") from None
    given = frozenset(kwargs)
    if name in models.application_names() and "weights" not in kwargs:
        # keras.applications defaults to weights="imagenet", a download: tfopt never downloads unasked.
        kwargs["weights"] = None
    # keras.applications' own `name` argument is shadowed by `model.name`, which says what to build.
    return ModelSection(
        name=name, kwargs=_fill_defaults(kwargs, parameters, skip=("name",)), given=given, builder=builder
    )


def resolve_data(
    raw: Any, train: TrainSection, locations: Locations, bases: dict, *, fetch: bool = True
) -> DataSection:
    import tfopt.data

    if not isinstance(raw, dict) or "source" not in raw:
        raise fail(
            locations,
            ("data",),
            f"data: received {show(raw)}; expected a mapping with a `source:`. {SECTION_HELP['data']}",
        )
    source = raw["source"]
    known = sorted(tfopt.data.SOURCES)
    if not isinstance(source, str) or source not in known:
        raise fail(
            locations,
            ("data", "source"),
            f"data.source: unknown data source {show(source)}."
            f"{did_you_mean(str(source), known)} "
            f"Expected one of {', '.join(known)}",
        )
    batch_size = _resolve_batch_size(raw, train, locations)
    kwargs = {key: value for key, value in raw.items() if key not in ("source", "batch_size")}
    parameters, takes_any = _parameters(tfopt.data.SOURCES[source])
    if not takes_any:
        reject_unknown(
            kwargs,
            [key for key in parameters if key != "batch_size"],
            ("data",),
            locations,
            f"argument of data source {source}",
        )
    for key in _PATH_KEYS:
        if isinstance(kwargs.get(key), str) and kwargs[key]:
            kwargs[key] = absolute(kwargs[key], ("data", key), locations, bases)
    if source == "image_folder" and kwargs.get("path") is None:
        kwargs["path"] = os.fspath(tfopt.data.default_dataset_dir())
    kwargs = _fill_defaults(kwargs, parameters, skip=("batch_size",))
    extra = {"batch_size": batch_size} if "batch_size" in parameters else {}
    later = not fetch and kwargs.get("download") is True  # a download is checked for, not made
    try:
        # The class itself, not make_source(name, **kwargs): the tfds source's own `name` argument would
        # collide with make_source's first parameter.
        source_object = tfopt.data.SOURCES[source](**{**kwargs, **({"download": False} if later else {})}, **extra)
    except (TfoptError, ValueError, TypeError) as error:
        if later and getattr(error, "setting", None) == "data_dir":  # not prepared yet: `run` downloads it
            return DataSection(source=source, batch_size=batch_size, kwargs=kwargs, source_object=None)
        message = str(error) if str(error).startswith(source) else f"data ({source}): {error}"
        raise fail(locations, _setting_path(("data",), raw, error), message) from None
    return DataSection(source=source, batch_size=batch_size, kwargs=kwargs, source_object=source_object)


def _resolve_batch_size(raw: dict, train: TrainSection, locations: Locations) -> int:
    metadata = next(field.metadata for field in dataclasses.fields(TrainSection) if field.name == "batch_size")
    batch_size = check_setting(raw.get("batch_size"), metadata, ("data", "batch_size"), locations, {})
    if batch_size is not None and train.batch_size is not None and batch_size != train.batch_size:
        raise fail(
            locations,
            ("train", "batch_size"),
            f"train.batch_size: {train.batch_size} differs from data.batch_size: {batch_size} "
            f"({locations.where(('data', 'batch_size'))}); they are one number. Write it in one place",
        )
    return batch_size or train.batch_size or _DEFAULT_BATCH_SIZE


def check_training_names(train: TrainSection, locations: Locations) -> None:
    import keras

    lookups = [
        ("optimizer", train.optimizer, keras.optimizers),
        ("loss", train.loss, keras.losses),
        *((("metrics", index), metric, keras.metrics) for index, metric in enumerate(train.metrics)),
    ]
    for key, value, module in lookups:
        try:
            module.get(value)
        except (ValueError, TypeError):
            known = sorted(
                {
                    name
                    for name in dir(module)
                    if not name.startswith("_") and name[0].islower() and callable(getattr(module, name))
                }
                | {
                    name.lower()
                    for name in dir(module)
                    if name[:1].isupper() and isinstance(getattr(module, name), type)
                }
            )
            hint = did_you_mean(value, known)
            path = ("train", *key) if isinstance(key, tuple) else ("train", key)
            raise fail(
                locations,
                path,
                f"{dotted(path)}: {value!r} is not a keras.{module.__name__.split('.')[-1]} name.{hint}",
            ) from None


RECIPE_WORDS = ("default", "auto")
"""What `recipes:` may be instead of a list: tfopt's default recipes, or auto mode (measured choices)."""


def resolve_recipes(raw: Any, locations: Locations) -> tuple[Any, ...] | str:
    """The recipe items constructed in file order (or "default"/"auto"), checked as one chain."""
    from tfopt.recipes.base import chain

    path = ("recipes",)
    if raw in RECIPE_WORDS:
        return raw
    raw = [] if raw is None else raw
    if not isinstance(raw, list):
        raise fail(
            locations,
            path,
            f"recipes: received {show(raw)}; expected a list of recipe items "
            "(`- mixed_precision: {policy: auto}` or `- xla`), or the word default "
            "(tfopt's default recipes) or auto (measure candidates, keep what helps)",
        )
    recipes, item_paths = [], {}
    for index, item in enumerate(raw):
        recipe = resolve_recipe_item(item, (*path, index), locations)
        recipes.append(recipe)
        item_paths[recipe.name] = (*path, index)
    try:
        chain(*recipes)
    except RecipeClashError as error:
        raise fail(locations, max(item_paths[name] for name in error.recipes), str(error)) from None
    return tuple(recipes)


def resolve_recipe_item(item: Any, item_path: tuple, locations: Locations) -> Any:
    """Constructs one recipe item, `name` or `{name: {settings}}`, by `registry.from_item` (the one reading
    of the item grammar), pointing at the line of the key the error names."""
    from tfopt import registry

    try:
        recipe = registry.from_item(item)
        recipe.check_for_source()  # a recipe file's data is a tfopt.data source
        return recipe
    except registry.RecipeItemError as error:
        path = (*item_path, *error.key_path)
        raise fail(locations, path, f"{dotted(path)}: {error}") from None
    except (TfoptError, ValueError, TypeError) as error:
        # A constructor rejected a value: point at the setting the error names.
        name, settings = next(iter(item.items())) if isinstance(item, dict) else (item, {})
        message = str(error) if str(error).startswith(str(name)) else f"{name}: {error}"
        raise fail(locations, _setting_path((*item_path, name), settings or {}, error), message) from None
