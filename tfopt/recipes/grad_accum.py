"""Gradient accumulation: train with an effective batch larger than fits in memory.

Keras 3 optimizers take `gradient_accumulation_steps=N`: the first N-1 steps only add their gradients
to accumulators, and step N applies `(sum of the N gradients) / N` (Keras averages) and resets them.
With the default mean loss reduction ("sum_over_batch_size") each micro-batch gradient is a mean over
its b examples, so their average is the mean over N*b examples: the same update as one batch N times
larger, up to float rounding (checked for SGD and Adam on dense layers in the tests). `optimizer.iterations`
counts updates, not micro-batches, so Adam's bias correction sees the step numbers the large batch would.

Where the update is *not* the large batch's: a loss with reduction="sum" gives 1/N of the large batch's
gradient (Keras still divides by N); a learning-rate schedule is called with the micro-batches counted
(Keras 3 passes it the optimizer's `_iterations`); an optimizer's moving average of the weights (`use_ema`)
moves at every micro-batch; Keras' optimizers but SGD apply an `Embedding`'s sparse gradient a slice per
id looked up, squaring each into the moments before an id's slices add up (clipping measures them one by one
too), an accumulated one summed; and weights breaking their own constraint are constrained after the first
micro-batch. This recipe rejects them all (and a loss without reduction, summed like "sum"), and a train_step
of the model's own that applies optimizers of its own (a GAN's), which would leave the compiled one, which
accumulates, unused. BatchNormalization computes its statistics per
micro-batch, and the micro-batches must all have b examples (a short last batch weighs as much as a full one).
Under MirroredStrategy and MultiWorkerMirroredStrategy Keras 3.15 cannot accumulate at all
(`tfopt.recipes.distribution.ACCUMULATION_FAILS`): the recipe is refused beside them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from tfopt.errors import RecipeClashError, RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage
from tfopt.recipes.distribution import ACCUMULATION_FAILS, ACCUMULATION_FAILS_UNDER
from tfopt.recipes.learning_rate import check_rule, scale_learning_rate
from tfopt.training.micro_batches import accumulated, accumulated_already

if TYPE_CHECKING:
    import keras


@dataclasses.dataclass(frozen=True, kw_only=True)
class GradAccum(Recipe):
    """Accumulates gradients over several micro-batches before each optimizer update.

    Args:
        steps: Micro-batches per update (at least 2). Ignored when `effective_batch_size` is set.
        effective_batch_size: The batch each update should stand for; must be a multiple of the plan's
            batch size, and `steps` becomes their ratio.
        scale_learning_rate: "none", "linear" or "sqrt": scale the learning rate with the effective batch
            over the plan's batch (the plan's learning rate is taken as tuned for the plan's batch).

    Example:
        >>> GradAccum(steps=4).get_config()
        {'steps': 4, 'effective_batch_size': None, 'scale_learning_rate': 'none'}
    """

    name: ClassVar[str] = "grad_accum"
    stage: ClassVar[Stage] = Stage.UPDATE  # from the final batch: after batch_size and distribution

    steps: int = 2
    effective_batch_size: int | None = None
    scale_learning_rate: str = "none"

    def __post_init__(self) -> None:
        if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 2:
            raise RecipeConfigError(
                f"grad_accum: steps={self.steps!r} is not a number of micro-batches. Expected "
                "an integer >= 2 (1 would be no accumulation).",
                setting="steps",
            )
        if self.effective_batch_size is not None and (
            not isinstance(self.effective_batch_size, int) or self.effective_batch_size < 2
        ):
            raise RecipeConfigError(
                f"grad_accum: effective_batch_size={self.effective_batch_size!r}. Expected "
                "an integer >= 2, or None to use steps.",
                setting="effective_batch_size",
            )
        check_rule(self.name, self.scale_learning_rate)

    def accumulation_steps(self, plan: Plan) -> int:
        """How many of the plan's updates each update of the recipe's takes in.

        Raises:
            RecipeConfigError: `effective_batch_size` is not a multiple (>= 2x) of the batch an update of the
                plan stands for.
        """
        if self.effective_batch_size is None:
            return self.steps
        own = accumulated_already(plan, who=self.name) // plan.micro_batches  # the user's optimizer's own
        batch_size = plan.whole_batch_size * own
        steps, remainder = divmod(self.effective_batch_size, batch_size)
        if remainder or steps < 2:
            mine = f" ({plan.whole_batch_size} accumulated {own} at a time by your optimizer)" if own > 1 else ""
            raise RecipeConfigError(
                f"grad_accum: effective_batch_size={self.effective_batch_size} is not a multiple (at least 2x) "
                f"of the batch size {batch_size}{mine}. Use a multiple such as {max(2, round(steps)) * batch_size}, "
                "or set steps= instead.",
                setting="effective_batch_size",
            )
        return steps

    def check(self, plan: Plan) -> None:
        self.check_before_trials(plan)
        self.accumulation_steps(plan)

    def check_before_trials(self, plan: Plan) -> None:
        if plan.strategy in ACCUMULATION_FAILS_UNDER and any(step.recipe == "distribution" for step in plan.applied):
            raise RecipeClashError(
                f"distribution ({plan.strategy}) and grad_accum cannot be combined: {ACCUMULATION_FAILS}.",
                recipes=("distribution", self.name),
            )
        if plan.strategy in ACCUMULATION_FAILS_UNDER:
            raise RecipeConfigError(
                f"grad_accum: your model was made under a {plan.strategy} strategy, which tfopt keeps, and "
                f"{ACCUMULATION_FAILS}.",
                setting="steps",
            )
        accumulated(plan, self.steps, who=self.name)

    def __call__(self, plan: Plan) -> Plan:
        # A plan already in micro-batches (its batch did not fit: tfopt.training.micro_batches) accumulates
        # these steps of its whole batches.
        steps = self.accumulation_steps(plan)
        before = accumulated_already(plan, who=self.name)  # the user's own accumulation, and a batch that did not fit
        compile_config = accumulated(plan, steps, who=self.name)
        pieces = steps * before
        effective = pieces * plan.batch_size
        detail = (
            f"accumulates {pieces} micro-batches of {plan.batch_size}: each update stands for a batch of "
            f"{effective} (Keras averages the {pieces} mean-reduced gradients)"
        )
        if self.scale_learning_rate != "none":
            compile_config, lr_detail = scale_learning_rate(
                compile_config,
                old_batch_size=before * plan.batch_size,
                new_batch_size=effective,
                rule=self.scale_learning_rate,
            )
            detail += f"; {lr_detail}"
        per_pass = int(plan.dataset.cardinality()) * plan.micro_batches
        if per_pass > 0 and per_pass % pieces:
            # Keras counts micro-batches across epochs: an update is made of pieces wherever they come from.
            detail += (
                f"; a pass holds {per_pass} micro-batches, not a multiple of {pieces}: the last {per_pass % pieces} "
                "of each pass go into an update with the next pass's first, and the last pass's into none (make "
                f"the batches per pass a multiple of {pieces} to keep the updates within passes)"
            )
        return plan.replace(compile_config=compile_config).record(self.name, detail)


def with_gradient_accumulation(optimizer: keras.optimizers.Optimizer, steps: int) -> keras.optimizers.Optimizer:
    """Functional form: a fresh copy of a Keras optimizer that accumulates `steps` micro-batches per update.

    Args:
        optimizer: A Keras 3 optimizer (not yet used: its slots are not copied).
        steps: Micro-batches per update, at least 2.

    Returns:
        A new optimizer of the same class and settings, with `gradient_accumulation_steps=steps`.

    Example:
        >>> import keras
        >>> with_gradient_accumulation(keras.optimizers.Adam(1e-3), 4).gradient_accumulation_steps
        4
    """
    import keras

    GradAccum(steps=steps)  # validates steps
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        # LossScaleOptimizer rejects the argument itself: it belongs to the inner optimizer.
        inner = with_gradient_accumulation(optimizer.inner_optimizer, steps)
        return keras.optimizers.LossScaleOptimizer(
            inner,
            **{
                key: value
                for key, value in optimizer.get_config().items()
                if key in ("initial_scale", "dynamic_growth_steps")
            },
        )
    return type(optimizer).from_config({**optimizer.get_config(), "gradient_accumulation_steps": steps})
