"""The Monitor's profiler captures: a few training steps under the TF Profiler now and then, and what
they say (device busy %, the diagnosis, the slowest input stage, the heaviest layer) as a `profile` record.

Kept apart from the Monitor, which decides when to capture: this module knows how to capture and read one.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    import keras

    from tfopt.hardware import Hardware

_log = logging.getLogger("tfopt")
PROFILE_STEPS = 5


class ProfilerCapture:
    """One TF Profiler capture at a time, `PROFILE_STEPS` training steps long, into numbered directories."""

    def __init__(self) -> None:
        self.steps_left = 0
        self.count = 0
        self.directory: Path | None = None

    @property
    def running(self) -> bool:
        return self.steps_left > 0

    def start(self, parent: Path | None, step: int) -> None:
        """Starts capturing into `parent/tfopt-profile-<n>`, the next number no capture holds yet (a new temporary
        directory without a `parent`); warns and captures nothing if the profiler is busy."""
        import tensorflow as tf

        self.count += 1
        parent = parent if parent is not None else Path(tempfile.mkdtemp(prefix="tfopt-monitor-"))
        while (parent / f"tfopt-profile-{self.count}").exists():  # an earlier run's, in the same logdir
            self.count += 1
        self.directory = parent / f"tfopt-profile-{self.count}"
        try:
            tf.profiler.experimental.start(str(self.directory))
        except Exception as error:  # noqa: BLE001 - another profiler may hold the process (TensorBoard's)
            _log.warning("tfopt.Monitor: no profile captured at step %d: %s", step, error)
            return
        self.steps_left = PROFILE_STEPS

    def marker(self, step: int) -> AbstractContextManager[object]:
        """The profiler's step marker around a traced training step; nothing outside a capture."""
        if not self.running:
            return contextlib.nullcontext()
        import tensorflow as tf

        return tf.profiler.experimental.Trace("train", step_num=step, _r=1)

    def count_step(self) -> bool:
        """Counts one traced step; True when it was the capture's last."""
        self.steps_left -= 1
        return not self.running

    def stop(self, step: int, hardware: Hardware, model: keras.Model) -> dict[str, Any] | None:
        """Ends the capture and returns its `profile` record at `step` (None when it cannot be read)."""
        import tensorflow as tf

        tf.profiler.experimental.stop()
        self.steps_left = 0
        return _profile_record(self.directory, step, hardware, model) if self.directory is not None else None

    def abort(self) -> None:
        """Stops a running capture without analysing it (closing after a failure)."""
        if not self.running:
            return
        import tensorflow as tf

        self.steps_left = 0
        with contextlib.suppress(Exception):
            tf.profiler.experimental.stop()


def _profile_record(directory: Path, step: int, hardware: Hardware, model: keras.Model) -> dict[str, Any] | None:
    """The `profile` record of the capture in `directory`: busy %, input wait, the diagnosis, the slowest
    input stage and heaviest layer; None (with a warning) when it cannot be read."""
    from tfopt.profiling.analyze import analyze, find_xplane
    from tfopt.profiling.diagnose import diagnose_breakdown, refine_diagnosis
    from tfopt.profiling.hotspots import find_hotspots
    from tfopt.runtime import gpu_thread_mode_in_force

    try:
        breakdown = analyze(directory)
    except Exception as error:  # noqa: BLE001 - a capture that cannot be read must not stop training
        _log.warning("tfopt.Monitor: the capture in %s could not be analysed: %s", directory, error)
        return None
    hotspots = find_hotspots(find_xplane(directory), hardware, model=model, step_seconds=breakdown.step_seconds_mean)
    diagnosis = refine_diagnosis(
        diagnose_breakdown(
            breakdown,
            hardware,
            steps_per_call=model.steps_per_execution,
            gpu_thread_mode=gpu_thread_mode_in_force(),
        ),
        hotspots,
    )
    stage = hotspots.stages.bottleneck if hotspots.stages else None
    layer = hotspots.layers.top if hotspots.layers else None
    return {
        "kind": "profile",
        "step": step,
        "path": str(directory),
        "busy_percent": breakdown.busy_percent,
        "input_wait_percent": breakdown.input_percent,
        "step_seconds": breakdown.step_seconds_mean,
        "bottlenecks": list(diagnosis.bottlenecks),
        "diagnosis": diagnosis.summary,
        "top_stage": stage.label if stage else None,
        "top_stage_seconds_per_batch": stage.bound_seconds_per_batch if stage else None,
        "top_layer": layer.layer if layer else None,
        "top_layer_seconds_per_step": layer.seconds_per_step if layer else None,
    }
