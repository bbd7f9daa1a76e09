"""Profile a model on its dataset: a TF Profiler capture, timed steps, device samples, a diagnosis.

`capture()` trains a few steps under `tf.profiler.experimental` and writes a logdir TensorBoard opens
(`tensorboard --logdir <logdir>`, Profile tab). Keras 3 marks its steps with names the profiler's step
analysis does not recognise ("No step time measured"), so every step is wrapped in
`tf.profiler.experimental.Trace("train", step_num=i, _r=1)`, which it does. The analysis reads wall
steps from those markers' ends (`trace.py`), so the wait for the next batch is inside a step.

tfopt's own waits for the device sit only at the two ends of the measured steps; what Keras does per step
(it reads each step's logs to the host on the TensorFlow backend) stays as in the user's training.

xprof's step analysis drops the first and the last marked step of a capture (they may be cut off), so
the profiler starts one step before the measured steps and one extra step runs after them: the measured
steps are then exactly the ones it analyses, and the first of them has a marked step before it.

`profile()` is the public entry point: it times real training and the on-device compute-only ceiling
without the profiler (`measurement.measure`), captures, analyses and diagnoses. The unprofiled timing is the
honest speed; the profiled one shows what the profiler costs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfopt.errors import (
    DataError,
    IncompatibleModelError,
    MeasurementError,
    RecipeConfigError,
    describe_error,
    released,
    storage_error,
)
from tfopt.hardware import Hardware
from tfopt.profiling.analyze import analyze, find_xplane
from tfopt.profiling.breakdown import STEP_MARKER, StepBreakdown
from tfopt.profiling.diagnose import Diagnosis, diagnose_breakdown, refine_diagnosis
from tfopt.profiling.hotspots import Hotspots, find_hotspots
from tfopt.profiling.measurement import Measurement, measure
from tfopt.profiling.metrics import Metrics
from tfopt.profiling.sampler import DeviceSampler, Samples
from tfopt.profiling.timing import StepTimes, WindowTimer, training_state_restored
from tfopt.runtime import gpu_thread_mode_in_force
from tfopt.training.calls import steps_per_call
from tfopt.training.peak_memory import track_peak_memory

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

_log = logging.getLogger("tfopt")


@dataclasses.dataclass(frozen=True)
class Capture:
    """One profiled training run.

    Attributes:
        logdir: The directory to open in TensorBoard.
        xplane_path: The capture file inside it.
        step_times: The measured steps' time under the profiler (one window: a device sync at each end).
        step_numbers: The step markers' numbers of the measured steps.
        samples: NVML and host readings taken during the run.
        peak_memory_bytes: The peak of TensorFlow's allocator over the GPUs during the run (this
            process's peak RSS on a CPU-only machine).
        steps_per_call: The model's steps per call of its train function (Keras' `steps_per_execution`); the
            capture itself ran one per call, to mark each step.
    """

    logdir: Path
    xplane_path: Path
    step_times: StepTimes
    step_numbers: tuple[int, ...]
    samples: Samples
    peak_memory_bytes: int | None = None
    steps_per_call: int = 1


@dataclasses.dataclass(frozen=True)
class Profile:
    """Everything tfopt measured about one model on one dataset.

    Attributes:
        measurement: Real and compute-only step times, measured without the profiler.
        capture: The profiled run: logdir, its step times, utilization samples.
        breakdown: Where the time of a step went.
        diagnosis: The bottlenecks and the recipes that fix them.
        hardware: The machine it ran on.
        steps_per_epoch: The dataset's length in batches, where tf.data knows it.
        served_bytes_per_batch: Bytes per batch that crossed the network from tf.data service workers (before
            compression), where the pipeline ran there (`data_service`); None where it ran in this process or
            its batches' size is not static.

    Example:
        >>> profile = tfopt.profile(model, dataset)  # doctest: +SKIP
        >>> profile.metrics.input_efficiency, profile.diagnosis  # doctest: +SKIP
    """

    measurement: Measurement
    capture: Capture
    breakdown: StepBreakdown
    diagnosis: Diagnosis
    hardware: Hardware
    steps_per_epoch: int | None = None
    served_bytes_per_batch: int | None = None

    @property
    def hotspots(self) -> Hotspots | None:
        """The input pipeline stage by stage and the model layer by layer, from the capture."""
        return self.diagnosis.hotspots

    @property
    def logdir(self) -> Path:
        return self.capture.logdir

    @property
    def samples(self) -> Samples:
        return self.capture.samples

    @property
    def metrics(self) -> Metrics:
        """Accelerator busy %, MFU, input wait % and input efficiency of this run."""
        return Metrics.of(self.hardware, self.measurement, self.breakdown)

    @property
    def peak_memory_fraction(self) -> float | None:
        """The allocator's peak over the GPU's memory (0..1); None without a GPU or its size."""
        return _memory_fraction(self.capture.peak_memory_bytes, self.hardware)

    @property
    def profiling_overhead(self) -> float:
        """How much slower steps ran under the profiler, as a fraction (0.05 = 5% fewer steps/s).

        Both speeds are medians of separate runs of the same model, so on a noisy machine this can
        come out slightly negative.
        """
        return 1.0 - self.capture.step_times.steps_per_second / self.measurement.real.steps_per_second

    def _repr_html_(self) -> str:
        from tfopt.profiling.report import compare

        return compare(self, None)._repr_html_()

    def to_dict(self) -> dict[str, Any]:
        return {
            "measurement": self.measurement.to_dict(),
            "profiled_steps": self.capture.step_times.to_dict(),
            "profiling_overhead": self.profiling_overhead,
            "breakdown": self.breakdown.to_dict(),
            "diagnosis": self.diagnosis.to_dict(),
            "samples": self.samples.to_dict(),
            "metrics": self.metrics.to_dict(),
            "peak_memory_bytes": self.capture.peak_memory_bytes,
            "steps_per_call": self.capture.steps_per_call,
            "hardware": self.hardware.describe(),
            "logdir": str(self.logdir),
            "steps_per_epoch": self.steps_per_epoch,
        }


def profile(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int = 20,
    warmup_steps: int = 5,
    logdir: str | Path | None = None,
    hardware: Hardware | None = None,
    monitor_interval_seconds: float = 0.2,
    measurement: Measurement | None = None,
) -> Profile:
    """Measures, captures and diagnoses training `model` on `dataset`; the model's state is kept.

    Runs three short trainings: real data and the compute-only ceiling without the profiler, then real
    data under the profiler. Weights and optimizer state are restored afterwards.

    Args:
        model: A compiled Keras model.
        dataset: Its batched tf.data pipeline with at least 2 batches (it is repeated as needed).
        steps: Steps measured in each run; at least 2.
        warmup_steps: Untimed steps before each run (tracing, compilation, filling buffers); at least 1.
        logdir: Where the capture goes (TensorBoard's --logdir); a new temporary directory by default.
        hardware: The machine's description; detected by default.
        monitor_interval_seconds: Time between utilization samples.
        measurement: The setup's measurement without the profiler where it was made already (`tfopt.apply`
            measures before and after side by side); measured here by default.

    Returns:
        The Profile.

    Raises:
        IncompatibleModelError: The model is not a compiled Keras model.
        RecipeConfigError: `hardware` is not a `Hardware`.
        DataError: The dataset is not a tf.data.Dataset, or has fewer than 2 batches.
        MeasurementError: Training or the capture failed; nothing already written elsewhere is touched.

    Example:
        >>> result = tfopt.profile(model, dataset, steps=20)  # doctest: +SKIP
        >>> result.diagnosis.summary  # doctest: +SKIP
        'cpu_preprocessing (high, 74.0%) -> data_pipeline'
    """
    if not getattr(model, "compiled", False):
        raise IncompatibleModelError(
            f"profile: expected a compiled keras.Model, received {type(model).__name__}"
            + (" (not compiled): compile it as you train it, then profile it." if hasattr(model, "compiled") else ".")
        )
    if hardware is not None and not isinstance(hardware, Hardware):
        raise RecipeConfigError(
            f"profile: hardware={hardware!r} is not a tfopt.hardware.Hardware: pass tfopt.hardware.detect() (the "
            "default), or a Hardware(...) describing the machine."
        )
    steps_per_epoch, batch_size = _check_dataset(dataset)
    if hardware is None:
        from tfopt.hardware import detect

        hardware = detect()
    if measurement is None:
        measurement = measure(
            model, dataset, steps=steps, warmup_steps=warmup_steps, batch_size=batch_size, hardware=hardware
        )
    with training_state_restored(model):
        captured = capture(
            model,
            dataset,
            steps=steps,
            warmup_steps=warmup_steps,
            batch_size=batch_size,
            logdir=logdir,
            monitor_interval_seconds=monitor_interval_seconds,
            gpu_count=len(hardware.gpus),
        )
    breakdown = analyze(captured.xplane_path, step_numbers=captured.step_numbers)
    diagnosis = diagnose_breakdown(
        breakdown,
        hardware,
        measurement=measurement,
        peak_memory_fraction=_memory_fraction(captured.peak_memory_bytes, hardware),
        steps_per_call=captured.steps_per_call,
        captured_steps_per_call=1,
        gpu_thread_mode=gpu_thread_mode_in_force(),
    )
    hotspots = find_hotspots(
        captured.xplane_path,
        hardware,
        model=model,
        dataset=dataset,
        batch_size=batch_size,
        step_seconds=breakdown.step_seconds_mean,
    )
    return Profile(
        measurement=measurement,
        capture=captured,
        breakdown=breakdown,
        diagnosis=refine_diagnosis(diagnosis, hotspots),
        hardware=hardware,
        steps_per_epoch=steps_per_epoch,
    )


def capture(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    logdir: str | Path | None = None,
    monitor_interval_seconds: float = 0.2,
    gpu_count: int = 0,
) -> Capture:
    """Trains `warmup_steps + steps + 1` steps, the measured ones under the TF Profiler with step markers.

    This trains the model (use `profile()` to keep its state). If training fails or is interrupted, the
    profiler is stopped (so a later capture can start) and the error says how far it got.

    Args:
        model: A compiled Keras model.
        dataset: A batched tf.data pipeline (repeated as needed).
        steps: Steps to measure; at least 2.
        warmup_steps: Steps before them, not measured; at least 1.
        batch_size: Examples per step.
        logdir: The TensorBoard logdir to write into; a new temporary directory by default.
        monitor_interval_seconds: Time between NVML and host samples.
        gpu_count: The GPUs training uses, whose allocator peak is read (0: the host's peak RSS).

    Returns:
        The capture.

    Raises:
        MeasurementError: Arguments out of range, another profiler session is running, or training failed.
    """
    if steps < 2 or warmup_steps < 1:
        raise MeasurementError(
            f"A capture needs steps >= 2 and warmup_steps >= 1; received steps={steps}, warmup_steps={warmup_steps}."
        )
    temporary = logdir is None  # ours: removed where the capture fails, kept with it (the report names it)
    logdir = Path(tempfile.mkdtemp(prefix="tfopt-profile-")) if temporary else Path(logdir)
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        return _captured(model, dataset, steps, warmup_steps, batch_size, logdir, monitor_interval_seconds, gpu_count)
    except BaseException:
        if temporary:
            shutil.rmtree(logdir, ignore_errors=True)
        raise


def _captured(
    model: keras.Model,
    dataset: tf.data.Dataset,
    steps: int,
    warmup_steps: int,
    batch_size: int,
    logdir: Path,
    monitor_interval_seconds: float,
    gpu_count: int,
) -> Capture:
    """`capture` into `logdir`, which exists."""
    from tfopt.data.read_copy import copy_to_read

    known = _captures(logdir)
    marker = _ProfiledSteps(warmup_steps=warmup_steps, steps=steps, logdir=logdir)
    sampler = DeviceSampler(interval_seconds=monitor_interval_seconds)
    try:
        # Step markers and step timing need Keras to call back once per step: a model at N steps per call is
        # captured one per call. The capture shows where a step's time goes; the speed at N is `measure`'s.
        with sampler, track_peak_memory(gpu_count) as peak, steps_per_call(model, 1):
            model.fit(
                copy_to_read(dataset).repeat(),
                steps_per_epoch=warmup_steps + steps + 1,
                epochs=1,
                verbose=0,
                shuffle=False,
                callbacks=[marker],
            )
    except BaseException as error:
        marker.close()
        message = (
            f"The profiled run stopped after {marker.completed} of {warmup_steps + steps + 1} steps "
            f"({describe_error(error)}). The profiler was stopped; reports written before are untouched."
        )
        if isinstance(error, Exception) and not isinstance(error, MeasurementError):
            raise MeasurementError(message) from error
        if hasattr(error, "add_note"):
            error.add_note(message)
        raise
    try:
        marker.close()  # the profiler writes its capture here
    except Exception as error:
        for path, modified in _captures(logdir).items():  # a capture cut short is no capture
            if known.get(path) != modified:
                path.unlink()
                with contextlib.suppress(OSError):
                    path.parent.rmdir()
        storage = storage_error(error, None, "The capture was not kept; reports written before are untouched.")
        raise storage or MeasurementError(
            f"The TF Profiler could not write its capture under {logdir}: {error}"
        ) from error
    new = sorted(path for path, modified in _captures(logdir).items() if known.get(path) != modified)
    if not new:
        raise MeasurementError(
            f"The profiler wrote no capture under {logdir}; check that the directory is "
            "writable and that TensorFlow was built with the profiler."
        )
    return Capture(
        logdir=logdir,
        xplane_path=find_xplane(new[-1]),
        samples=sampler.samples,
        step_times=StepTimes(seconds=tuple(marker.seconds), batch_size=batch_size, window_steps=steps),
        step_numbers=tuple(range(warmup_steps, warmup_steps + steps)),
        peak_memory_bytes=peak.peak_bytes,
        steps_per_call=model.steps_per_execution,
    )


class _ProfiledSteps(WindowTimer):
    """Times the measured steps as one window (`WindowTimer`: the host waits for the device at its two ends
    and nowhere else), marks each step for the profiler, and runs the profiler around them."""

    def __init__(self, *, warmup_steps: int, steps: int, logdir: Path):
        super().__init__(warmup_steps=warmup_steps, windows=1, window_steps=steps)
        self.warmup_steps = warmup_steps
        self.logdir = logdir
        self.completed = 0
        self._trace: Any = None
        self._profiling = False

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        import tensorflow as tf

        if batch == self.warmup_steps - 1:
            # One marked step before the measured ones: xprof drops a capture's first step.
            try:
                tf.profiler.experimental.start(str(self.logdir))
            except tf.errors.OpError as error:
                raise MeasurementError(
                    f"The TF Profiler could not start ({error.message}). Another profiling session is "
                    "probably running in this process: stop it with tf.profiler.experimental.stop()."
                ) from error
            self._profiling = True
        self._trace = tf.profiler.experimental.Trace(STEP_MARKER, step_num=batch, _r=1)
        self._trace.__enter__()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.completed = batch + 1  # before a stop asked for is taken below (it says how many steps ran)
        super().on_train_batch_end(batch, logs)  # at the window's ends, waits for every step before them
        self._end_trace()

    def close(self) -> None:
        """Ends the open step marker and stops the profiler, whatever state training stopped in."""
        import tensorflow as tf

        self._end_trace()
        if self._profiling:
            self._profiling = False
            tf.profiler.experimental.stop()

    def _end_trace(self) -> None:
        if self._trace is not None:
            trace, self._trace = self._trace, None
            trace.__exit__(None, None, None)


def _memory_fraction(peak_bytes: int | None, hardware: Hardware) -> float | None:
    total = hardware.gpus[0].memory_bytes if hardware.gpus else None
    return peak_bytes / total if total and peak_bytes is not None else None


def _captures(logdir: Path) -> dict[Path, int]:
    """The captures under a logdir and when each was written: runs are named by the second they
    started in, so two captures within one second write the same file, and only its time tells."""
    return {path: path.stat().st_mtime_ns for path in logdir.glob("plugins/profile/*/*.xplane.pb")}


def _check_dataset(dataset: object) -> tuple[int | None, int]:
    """Returns (batches per epoch where known, batch size); rejects datasets that cannot be profiled."""
    import tensorflow as tf

    from tfopt.data.read_copy import copy_to_read
    from tfopt.plan import batch_size_of

    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(
            f"Expected a batched tf.data.Dataset, received {type(dataset).__name__}. Wrap arrays "
            "with tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)."
        )
    cardinality = int(dataset.cardinality())
    try:
        head = list(copy_to_read(dataset).take(2))
    except tf.errors.OpError as error:
        raise DataError(f"Reading the first batches of the dataset failed: {describe_error(error)}") from released(
            error
        )
    if len(head) < 2:
        raise DataError(
            f"The dataset has {len(head)} batch{'es' if len(head) != 1 else ''}; profiling needs at least 2. "
            "With fewer it would time the same cached batch over and over and say nothing about the input "
            "pipeline. Check the files it reads and that .batch(..., drop_remainder=True) leaves batches."
        )
    element = head[0]
    if not isinstance(element, tuple) or len(element) not in (2, 3):
        raise DataError(
            f"Each dataset element must be an (inputs, targets[, sample_weights]) tuple as "
            f"keras' fit() expects; received {type(element).__name__}."
        )
    return (cardinality if cardinality > 0 else None), batch_size_of(element[0])
