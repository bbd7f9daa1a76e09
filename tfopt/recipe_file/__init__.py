"""Strict YAML recipe files: every mistake names the file, the line, the key path and the fix.

A recipe file is data, never code. `reader` reads it with YAML's safe loader and keeps the line of every
key; `schema` checks the fixed sections strictly; `resolve` checks the model, data and recipe items by
constructing them, so a typo never silently falls back to a default; `loader` ties them together and
saves the resolved recipe, every default filled in, beside each run's outputs so it can be repeated.

Example:
    >>> recipe = load_recipe("recipes/small_cnn.yaml", overrides=["train.epochs=1"])
    >>> recipe.train.epochs
    1
"""

from tfopt.recipe_file.loader import (
    RecipeDocument,
    RecipeFile,
    load_recipe,
    parse_override,
    read_recipe,
    recipe_item_settings,
    runtime_settings,
    save_resolved,
)

__all__ = [
    "RecipeDocument",
    "RecipeFile",
    "load_recipe",
    "parse_override",
    "read_recipe",
    "recipe_item_settings",
    "runtime_settings",
    "save_resolved",
]
