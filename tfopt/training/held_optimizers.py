"""The optimizers a model holds besides the one `compile` made: those a `train_step` of its own applies.

A GAN's `train_step` applies its own optimizers, wherever its `compile` put them: as attributes
(`self.d_optimizer`, keras.io's), in a dict or list attribute (`self.optimizers = {"d": ..., "g": ...}`), or
compiled into its sub-models (`self.discriminator.compile(d_optimizer)`, an older pattern). They are training
state as the weights are: what measuring trains must be put back (`tfopt.profiling.timing`), and a recipe that
sets up the compiled optimizer (grad_accum's accumulation, a scaled learning rate) does nothing to them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras


@dataclasses.dataclass(frozen=True)
class HeldOptimizer:
    """One optimizer the model holds, where it holds it.

    Attributes:
        path: Where it is found from the model ("d_optimizer", "optimizers['d']", "discriminator.optimizer").
        optimizer: The optimizer.
        put: Puts another optimizer in its place (None where it sits in a tuple, which cannot take one).
    """

    path: str
    optimizer: Any
    put: Callable[[Any], None] | None


def held_optimizers(model: keras.Model) -> list[HeldOptimizer]:
    """Every optimizer the model holds besides its compiled one, each once: its attributes, the items of its dict,
    list and tuple attributes, and the compiled optimizers of the sub-models it holds as attributes.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> model.optimizers = {"g": keras.optimizers.Adam()}
        >>> [held.path for held in held_optimizers(model)]
        ["optimizers['g']"]
    """
    import keras

    found: list[HeldOptimizer] = []
    seen = {id(model.optimizer)}

    def add(path: str, value: Any, put: Callable[[Any], None] | None) -> None:
        if isinstance(value, keras.optimizers.Optimizer) and id(value) not in seen:
            seen.add(id(value))
            found.append(HeldOptimizer(path, value, put))

    for name, value in sorted(vars(model).items()):
        if name.startswith("_") and isinstance(value, (dict, list, tuple)):
            continue  # Keras' own bookkeeping (`_self_unconditional_dependency_names`, `_layers`)
        if isinstance(value, dict):
            for key, item in value.items():
                add(f"{name}[{key!r}]", item, lambda new, held=value, key=key: held.__setitem__(key, new))
        elif isinstance(value, (list, tuple)):
            for index, item in enumerate(value):
                put = (
                    (lambda new, held=value, index=index: held.__setitem__(index, new))
                    if isinstance(value, list)
                    else None
                )
                add(f"{name}[{index}]", item, put)
        elif isinstance(value, keras.Model):
            put = lambda new, held=value: setattr(held, "optimizer", new)  # noqa: E731
            add(f"{name}.optimizer", getattr(value, "optimizer", None), put)
        else:
            add(name, value, lambda new, name=name: setattr(model, name, new))
    return found


def applied_by_its_own_train_step(model: keras.Model) -> list[str]:
    """The paths of the optimizers a train_step of the model's own may apply instead of the compiled one; none
    where the model trains with Keras' own train_step, which applies the compiled one only."""
    import keras

    if type(model).train_step is keras.Model.train_step:
        return []
    return [held.path for held in held_optimizers(model)]
