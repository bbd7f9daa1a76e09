"""Which recipes auto mode tries, decided from the diagnosis and the hardware before anything is timed.

Auto mode compares configurations by examples/s at the same batch size on the same batches, and by
their loss trajectory from the same weights. That is a fair comparison for recipes that change how
fast the same training runs: the input pipeline, the dtype policy, XLA. Recipes that change the
training itself (the batch size, gradient accumulation) or need another machine layout (distribution)
or files on disk (tfrecord) are never tried: they are named in the table with the reason, so the user
can apply them explicitly.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfopt.hardware import Hardware
from tfopt.recipes.base import Recipe

if TYPE_CHECKING:
    from tfopt.profiling.diagnose import Diagnosis

INPUT_BOUND_EFFICIENCY = 0.8
"""Below this fraction of the compute-only ceiling, real training is waiting for its input."""

NOT_COMPARABLE = {
    "batch_size": "it changes the batch size, so examples/s and the loss trajectory are not comparable "
    "with the baseline's; apply it explicitly",
    "grad_accum": "it changes how many examples each update sees, so the loss trajectory is not comparable; "
    "apply it explicitly",
    "distribution": "it changes the device layout; auto mode tunes one process on the devices it has",
    "tfrecord": "it writes the data to TFRecord files first; apply it explicitly",
    "steps_per_execution": "Keras reports the loss once per call of several steps, so the loss trajectory is "
    "not compared step by step; apply it explicitly (steps: auto measures it side by side)",
}


@dataclasses.dataclass(frozen=True)
class Candidates:
    """The recipes to try, most promising first, and those left out with the reason.

    Attributes:
        recipes: Label -> recipe, e.g. {"data_pipeline": DataPipeline(), "mixed_bfloat16": MixedPrecision(...)}.
        not_tried: Label -> why it is not tried.
        notes: What the choice was based on (the diagnosis, the input efficiency).
    """

    recipes: dict[str, Recipe]
    not_tried: dict[str, str]
    notes: tuple[str, ...]

    @property
    def alternatives(self) -> dict[str, str]:
        """Label -> recipe name for the recipes tried in several settings (`search`'s `alternatives`)."""
        names = [recipe.name for recipe in self.recipes.values()]
        return {label: recipe.name for label, recipe in self.recipes.items() if names.count(recipe.name) > 1}


def choose_candidates(
    hardware: Hardware,
    *,
    input_efficiency: float | None,
    diagnosis: Diagnosis | None = None,
    fusable_batch_norms: int = 0,
) -> Candidates:
    """Picks the recipes worth a trial on this hardware for this bottleneck.

    - data_pipeline, where training waits for input: the diagnosis says so, or real training reaches
      less than `INPUT_BOUND_EFFICIENCY` of the compute-only ceiling.
    - mixed precision in the 16-bit type the hardware computes natively (`choose_policy`), if any.
    - XLA, always: whether it pays off depends on the model and the machine, which is what trials measure.
    - fused_layers (both rewrites), where the model has BatchNormalization layers the fused kernel computes:
      the rewrite changes how, not what, the model computes, and whether it is faster depends on the machine
      and on XLA (the trials' greedy combination measures both).
    - data_service with 1 and (on 4 cores or more) 2 local worker processes, where the diagnosis says the
      input pipeline is parallel already and the host's cores are its limit (`tfopt.profiling.stages`):
      whether workers beside training on the same cores help is what trials measure; workers on other hosts
      are given explicitly (`data_service: {dispatcher: ...}`).

    Args:
        hardware: The machine.
        input_efficiency: On-device ceiling step time / real step time of the baseline, where measured.
        diagnosis: A `tfopt.profiling.diagnose.Diagnosis` of the baseline, where profiling worked.
        fusable_batch_norms: The model's BatchNormalization layers `fused_layers` would rewrite.

    Returns:
        The candidates.

    Example:
        >>> from tfopt.hardware import Hardware
        >>> chosen = choose_candidates(Hardware(cpu_flags=frozenset({"avx512_bf16"})), input_efficiency=0.4)
        >>> list(chosen.recipes)
        ['data_pipeline', 'mixed_bfloat16', 'xla']
    """
    from tfopt.recipes import DataPipeline, DataService, FusedLayers, MixedPrecision, Xla, choose_policy

    recipes: dict[str, Recipe] = {}
    not_tried: dict[str, str] = {}
    notes = []
    if diagnosis is not None:
        notes.append(f"diagnosis: {diagnosis.summary}")
    if input_efficiency is not None:
        notes.append(f"baseline input efficiency: {input_efficiency:.0%} of the on-device compute-only ceiling")
    input_bound = bool(diagnosis is not None and diagnosis.input_bound) or (
        input_efficiency is not None and input_efficiency < INPUT_BOUND_EFFICIENCY
    )
    if input_bound:
        recipes["data_pipeline"] = DataPipeline()
    else:
        measured = (
            f"real training reaches {input_efficiency:.0%} of the compute-only ceiling"
            if input_efficiency is not None
            else "no input wait was measured"
        )
        not_tried["data_pipeline"] = f"not input-bound: {measured}"
    policy, reason = choose_policy(hardware)
    if policy == "float32":
        not_tried["mixed_precision"] = reason
    else:
        recipes[policy] = MixedPrecision(policy=policy)
    recipes["xla"] = Xla(jit_compile=True)
    if fusable_batch_norms:
        recipes["fused_layers"] = FusedLayers(batch_norm=True, conv_bias=True)
    else:
        not_tried["fused_layers"] = "the model has no BatchNormalization layer the fused kernel computes"
    stages = diagnosis.hotspots.stages if diagnosis is not None and diagnosis.hotspots is not None else None
    if input_bound and stages is not None and stages.recipe == "data_service":
        for workers in (1, 2) if hardware.cpu_count >= 4 else (1,):
            recipes[f"data_service:{workers}"] = DataService(workers=workers)
    elif input_bound:
        not_tried["data_service"] = (
            "the input pipeline was not read stage by stage (no profile)"
            if stages is None
            else "the input pipeline is not yet parallel with every core of the host busy: "
            "parallel stages here come first"
        )
    for name in diagnosis.recipes if diagnosis is not None else ():
        if name in NOT_COMPARABLE:
            not_tried[name] = f"suggested by the diagnosis, but {NOT_COMPARABLE[name]}"
    return Candidates(recipes=recipes, not_tried=not_tried, notes=tuple(notes))
