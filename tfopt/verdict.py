"""Which recipes a measurement keeps: the setups `apply` measures side by side, and what it decides from them.

A recipe whose choice was left to tfopt (the default's pipeline rewrite, `mixed_precision: {policy: auto}`,
`xla: {jit_compile: auto}`) is kept only where the optimized setup measured faster than the same setup
without it in every round of an interleaved measurement, else left out with its ratio and range; what
`apply` gives back is then the setup without it, which was measured too. Two questions are asked, each
of a pair of setups that differ in nothing else:

- Do the recipes that change how the model computes (mixed precision, XLA) pay? The optimized setup
  against the user's model on the optimized pipeline.
- Does the pipeline rewrite pay? The model that is kept (optimized, or with the user's numerics) on the
  rewritten pipeline against the same model on the user's own pipeline.

Recipes decided on their own before (`decided_alone`: fused_layers, steps_per_execution) are on every side but
the user's own setup: "your numerics" keeps them, and where its model is not the user's, it is measured on the
user's pipeline too ("your numerics and pipeline"), so that neither question counts their gain.

Recipes the user set explicitly are kept as asked: they are never the question.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from tfopt.plan import SET_ON_THE_MODEL, Step
from tfopt.profiling.metrics import spread

if TYPE_CHECKING:
    from tfopt.builder import Built
    from tfopt.plan import Plan
    from tfopt.profiling.measurement import SideBySide

_log = logging.getLogger("tfopt")

BEFORE, AFTER = "before", "after"
# The optimized setup with the user's numerics (their model on the rewritten pipeline), and with the user's
# pipeline (the optimized model on it).
USERS_NUMERICS, USERS_PIPELINE = "your numerics", "your pipeline"
# The setup with the user's numerics on the user's pipeline, where its model is not the user's own.
USERS_BOTH = "your numerics and pipeline"
# The fewest rounds whose spread can show a ratio beyond noise.
MIN_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class Candidates:
    """The setups to measure side by side, by name (`BEFORE` first, `AFTER` last), and what they decide.

    Attributes:
        setups: Name -> built setup, in the order they are measured.
        numerics: The recipes changing how the model computes that must measure faster to be kept.
        pipeline: Whether the pipeline rewrite must measure faster to be kept.
    """

    setups: Mapping[str, Built]
    numerics: tuple[str, ...]
    pipeline: bool


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the measurement kept.

    Attributes:
        chosen: The name of the setup that is given back (`AFTER` where every recipe paid).
        built: That setup, its plan saying what was kept and left out, with the ratios.
    """

    chosen: str
    built: Built


def candidates(before: Built, after: Built, verifying: frozenset[str]) -> Candidates:
    """The setups that decide the recipes in `verifying` (those left to tfopt), besides `before` and `after`.

    Args:
        before: The user's setup, as built for the baseline.
        after: The optimized setup, checked on the first batch.
        verifying: The names of the recipes whose choice was left to tfopt.

    Returns:
        The setups by name, `BEFORE` first and `AFTER` last. The pipeline rewrite is a question only where the
        rest trains the same examples per step under the same strategy (a batch_size, distribution or
        data_service recipe reshapes the data around it: then it stays as planned).

    Example:
        >>> from tfopt.builder import Built
        >>> from tfopt.hardware import Hardware
        >>> from tfopt.plan import Plan
        >>> plan = Plan(model_fn=None, dataset=None, compile_config={}, hardware=Hardware(), sample_inputs=None,
        ...             batch_size=8)
        >>> user = Built(model="user's", dataset="theirs", strategy=None, plan=plan)
        >>> tuned = Built(model="copy", dataset="rewritten", strategy=None,
        ...               plan=plan.replace(dtype_policy="mixed_bfloat16").record("data_pipeline", "tuned"))
        >>> list(candidates(user, tuned, frozenset({"mixed_precision", "data_pipeline"})).setups)
        ['before', 'your numerics', 'your pipeline', 'after']
    """
    changed = _numerics_changed(before.plan, after.plan)
    numerics = tuple(changed) if changed and set(changed) <= verifying else ()
    pipeline = (
        "data_pipeline" in verifying
        and after.plan.data_service is None
        and _examples_per_step(after.plan) == _examples_per_step(before.plan)
        and any(step.recipe == "data_pipeline" and not step.skipped for step in after.plan.applied)
    )
    setups = {BEFORE: before}
    if numerics:
        setups[USERS_NUMERICS] = _with_users_numerics(before, after)
        if pipeline and setups[USERS_NUMERICS].model is not before.model:
            setups[USERS_BOTH] = _with_users_pipeline(before, setups[USERS_NUMERICS])
    if pipeline and (changed or _compiled_otherwise(before.plan, after.plan) or _rewritten_otherwise(before, after)):
        setups[USERS_PIPELINE] = _with_users_pipeline(before, after)
    setups[AFTER] = after
    return Candidates(setups=setups, numerics=numerics, pipeline=pipeline)


