"""The recipe's model, built from its data: arguments the data decides, then the honest baseline compile.

The model's `input_shape`, `classes`, `sequence_length` and `vocab_size` follow the data unless the
recipe wrote them, and a model its function returns uncompiled is compiled with the `train:` section's
settings; one it compiled keeps its own.
A model function's own errors are reported at the `model:` line of the recipe file.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

from tfopt.errors import DataError, RecipeFileError, TfoptError

if TYPE_CHECKING:
    import keras

    from tfopt.data.source import DataSource
    from tfopt.recipe_file.loader import RecipeFile


def prepare(recipe: RecipeFile) -> Any:
    """Fills in the model arguments that the data decides: `input_shape`, `classes`, `sequence_length`
    and `vocab_size`, for models that take them.

    They are taken from the data only where the recipe did not write them, so `--set
    data.image_size=[32,32]` needs no matching `model.input_shape`, and the saved resolved recipe holds
    the values actually used.

    Raises:
        DataError: The data source yields no batch or not `(inputs, targets)` pairs.
    """
    source = recipe.data.source_object
    try:
        dataset = source.pipeline(batch_size=recipe.data.batch_size, optimized=False, shuffle=False)
    except TfoptError as error:
        error.args = (f"{' '.join(str(error).split())} ({recipe.where('data')}).",)
        raise
    spec = dataset.element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise DataError(
            f"Data source {recipe.data.source} yields {spec}, expected (inputs, targets) pairs "
            f"({recipe.where('data', 'source')})."
        )
    accepted = set(inspect.signature(recipe.model.builder).parameters) | set(recipe.model.kwargs)
    derived = _from_data(source, spec[0])
    kwargs = {
        **recipe.model.kwargs,
        **{key: value for key, value in derived.items() if key in accepted and key not in recipe.model.given},
    }
    return dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, kwargs=kwargs))


def create_model(recipe: RecipeFile) -> keras.Model:
    """Creates the recipe's model as its function returns it (`compile_as_recipe` compiles it where it is not):
    what the `model_fn` a run gives `tfopt.apply` builds, once per configuration (the baseline, the optimized
    setup) inside the right scopes.

    Raises:
        RecipeFileError: The model rejected its arguments (a ValueError or TypeError), pointing at the
            `model:` line.
        TfoptError: The model function raised anything else, or did not return a keras.Model.
    """
    import keras

    where = recipe.where("model", "name")
    # A shape comes from YAML (or the data) as a list; Keras compares shapes with tuples (keras.applications'
    # `input_shape == (224, 224, 3)` refused [224, 224, 3] with imagenet weights).
    kwargs = {
        key: tuple(value) if key == "input_shape" and isinstance(value, list) else value
        for key, value in recipe.model.kwargs.items()
    }
    try:
        model = recipe.model.builder(**kwargs)
    except TfoptError:
        raise
    except (ValueError, TypeError) as error:
        raise RecipeFileError(
            f"model {recipe.model.name} rejected its arguments: {type(error).__name__}: {_one_line(error)} ({where})."
        ) from error
    except Exception as error:
        raise TfoptError(
            f"Building model {recipe.model.name} raised {type(error).__name__}: {_one_line(error)} ({where})."
        ) from error
    if not isinstance(model, keras.Model):
        raise TfoptError(
            f"model {recipe.model.name} returned a {type(model).__name__}, expected a keras.Model ({where})."
        )
    return model


def compile_as_recipe(model: keras.Model, recipe: RecipeFile) -> str | None:
    """Compiles a model its function returned uncompiled with the `train:` section's optimizer (and learning
    rate), loss and metrics, leaving `jit_compile` to Keras' "auto", which tfopt reads as no choice of the
    user's: XLA is the xla recipe's to decide, and the baseline runs without it. A model its function compiled
    keeps its own compile, as `tfopt.apply` keeps a user's: its optimizer, loss, metrics and a `compile` of its
    own (a GAN's, a distiller's) are how the user trains it.

    Returns:
        None, or for a model that came compiled, what to tell the user: which of the `train:` section's
        settings are not used, and where the recipe wrote them.
    """
    if not model.compiled:
        model.compile(**compile_arguments(recipe))
        return None
    written = [f"train.{key} ({recipe.where('train', key)})" for key in _COMPILE_KEYS if recipe.wrote("train", key)]
    return f"model {recipe.model.name} comes compiled by its function, and trains with that compile" + (
        f"; not used: {', '.join(written)}" if written else ""
    )


_COMPILE_KEYS = ("optimizer", "learning_rate", "loss", "metrics")


def compile_arguments(recipe: RecipeFile) -> dict[str, Any]:
    """The `compile()` arguments of the `train:` section: optimizer (with its learning rate), loss, metrics."""
    import keras

    optimizer = type(keras.optimizers.get(recipe.train.optimizer))(learning_rate=recipe.train.learning_rate)
    return {"optimizer": optimizer, "loss": recipe.train.loss, "metrics": list(recipe.train.metrics)}


def _from_data(source: DataSource, inputs_spec: Any) -> dict[str, Any]:
    """The model arguments the data implies: its input shape, class count, sequence length and vocabulary."""
    derived: dict[str, Any] = {}
    shape = getattr(inputs_spec, "shape", None)
    if shape is not None:
        derived["input_shape"] = [None if size is None else int(size) for size in shape[1:]]
        if len(shape) == 2 and shape[1] is not None:
            derived["sequence_length"] = int(shape[1])
    for attribute in ("num_classes", "classes", "class_names"):
        value = getattr(source, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            derived["classes"] = value
            break
        if isinstance(value, (list, tuple)) and value:
            derived["classes"] = len(value)
            break
    vocab_size = getattr(source, "vocab_size", None)
    if isinstance(vocab_size, int) and not isinstance(vocab_size, bool):
        derived["vocab_size"] = vocab_size
    return derived


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
