"""Several training steps per call of Keras' train function, where the host's cost per call is what the steps
wait for.

Keras runs each step as one call of a `tf.function` from Python: the call, the iterator's handover and the
read of the step's logs cost the host a fixed time per call, which a short step (a small model, a small batch,
a fast accelerator) waits for. `steps_per_execution=N` runs N steps in one call (a `tf.while_loop` over the
same `train_step`), so that cost is paid once per N steps. The learning is the same step by step: each batch
goes through the same `train_step` in the same order. What changes is how often Keras calls back: a callback's
`on_train_batch_begin`/`end` runs once per N batches (Keras' own batch-level callbacks, ModelCheckpoint and
BackupAndRestore, count the batches between calls), and the loss shown per batch is the last one's. And given
`steps_per_epoch`, Keras' loop counts calls and runs each whole while the data lasts: 10 steps an epoch at 4
per call train 12 (`tfopt.training.calls.whole_calls` trains such an epoch at a number that divides it).
Hence this recipe is not in the default chain: a callback of yours that acts per batch would act once per N.

With "auto" the number is chosen by measurement (`tfopt.verdict.decided_alone`): the optimized setup measured
side by side at its own number and at each larger candidate; of those faster than its own number in every
round, the one of highest median is kept, else the setup is left as it was, with the ratios. Under
MirroredStrategy over several replicas, where Keras 3.15 fails with more than one step per call, "auto" is left
out, saying so, and a number is refused by the distribution recipe.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan
from tfopt.recipes.base import Recipe, Stage
from tfopt.recipes.distribution import several_steps_refused

# The numbers "auto" measures beside the plan's own: each a multiple of the one before, so that a gain that
# keeps growing with N is seen, and small enough that a measurement's windows stay a few calls long.
CANDIDATES = (4, 16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepsPerExecution(Recipe):
    """Runs several training steps in one call of the train function (Keras' `steps_per_execution`).

    Args:
        steps: "auto" (measured: the fastest of the model's own number and `CANDIDATES`, kept only where
            faster beyond noise), or a number of steps per call, kept as asked.

    Example:
        >>> StepsPerExecution(steps=8).get_config()
        {'steps': 8}
    """

    name: ClassVar[str] = "steps_per_execution"
    stage: ClassVar[Stage] = Stage.COMPILE

    steps: int | str = "auto"

    def __post_init__(self) -> None:
        valid = self.steps == "auto" or (
            isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 1
        )
        if not valid:
            raise RecipeConfigError(
                f"steps_per_execution: steps={self.steps!r} is not valid. Expected 'auto' or a whole number of "
                "training steps per call, 1 or more.",
                setting="steps",
            )

    @property
    def verified(self) -> bool:
        """Whether the measurement chooses the number."""
        return self.steps == "auto"

    def __call__(self, plan: Plan) -> Plan:
        if self.steps == "auto":
            refused = several_steps_refused(plan)
            if refused:
                return plan.record(self.name, f"{refused}: {plan.steps_per_call} step(s) per call kept", skipped=True)
            if not steps_choices(plan):
                return plan.record(
                    self.name, f"the model runs {plan.steps_per_call} steps per call already: kept", skipped=True
                )
            return plan.record(
                self.name,
                f"{plan.steps_per_call} step(s) per call unless {' or '.join(map(str, steps_choices(plan)))} measure "
                f"faster side by side after the build; {CALLBACKS}",
            )
        return plan.with_compile(steps_per_execution=self.steps).record(
            self.name, f"{self.steps} training steps per call of the train function; {CALLBACKS}"
        )


# What changes for the user's `fit` at N steps per call, said wherever N > 1 is planned.
CALLBACKS = (
    "Keras calls back once per call (on_train_batch_begin/end; its ModelCheckpoint and BackupAndRestore count the "
    "batches), and given steps_per_epoch (or evaluate's and predict's steps) it runs whole calls: give a multiple "
    "of the steps per call, or one pass over a finite dataset (tfopt-recipe run does)"
)


def steps_choices(plan: Plan) -> tuple[int, ...]:
    """The numbers of steps per call "auto" measures beside the plan's own: none under a strategy Keras cannot run
    several under (`tfopt.recipes.distribution.several_steps_refused`), where they would fail, not measure."""
    if several_steps_refused(plan):
        return ()
    return tuple(n for n in CANDIDATES if n > plan.steps_per_call)
