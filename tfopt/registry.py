"""Recipe names to recipe classes: how YAML items `{name: {kwargs}}` and strings become recipes.

A plain dict filled by the `register` decorator when `tfopt.recipes` is imported; composition does not
go through it (that is `chain`).
"""

from __future__ import annotations

import difflib
from typing import Any

from tfopt.errors import RecipeConfigError

_RECIPES: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: makes a recipe class available by its `name`."""
    if cls.name in _RECIPES and _RECIPES[cls.name] is not cls:
        raise RecipeConfigError(f"Two recipe classes are named {cls.name!r}: {_RECIPES[cls.name]} and {cls}.")
    _RECIPES[cls.name] = cls
    return cls


def names() -> list[str]:
    """The registered recipe names, sorted."""
    _load_builtin_recipes()
    return sorted(_RECIPES)


def get(name: str) -> type:
    """The recipe class registered as `name`.

    Raises:
        RecipeConfigError: No recipe has that name; the message lists the known ones and the closest.
    """
    _load_builtin_recipes()
    if name not in _RECIPES:
        close = difflib.get_close_matches(str(name), _RECIPES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise RecipeConfigError(
            f"Unknown recipe {name!r}.{hint} Known recipes: {', '.join(sorted(_RECIPES))}.")
    return _RECIPES[name]


def from_item(item: Any) -> Any:
    """Makes a recipe from a YAML-style item: a name, or a one-key mapping `{name: {kwargs}}`.

    Raises:
        RecipeConfigError: The item is not of that form, the name is unknown, or the kwargs are wrong.
    """
    if isinstance(item, str):
        return get(item)()
    if isinstance(item, dict) and len(item) == 1:
        ((name, kwargs),) = item.items()
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(kwargs, dict):
            raise RecipeConfigError(
                f"{name}: expected a mapping of settings, received {kwargs!r}. Write it as "
                f"`- {name}: {{setting: value}}` or just `- {name}`.")
        cls = get(name)
        try:
            return cls(**kwargs)
        except TypeError as error:
            raise RecipeConfigError(_unknown_setting_message(cls, kwargs, error)) from None
    raise RecipeConfigError(
        f"A recipe item must be a name or a one-key mapping {{name: {{settings}}}}; received {item!r}.")


def _unknown_setting_message(cls: type, kwargs: dict[str, Any], error: TypeError) -> str:
    import dataclasses

    valid = [field.name for field in dataclasses.fields(cls)]
    unknown = [key for key in kwargs if key not in valid]
    if not unknown:
        return f"{cls.name}: {error}"
    close = difflib.get_close_matches(unknown[0], valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (f"{cls.name}: unknown setting {unknown[0]!r}.{hint} Valid settings: "
            f"{', '.join(valid) or '(none)'}.")


def _load_builtin_recipes() -> None:
    import tfopt.recipes  # noqa: F401 - importing registers the built-in recipes
