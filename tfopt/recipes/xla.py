"""XLA compilation of the train step, set explicitly because Keras' default decides silently.

Keras' `jit_compile="auto"` turns XLA off on CPU-only machines, under any tf.distribute strategy, and
when one layer has `supports_jit = False`, in each case without saying so. This recipe sets
`jit_compile` explicitly (on "auto", as the user's own compile chose it, where it chose); the build
(`tfopt.builder`) then checks, on the model it creates, that every layer lowers to XLA (falling back with
the offending layer named) and, where XLA is tfopt's choice, keeps batch shapes static. On CPU-only
hardware "auto" leaves XLA off: there it made a small CNN slower as often as faster (docs/recipes/xla.md).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from tfopt.errors import RecipeConfigError
from tfopt.plan import Plan, users_jit_compile
from tfopt.recipes.base import Recipe, Stage


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
            raise RecipeConfigError(
                f"xla: jit_compile={self.jit_compile!r} is not valid. Expected 'auto', true or false.",
                setting="jit_compile",
            )

    def __call__(self, plan: Plan) -> Plan:
        if self.jit_compile is False:
            return plan.with_compile(jit_compile=False).record(self.name, "jit_compile=False requested", skipped=True)
        own = users_jit_compile(plan.compile_objects)
        if self.jit_compile == "auto" and own is not None:
            change = f"xla: {{jit_compile: {str(not own).lower()}}} changes it"
            kept = f"jit_compile={own} kept, as your compile set it ({change})"
            return plan.with_compile(jit_compile=own).record(
                self.name, f"{'on' if own else 'off'}: {kept}", skipped=not own
            )
        if self.jit_compile == "auto" and plan.hardware.accelerator == "cpu":
            # No speed figure here: one measured on another machine would read as a fact about this one.
            return plan.with_compile(jit_compile=False).record(
                self.name,
                f"no GPU or TPU ({plan.hardware.describe()}): XLA stays off on CPUs, where it often "
                "made training slower; set jit_compile: true to force it, or recipes='auto' to time it here",
                skipped=True,
            )
        return plan.with_compile(jit_compile=True).record(
            self.name,
            "on: jit_compile=True set explicitly, since Keras' 'auto' turns it off under distribution "
            "strategies and on CPU; the build checks that every layer lowers to XLA (else compiles without it, "
            "naming the layer) and keeps batch shapes static",
        )
