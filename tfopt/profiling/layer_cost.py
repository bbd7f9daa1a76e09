"""FLOPs and memory traffic of each Keras layer in one training step, from its weights and shapes.

The arithmetic intensity behind a roofline needs both per layer, and no trace has them for cuDNN and
cuBLAS kernels (xprof counts a cuDNN convolution as 0 FLOPs). They follow from the shapes:

- a layer with a kernel (Dense, EinsumDense, Conv*, DepthwiseConv*): each output element takes
  `kernel size / output channels` multiply-adds, 2 FLOPs each;
- a recurrent layer (LSTM, GRU, SimpleRNN): per sample and time step, its kernel and recurrent kernel
  are each applied once;
- every other layer (activations, normalisation, pooling, elementwise code) is counted as one FLOP per
  input element: an order of magnitude, which is all a layer that mostly moves memory needs.

Memory traffic counts the inputs and outputs (in the layer's compute dtype) and the weights (in their
variable dtype) once. A training step is counted as three times the forward pass (the backward pass
computes gradients for inputs and weights, each about as costly), both for FLOPs and bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras

_TRAIN_STEP_FACTOR = 3.0
_RECURRENT = ("LSTM", "GRU", "SimpleRNN")


def layer_costs(model: keras.Model, batch_size: int) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """Per top-level layer of `model`: (FLOPs, bytes) per training step at `batch_size`.

    Returns:
        The costs by layer name, and the names of layers whose shapes are unknown (layers of a subclassed
        model, which Keras only knows inside a call; dimensions other than the batch left open).
    """
    costs, unknown = {}, []
    for layer in getattr(model, "layers", []):
        if type(layer).__name__ == "InputLayer":
            continue
        try:
            inputs = _elements(layer.input, batch_size)
            outputs = _elements(layer.output, batch_size)
        except (AttributeError, ValueError, TypeError):
            unknown.append(layer.name)
            continue
        weights = sum(math.prod(weight.shape) * _itemsize(weight.dtype) for weight in layer.weights)
        activation_bytes = (inputs + outputs) * _itemsize(getattr(layer, "compute_dtype", "float32"))
        costs[layer.name] = (
            _TRAIN_STEP_FACTOR * _forward_flops(layer, inputs, outputs, batch_size),
            _TRAIN_STEP_FACTOR * (activation_bytes + weights),
        )
    return costs, unknown


def _forward_flops(layer: keras.Layer, inputs: int, outputs: int, batch_size: int) -> float:
    kind = type(layer).__name__
    if kind in _RECURRENT or any(base.__name__ in _RECURRENT for base in type(layer).__mro__):
        cell = getattr(layer, "cell", layer)
        steps = layer.input.shape[1] or 1
        per_step = sum(
            math.prod(weight.shape)
            for weight in (getattr(cell, "kernel", None), getattr(cell, "recurrent_kernel", None))
            if weight is not None
        )
        return 2.0 * batch_size * steps * per_step
    kernel = getattr(layer, "kernel", None)
    channels = layer.output.shape[-1] if layer.output.shape else None
    if kernel is not None and channels:
        return 2.0 * outputs * math.prod(kernel.shape) / channels
    return float(inputs)


def _elements(tensors: Any, batch_size: int) -> int:
    """Elements of a (nest of) symbolic tensors with the batch dimension set; ValueError where another
    dimension is open."""
    import keras

    total = 0
    for tensor in keras.tree.flatten(tensors):
        shape = list(tensor.shape)
        if shape and shape[0] is None:
            shape[0] = batch_size
        if any(dimension is None for dimension in shape):
            raise ValueError(f"open dimension in {shape}")
        total += math.prod(shape)
    return total


def _itemsize(dtype: Any) -> int:
    import numpy as np

    name = getattr(dtype, "name", dtype)
    return 2 if str(name) == "bfloat16" else np.dtype(str(name)).itemsize
