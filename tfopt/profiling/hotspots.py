"""Where the time goes inside a capture, one level below the step breakdown: the input pipeline stage by
stage (`stages.py`) and the model layer by layer (`layers.py`), read together.

The step breakdown says *that* a step waits for input or that device compute dominates; these tables say
which `map` and which layer, and `diagnose.refine_diagnosis` lets them pick the recipe that fits.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfopt.hardware import Hardware
from tfopt.profiling.layers import LayerTimes, layer_times
from tfopt.profiling.stages import PipelineStages, pipeline_stages

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

_log = logging.getLogger("tfopt")


@dataclasses.dataclass(frozen=True)
class Hotspots:
    """The stage table of the pipeline that fed training and the layer table of the model.

    Attributes:
        stages: None where the capture holds no tf.data events.
        layers: None where reading the ops failed.
    """

    stages: PipelineStages | None
    layers: LayerTimes | None

    def top_lines(self) -> list[str]:
        """The bounding stage and the heaviest layer, a line each."""
        return [table.top_line() for table in (self.stages, self.layers) if table is not None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "stages": self.stages.to_dict() if self.stages else None,
            "layers": self.layers.to_dict() if self.layers else None,
        }


def find_hotspots(
    xplane: str | Path,
    hardware: Hardware,
    *,
    model: keras.Model | None = None,
    dataset: tf.data.Dataset | None = None,
    batch_size: int | None = None,
    step_seconds: float | None = None,
) -> Hotspots:
    """Both tables of one capture; a table that cannot be read is left out with a warning, never raised:
    it adds detail to a profile that stands without it.

    Args:
        xplane: The capture's `.xplane.pb`.
        hardware: The machine it ran on.
        model: The captured Keras model, where at hand (exact layer names, FLOPs and bytes).
        dataset: The captured tf.data pipeline, where at hand (each map's function name).
        batch_size: Examples per step.
        step_seconds: The mean wall step (each layer's share of it).
    """
    tables: dict[str, Any] = {}
    readers = {
        "stages": lambda: pipeline_stages(
            xplane, cpu_count=hardware.cpu_count, dataset=dataset, step_seconds=step_seconds
        ),
        "layers": lambda: layer_times(
            xplane, step_seconds=step_seconds, model=model, batch_size=batch_size, hardware=hardware
        ),
    }
    for name, read in readers.items():
        try:
            tables[name] = read()
        except Exception as error:  # noqa: BLE001 - a detail table must not cost the profile it details
            _log.warning(
                "tfopt: the %s table of %s could not be read: %s: %s", name, xplane, type(error).__name__, error
            )
            tables[name] = None
    return Hotspots(**tables)