def decided(candidates: Candidates, measured: SideBySide) -> Verdict:
    """The setup whose recipes each measured faster than the same setup without them, in every round.

    Args:
        candidates: The setups, as measured.
        measured: Their measurement side by side, in the order of `candidates.setups`.

    Returns:
        The setup given back, by name, its plan's steps saying each verdict with its ratio and range.
    """
    names = list(candidates.setups)
    setups = candidates.setups

    def ratios(side: str, other: str) -> tuple[float, ...]:
        return measured.ratios(names.index(side), names.index(other))

    hardware = setups[AFTER].plan.hardware.describe()
    users_pipeline = USERS_PIPELINE if USERS_PIPELINE in setups else BEFORE
    users_both = USERS_BOTH if USERS_BOTH in setups else BEFORE
    verdicts: list[tuple[tuple[str, ...], str, bool]] = []
    numerics_kept = pipeline_kept = True
    if candidates.numerics:
        rounds = ratios(AFTER, USERS_NUMERICS)
        numerics_kept, detail = _judged(rounds, f"without {' and '.join(candidates.numerics)}", hardware)
        verdicts.append((candidates.numerics, detail, numerics_kept))
    if candidates.pipeline:
        rounds = ratios(AFTER, users_pipeline) if numerics_kept else ratios(USERS_NUMERICS, users_both)
        pipeline_kept, detail = _judged(rounds, "on your own pipeline", hardware)
        verdicts.append((("data_pipeline",), detail, pipeline_kept))
    chosen = {
        (True, True): AFTER,
        (True, False): users_pipeline,
        (False, True): USERS_NUMERICS,
        (False, False): users_both,
    }[numerics_kept, pipeline_kept]
    plan = setups[chosen].plan.replace(applied=_applied_steps(setups[AFTER].plan, verdicts))
    return Verdict(chosen=chosen, built=dataclasses.replace(setups[chosen], plan=plan))


def built_again(after: Built, plan: Plan) -> Built:
    """The optimized setup built again as `plan` says (without its layer rewrites, at another number of steps per
    call), on the same pipeline and its tf.data service."""
    from tfopt.builder import build

    again = build(plan.replace(data_service=None))
    return dataclasses.replace(again, dataset=after.dataset, plan=plan, service=after.service)


def decided_alone(recipe: str, sides: Sequence[tuple[str, Built]], measured: SideBySide) -> Built:
    """Of a recipe's choices measured faster than the same setup without it in every round, the one of highest
    median; else the setup without it; its plan saying which and by how much.

    Asked first, of one recipe alone in the setup it goes with (its effect turns with the rest: fused
    BatchNormalization was faster than Keras' own on a CPU without XLA and slower with XLA; steps per call pay
    where steps are short), and settled on both sides of the other recipes' question (`candidates`).

    Args:
        recipe: The recipe's name, whose step in the plan says the verdict.
        sides: (what the setup is, setup) as measured side by side: first the setup without the recipe's
            change ("without fused_layers", "at 1 step(s) per call"), then one per choice ("" where there is
            one, "16 steps per call").
        measured: Their measurement side by side, in that order.
    """
    (without, plain), *choices = sides
    hardware = plain.plan.hardware.describe()
    judged = []
    for index, (choice, built) in enumerate(choices, start=1):
        rounds = measured.ratios(index, 0)
        kept, detail = _judged(rounds, without, hardware)
        median, low, high = spread(rounds)
        judged.append((kept, median, choice, detail, f"{choice} {median:.2f}x [{low:.2f}-{high:.2f}]", built))
    best = max(judged, key=lambda verdict: verdict[:2])
    kept, _, choice, detail, _, built = best
    others = [verdict[4] for verdict in judged if verdict is not best]
    detail = (f"{choice}: {detail}" if choice else detail) + (f" (beside {', '.join(others)})" if others else "")
    if kept:
        return dataclasses.replace(built, plan=built.plan.amend(recipe, detail))
    _log.info("%s: %s", recipe, detail)
    return dataclasses.replace(plain, plan=plain.plan.left_out(recipe, detail))


