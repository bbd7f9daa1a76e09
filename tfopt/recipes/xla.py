"""XLA compilation of the train step, set explicitly because Keras' default decides silently.

Keras' `jit_compile="auto"` turns XLA off on CPU-only machines, under any tf.distribute strategy, and
when one layer has `supports_jit = False`, in each case without saying so. This recipe sets
`jit_compile` explicitly, checks that every layer can be compiled (the layer flag, then an actual XLA
lowering of the forward pass), and falls back with the offending layer named. On CPU-only hardware
"auto" leaves XLA off: measured on CPU: AMD EPYC, 2 cores with bf16 instructions (no GPU or TPU), XLA
made a small CNN 0.47x to 1.08x as fast (docs/recipes/xla.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from tfopt.data.batches import describe_dropped, rebatch_counted
from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.policies import dtype_policy_scope
from tfopt.recipes.base import Recipe, Stage


def xla_blockers(model: Any, sample_inputs: Any) -> list[str]:
    """Why `model` cannot be compiled with XLA, one entry per problem; empty where it can.

    Checks each layer's `supports_jit` flag (which Keras silently obeys), then lowers the forward pass
    to XLA HLO, which fails on ops without an XLA kernel (string ops, py_function, some lookups).

    Args:
        model: A built Keras model.
        sample_inputs: One batch of its inputs.

    Returns:
        Human-readable reasons, e.g. ["layer 'text_vectorization' (TextVectorization) does not support XLA"].

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> xla_blockers(model, np.zeros((2, 3), "float32"))
        []
    """
    import tensorflow as tf

    blockers = [f"layer {layer.name!r} ({type(layer).__name__}) does not support XLA"
                for layer in model._flatten_layers(include_self=False) if not getattr(layer, "supports_jit", True)]
    if blockers:
        return blockers
    forward = tf.function(lambda inputs: model(inputs, training=True), jit_compile=True)
    try:
        forward.experimental_get_compiler_ir(sample_inputs)(stage="hlo")
    except Exception as error:  # XLA reports unsupported ops as several different error types
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return [f"XLA could not compile the forward pass: {first_line}"]
    return []


def static_batches(dataset: Any, batch_size: int) -> tuple[Any, int | None]:
    """Functional form: the dataset with every batch full, and how many examples per pass that drops.

    XLA compiles a step per input shape, and Keras traces the step with the batch dimension unknown, so
    a partial last batch compiles it again every epoch (20 s and more for ResNet-50 on an H100, where the
    other 18 steps of an epoch took 0.3 s). Rebatching with `drop_remainder=True` makes the batch
    dimension static.

    Args:
        dataset: A batched dataset.
        batch_size: Its batch size.

    Returns:
        The dataset with static batches, and the examples dropped per pass over the data (0 where the
        batches were full already, None where tf.data does not know how many examples a pass holds).

    Example:
        >>> import tensorflow as tf
        >>> data, dropped = static_batches(tf.data.Dataset.range(20).batch(8), 8)
        >>> [len(batch) for batch in data], dropped, len(data), data.element_spec.shape
        ([8, 8], 4, 2, TensorShape([8]))
    """
    import tensorflow as tf

    if tf.nest.flatten(dataset.element_spec)[0].shape[0] is not None:
        return dataset, 0
    return rebatch_counted(dataset, batch_size, drop_remainder=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Xla(Recipe):
    """Compiles the train step with XLA where every layer supports it and the hardware benefits.

    Args:
        jit_compile: "auto" (on for GPU/TPU when every layer supports XLA, off on CPU), True (on
            wherever every layer supports XLA, else off with the layer named) or False (off).

    Example:
        >>> Xla(jit_compile=True).get_config()
        {'jit_compile': True}
    """

    name: ClassVar[str] = "xla"
    stage: ClassVar[Stage] = Stage.COMPILE

    jit_compile: bool | str = "auto"

    def __post_init__(self) -> None:
        if not (self.jit_compile == "auto" or isinstance(self.jit_compile, bool)):
            raise RecipeConfigError(f"xla: jit_compile={self.jit_compile!r} is not valid. Expected 'auto', "
                                    "true or false.")

    def __call__(self, plan: Plan) -> Plan:
        if self.jit_compile is False:
            return plan.with_compile(jit_compile=False).record(self.name, "jit_compile=False requested",
                                                               skipped=True)
        if self.jit_compile == "auto" and plan.hardware.accelerator == "cpu":
            # No speed figure here: one measured on another machine would read as a fact about this one.
            return plan.with_compile(jit_compile=False).record(
                self.name, f"no GPU or TPU ({plan.hardware.describe()}): XLA stays off on CPUs, where it often "
                "made training slower; set jit_compile: true to force it, or recipes='auto' to time it here",
                skipped=True)
        blockers = self._blockers(plan)
        if blockers:
            return plan.with_compile(jit_compile=False).record(
                self.name, "; ".join(blockers), skipped=True)
        dataset, dropped = static_batches(plan.dataset, plan.batch_size)
        return plan.with_compile(jit_compile=True).replace(dataset=dataset).record(
            self.name, "on: every layer lowers to XLA; jit_compile=True set explicitly, since Keras' 'auto' "
            f"turns it off under distribution strategies and on CPU; {describe_dropped(dropped, plan.batch_size)}")

    @staticmethod
    def _blockers(plan: Plan) -> list[str]:

        with dtype_policy_scope(plan.dtype_policy):
            model = plan.model_fn()
        if not model.built:
            model(plan.sample_inputs)
        return xla_blockers(model, plan.sample_inputs)
