"""Recipe names to recipe classes: how YAML items `{name: {kwargs}}` and strings become recipes.

A fixed table of names to `module:Class`, imported on first use. Recipes do not register themselves as a
side effect of being imported, and nothing here imports a recipe module until a name is asked for, so the
registry depends on no recipe and `tfopt.recipes.base` may use it (a chain's config names its parts).
Composition does not go through it: that is `chain`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from tfopt.errors import RecipeConfigError
from tfopt.suggest import did_you_mean

_RECIPES = {
    "batch_size": "tfopt.recipes.batch_size:BatchSize",
    "data_pipeline": "tfopt.recipes.data_pipeline:DataPipeline",
    "data_service": "tfopt.recipes.data_service:DataService",
    "distribution": "tfopt.recipes.distribution:Distribution",
    "fused_layers": "tfopt.recipes.fused_layers:FusedLayers",
    "grad_accum": "tfopt.recipes.grad_accum:GradAccum",
    "mixed_precision": "tfopt.recipes.mixed_precision:MixedPrecision",
    "steps_per_execution": "tfopt.recipes.steps_per_execution:StepsPerExecution",
    "xla": "tfopt.recipes.xla:Xla",
}

# Names that were recipes and are settings of the process now (`tfopt.runtime`): what to write instead.
_PROCESS_SETTINGS = {
    "gpu_memory": "gpu_memory is a setting of the process, not a recipe: TensorFlow fixes it before any plan "
    "exists. In a recipe file write `runtime: {gpu_memory_growth: true}` (or gpu_memory_limit_bytes: "
    "N); in Python call tfopt.runtime.configure_gpu_memory(growth=True) at the top of the script.",
}


class RecipeItemError(RecipeConfigError):
    """A recipe item is malformed; `key_path` is where, inside the item (`()` is the item itself).

    A recipe file turns the key path into the line to point at, without reading it back from the message.
    """

    def __init__(self, message: str, key_path: tuple = ()):
        super().__init__(message)
        self.key_path = key_path


def names() -> list[str]:
    """The registered recipe names, sorted."""
    return sorted(_RECIPES)


def get(name: str) -> type:
    """The recipe class registered as `name`.

    Raises:
        RecipeConfigError: No recipe has that name; the message lists the known ones and the closest.

    Example:
        >>> get("xla").__name__
        'Xla'
    """
    if name in _PROCESS_SETTINGS:
        raise RecipeConfigError(_PROCESS_SETTINGS[name])
    if name not in _RECIPES:
        raise RecipeConfigError(
            f"Unknown recipe {name!r}.{did_you_mean(str(name), _RECIPES)} Known recipes: {', '.join(names())}."
        )
    module, _, cls = _RECIPES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def settings_of(cls: type) -> list[str]:
    """The setting names a recipe class takes: its dataclass fields (the constructor is the schema)."""
    return [field.name for field in dataclasses.fields(cls)]


def from_item(item: Any) -> Any:
    """Makes a recipe from a YAML-style item: a name, or a one-key mapping `{name: {settings}}`.

    The one reading of the item grammar: recipe files call it too, and point at the line of the error's
    `key_path`.

    Raises:
        RecipeItemError: The item is not of that form, the name is unknown, or a setting is unknown.
        RecipeConfigError: The recipe's constructor rejected a setting's value.

    Example:
        >>> from_item({"xla": {"jit_compile": True}}) == get("xla")(jit_compile=True)
        True
    """
    if isinstance(item, str):
        name, settings, settings_path = item, {}, ()
    elif isinstance(item, dict) and len(item) == 1:
        ((name, settings),) = item.items()
        settings, settings_path = ({} if settings is None else settings), (name,)
    else:
        raise RecipeItemError(
            f"received {item!r}; expected a recipe name or a one-key mapping "
            "{name: {settings}}, e.g. `- xla` or `- mixed_precision: {policy: auto}`"
        )
    try:
        cls = get(name)
    except RecipeConfigError as error:
        raise RecipeItemError(str(error)) from None
    if not isinstance(settings, dict):
        raise RecipeItemError(
            f"{name}: received {settings!r}; expected a mapping of settings, e.g. "
            f"`- {name}: {{setting: value}}` or just `- {name}`",
            settings_path,
        )
    valid = settings_of(cls)
    for key in settings:
        if key not in valid:
            raise RecipeItemError(
                f"{name}: unknown setting {key!r} (received {key}: {settings[key]!r})."
                f"{did_you_mean(str(key), valid)} Valid "
                f"settings: {', '.join(valid) or '(none)'}.",
                (*settings_path, key),
            )
    return cls(**settings)