def _numerics_changed(baseline: Plan, optimized: Plan) -> list[str]:
    """The recipes that change how the model computes between two plans."""
    changed = []
    if optimized.dtype_policy != baseline.dtype_policy:
        changed.append("mixed_precision")
    if optimized.jit_compile and not baseline.jit_compile:
        changed.append("xla")
    return changed


def _judged(rounds: tuple[float, ...], against: str, hardware: str) -> tuple[bool, str]:
    """Whether a ratio measured round by round is faster beyond noise, and the sentence that says so. Fewer than
    `MIN_ROUNDS` rounds show no noise to be beyond: a recipe measured so is left out, saying so."""
    median, low, high = spread(rounds)
    measured = (
        f"measured {median:.2f}x [{low:.2f}-{high:.2f}] over {len(rounds)} rounds against the same setup "
        f"{against} on this machine ({hardware})"
    )
    if len(rounds) < MIN_ROUNDS:
        return False, f"left out: {measured}: too few rounds to tell from noise (measure {MIN_ROUNDS} or more)"
    if low > 1.0:
        return True, f"kept: {measured}"
    return False, f"left out: {measured}: {'slower' if high < 1.0 else 'within noise'}"


def _applied_steps(plan: Plan, verdicts: list[tuple[tuple[str, ...], str, bool]]) -> tuple[Step, ...]:
    """The optimized plan's steps with each verdict said in its recipe's place: a kept recipe's step amended, a
    left-out recipe's steps replaced by one skipped step with the reason."""
    for recipes, detail, kept in verdicts:
        for name in recipes:
            if kept:
                plan = plan.amend(name, detail)
                continue
            _log.info("%s: %s", name, detail)
            plan = plan.left_out(name, detail)
    return plan.applied


def _compiled_otherwise(baseline: Plan, optimized: Plan) -> bool:
    """Whether recipes changed a compile setting other than XLA, or the examples per step, or the strategy."""

    def training(plan: Plan) -> tuple[dict, tuple[int, int, str]]:
        # The steps per call read through the plan (1 where unset), not as the compile arguments say them.
        settings = {key: value for key, value in plan.compile_config.items() if key not in SET_ON_THE_MODEL}
        return {**settings, "steps_per_execution": plan.steps_per_call}, _examples_per_step(plan)

    return training(baseline) != training(optimized)


def _rewritten_otherwise(baseline: Built, optimized: Built) -> bool:
    """Whether the optimized model's layers were rewritten (`fused_layers`) where the baseline's were not."""
    return optimized.plan.layer_rewrites != baseline.plan.layer_rewrites


def _examples_per_step(plan: Plan) -> tuple[int, int, str]:
    """The batch of each step, the steps per batch of the user's pipeline (micro-batches), and the strategy."""
    return plan.batch_size, plan.micro_batches, plan.strategy


def _with_users_numerics(before: Built, after: Built) -> Built:
    """The optimized setup with the user's numerics (dtype policy, XLA, TF32) on its pipeline (offloaded, the one
    stream the service serves): the baseline's model itself where nothing else differs, else built anew. Layer
    rewrites stay: they were decided on their own (`decided_alone`), so the question is the others'."""
    from tfopt.builder import build

    plan = after.plan.with_compile(jit_compile=before.plan.jit_compile).replace(
        dtype_policy=before.plan.dtype_policy, tf32=before.plan.tf32
    )
    users = before
    # A learning rate or steps per execution of its own, or rewritten layers.
    if _compiled_otherwise(before.plan, after.plan) or _rewritten_otherwise(before, after):
        users = build(plan.replace(data_service=None))
    return dataclasses.replace(users, dataset=after.dataset, plan=plan, service=after.service)


def _with_users_pipeline(before: Built, after: Built) -> Built:
    """The optimized model on the user's own pipeline (its batches made static where XLA needs them, then cut
    into the optimized setup's micro-batches, if any)."""
    from tfopt.data.batches import static_batches
    from tfopt.training.micro_batches import split_batches

    plan = after.plan
    dataset = before.plan.dataset
    if plan.jit_compile:
        dataset, _ = static_batches(dataset, plan.whole_batch_size)
    steps = split_batches(dataset, plan.micro_batches)
    return dataclasses.replace(after, dataset=steps, plan=plan.replace(dataset=dataset), service=None)
