"""Why the user's data does not fit the user's model, in words, when the first batch fails.

Keras reports these as the layer that met them: an unbatched dataset as "Invalid input shape for input
[0.80 0.53 ...]" (the first example's values), a feature of the wrong width as the first Dense layer's
axis, labels beyond the classes as a sparse cross-entropy range. The user has to read them as "batch the
dataset", "the data has 5 features and the model takes 8", "label 6 among 3 classes": said here, with
both shapes and the offending value, and tied to the setting that fixes them (`setting`: "batch_size",
"input_shape" or "classes", which a recipe file points at its own line).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tfopt.errors import DataError

if TYPE_CHECKING:
    import keras


def explain(model: keras.Model, batch: Any) -> DataError | None:
    """The mismatch between `batch` (the dataset's first element) and `model`, or None where none is found.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        >>> str(explain(model, (np.zeros(8, "float32"), np.int64(1))))[:62]
        'The dataset is not batched: its inputs have shape (8,) per ele'
    """
    import keras

    if isinstance(batch, Mapping):
        return _dict_elements(list(batch)) if _inputs_named_otherwise(model, batch) else None
    inputs, targets, _ = keras.utils.unpack_x_y_sample_weight(batch)
    return _input_mismatch(model, inputs) or _label_mismatch(model, targets)


_LABEL_KEYS = ("y", "label", "labels", "target", "targets")


def _inputs_named_otherwise(model: keras.Model, batch: Mapping[Any, Any]) -> bool:
    """Whether the model declares inputs and the dict's keys are not all among their names (a model of
    dict inputs, or one whose own loss reads its labels from the dict, takes such elements as they are)."""
    try:
        names = {tensor.name for tensor in model.inputs}
    except (AttributeError, ValueError, TypeError):  # a subclassed model declares no inputs
        return False
    return not set(map(str, batch)) <= names


def _dict_elements(keys: list[Any]) -> DataError:
    """Elements that are dicts: Keras takes one as the model's inputs alone, so the step failed on it."""
    label = next((key for key in keys if str(key).lower() in _LABEL_KEYS), keys[-1])
    features = [key for key in keys if key != label]
    if len(features) == 1:
        inputs = f"d[{features[0]!r}]"
    else:
        inputs = "{" + ", ".join(f"{key!r}: d[{key!r}]" for key in features) + "}"
    return DataError(
        f"The dataset's elements are dicts (keys {keys}), and Keras' fit reads a dict element as the model's "
        f"inputs alone, with no labels. Make each element (inputs, labels): "
        f"dataset.map(lambda d: ({inputs}, d[{label!r}]))."
    )


def _input_mismatch(model: keras.Model, inputs: Any) -> DataError | None:
    import tensorflow as tf

    try:
        expected = [tuple(tensor.shape) for tensor in model.inputs]
    except (AttributeError, ValueError):  # a subclassed model declares no inputs
        return None
    given = [tuple(tf.convert_to_tensor(tensor).shape) for tensor in tf.nest.flatten(inputs)]
    if len(given) != len(expected):
        return DataError(
            f"The dataset's inputs are {len(given)} tensor(s) of shapes {given}, and the model takes "
            f"{len(expected)} input(s) of shapes {expected}. Make each element (inputs, labels) with "
            "the inputs the model was built for."
        )
    for index, (data_shape, model_shape) in enumerate(zip(given, expected)):
        name = f" {model.inputs[index].name!r}" if len(expected) > 1 else ""
        if len(data_shape) == len(model_shape) - 1 and _fits(data_shape, model_shape[1:]):
            return DataError(
                f"The dataset is not batched: its inputs have shape {data_shape} per element, and the "
                f"model's input{name} takes batches of shape {model_shape}. Add .batch(BATCH_SIZE) to "
                "the pipeline (keras' fit batches arrays, not a tf.data.Dataset).",
                setting="batch_size",
            )
        if not _fits(data_shape, model_shape):
            return DataError(
                f"The dataset's inputs have shape {data_shape} per batch, and the model's input{name} "
                f"takes {model_shape} (None: any size). Build the model for the data's shape, or "
                "reshape the data.",
                setting="input_shape",
            )
    return None


def _label_mismatch(model: keras.Model, targets: Any) -> DataError | None:
    import numpy as np
    import tensorflow as tf

    loss = getattr(model, "loss", None)
    name = loss if isinstance(loss, str) else getattr(loss, "name", None) or getattr(loss, "__name__", "")
    if "sparse_categorical" not in str(name) or targets is None or len(tf.nest.flatten(targets)) != 1:
        return None
    try:
        classes = int(model.outputs[0].shape[-1])
    except (AttributeError, ValueError, TypeError, IndexError):
        return None
    labels = np.asarray(tf.nest.flatten(targets)[0])
    if not np.issubdtype(labels.dtype, np.number) or labels.size == 0:
        return None
    outside = labels[(labels < 0) | (labels >= classes)]
    if outside.size == 0:
        return None
    return DataError(
        f"The labels of the first batch hold {outside.flat[0].item()!r}, outside the model's {classes} "
        f"classes (0 to {classes - 1}): {outside.size} of {labels.size} labels are. Give the model as "
        "many outputs as the data has classes, or map the labels to 0..classes-1.",
        setting="classes",
    )


def _fits(data_shape: tuple, model_shape: tuple) -> bool:
    return len(data_shape) == len(model_shape) and all(
        expected is None or given is None or given == expected for given, expected in zip(data_shape, model_shape)
    )
