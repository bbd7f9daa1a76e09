"""`tfopt.Monitor`: live throughput, input wait, MFU and memory of a user's own `model.fit`, with alerts.

The window arithmetic (when a window is full, its rates) is `throughput.Throughput`, free of Keras, and a
profiler capture is `training_capture.ProfilerCapture`; this module is the Keras side: it times the steps,
reads the device, decides when to capture, and writes and alerts. How it measures:

- **No per-step sync.** The Monitor wraps the model's `train_function` for the length of `fit` and does
  all its work in the training thread, inside that wrapper. It reads the loss to the host once at each
  window's end (one device sync) and adds none in between; under `steps_per_execution > 1` it reads the
  optimizer's step count after each call, a wait Keras makes anyway right after. (Keras 3 on the
  TensorFlow backend reads every call's logs to the host itself, `pythonify_logs` in its CallbackList,
  whatever the callbacks: its thread-pool dispatch is off for TensorFlow, which it does not mark
  thread-safe.)
- **Input wait.** Keras 3 fetches the next batch inside its traced train function, so host time between
  callbacks never sees the wait. With `steps_per_execution=1` the wrapper fetches the batch itself
  (`next(iterator)`, timed) and hands it to Keras' own one-step function, which Keras runs for any
  iterator that is not a `tf.data` one, traced once for the iterator's element spec as `fit`'s own
  graph traces it (a short last batch traces nothing again): the same step, the fetch timed in Python.
  Where data of unknown length ends, Keras' own train function meets the spent iterator, as in `fit`
  without the Monitor. Input wait % is the host time blocked in that fetch over the window's wall time.
  On an accelerator the host may run ahead of the device, so a short wait can overlap device work: the
  profiler capture (`profile_every=`) says how busy the device really was. With `steps_per_execution > 1`
  the fetch stays in Keras' graph and input wait is not measured.
- **MFU** (accelerators in `peak_flops`' table): FLOPs of one step counted once, from the first batch,
  by TensorFlow's cost analysis (`measurement.train_step_flops`), times steps/s, over the devices' peak.
- **Device memory peak**: TensorFlow's allocator peak per window (GPU); it reads zeros on a CPU.
- **Windows span epochs.** A window's clock stops where an epoch's training steps end (validation's
  `on_test_begin`, else `on_epoch_end`, with one sync) and starts again at the next `on_epoch_begin`, so
  validation and epoch-end callbacks are in no window while its steps may come from several epochs: a
  window of N steps closes whatever the epoch length, 20+ short epochs included. Each `fit`'s first step
  is never timed (it traces, or reads the batches a resumed run skips); the window open at the end of
  `fit` is kept when it has `MIN_WINDOW_STEPS` steps. Steps are global: they count on from the
  optimizer's step count (`step_counter`: micro-batches where gradients accumulate, where Keras' TensorBoard
  callback counts updates), so a resumed run goes on numbering. Under `steps_per_execution > 1` a call's
  steps are the ones the optimizer counted, for an epoch's last call may run fewer.
- **A failed fit.** Keras 3's `fit` has no `finally`: when it raises, no callback hears of it. A step
  that raises (an error, Ctrl-C) closes the Monitor on its way out; an error raised in another callback
  is caught up with at the model's next train-function call, which finds this Monitor's fit over
  (`on_train_batch_begin` did not arm it) and closes it; `close()` does it at once.
"""

from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import keras

from tfopt.errors import RecipeConfigError
from tfopt.profiling.alerts import AlertRules
from tfopt.profiling.metrics import CPU_NOTE
from tfopt.profiling.scalars import write_scalars
from tfopt.profiling.throughput import MIN_WINDOW_STEPS, Throughput
from tfopt.profiling.timing import read_loss
from tfopt.profiling.training_capture import ProfilerCapture

if TYPE_CHECKING:
    from tfopt.hardware import Hardware
    from tfopt.profiling.alerts import Alert

_log = logging.getLogger("tfopt")
PREFIX = "tfopt/"
RECORDS_NAME = "monitor.jsonl"  # in the logdir: every record, a JSON object per line


class Monitor(keras.callbacks.Callback):
    """A Keras callback that records, every window of training, how well the run uses the machine.

    Every window (`window_seconds` of training, or `every_steps` steps; windows span epochs, the time
    between epochs left out) gives examples/s, steps/s, input wait %, MFU (accelerators) and the
    allocator's memory peak (GPU). They go to TensorBoard as `tfopt/...` scalars at the global step, into
    the step and epoch `logs` (progress bar, `CSVLogger` placed after the Monitor), to a JSON-lines file, and to
    `records`. Alerts log one warning each and call `on_alert`: input wait above the profiler's 20% for
    `alert_windows` windows in a row, or MFU more than `mfu_drop_fraction` below the run's median for as
    many. On a CPU-only machine it says once (the `tfopt` logger, INFO, and the `start` record) which
    metrics do not apply.

    Args:
        logdir: Where the TensorBoard scalars and `monitor.jsonl` go. None (and no `tensorboard`): nowhere,
            `records` only.
        tensorboard: A `keras.callbacks.TensorBoard` of the same `fit`, instead of `logdir`: the Monitor
            writes into its `train` run, beside the epoch scalars.
        window_seconds: Length of a window in training time.
        every_steps: Steps per window instead (exact window sizes, e.g. for tests and short runs).
        alert_windows: Consecutive windows a condition must hold before it alerts.
        mfu_drop_fraction: An MFU below (1 - this) x the median of the run's earlier windows counts as a
            drop (0.3: 30% below).
        on_alert: Called with each `Alert` (e.g. to post to a chat).
        profile_every: Capture `training_capture.PROFILE_STEPS` steps with the TF Profiler after every this many windows
            and add accelerator busy % and the diagnosis; None for no captures.
        flops_per_step: Model FLOPs of one step, where known; counted from the first batch otherwise.
        hardware: The machine (decides which metrics apply); detected at the start of training.
        sync: Waits for the device given a step's logs (the loss read by default).

    Raises:
        RecipeConfigError: An argument out of range, or both `logdir` and `tensorboard`.

    Example:
        >>> board = keras.callbacks.TensorBoard("logs")  # doctest: +SKIP
        >>> model.fit(dataset, epochs=3, callbacks=[tfopt.Monitor(tensorboard=board), board])  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        logdir: str | Path | None = None,
        tensorboard: keras.callbacks.TensorBoard | None = None,
        window_seconds: float = 30.0,
        every_steps: int | None = None,
        alert_windows: int = 3,
        mfu_drop_fraction: float = 0.3,
        on_alert: Callable[[Alert], object] | None = None,
        profile_every: int | None = None,
        flops_per_step: float | None = None,
        hardware: Hardware | None = None,
        sync: Callable[[Mapping[str, Any] | None], None] = read_loss,
    ):
        super().__init__()
        if profile_every is not None and (not isinstance(profile_every, int) or profile_every < 1):
            raise RecipeConfigError(f"Monitor: profile_every={profile_every!r} must be a whole number >= 1, or None.")
        if on_alert is not None and not callable(on_alert):
            raise RecipeConfigError(f"Monitor: on_alert={on_alert!r} is not callable; pass a function taking an Alert.")
        self.logdir = _logdir(logdir, tensorboard)
        self._meter = Throughput(window_seconds=window_seconds, every_steps=every_steps, flops_per_step=flops_per_step)
        self.rules = AlertRules(alert_windows=alert_windows, mfu_drop_fraction=mfu_drop_fraction)
        self.on_alert = on_alert
        self.profile_every = profile_every
        self.hardware = hardware
        self.sync = sync
        self.records: list[dict[str, Any]] = []
        self.alerts: list[Alert] = []
        self._writer: _RecordWriter | None = None
        self._capture = ProfilerCapture()
        self._last_outputs: Mapping[str, Any] | None = None
        self._armed = False
        self._said_not_applicable = self._warned_no_window = self._said_destination = False
        self._said_uncounted = self._said_dynamic_batch = False
        # (step, count) where the last fit trained steps and left its model's step counter standing at `count` (a
        # GAN's compiled optimizer, which its train_step never applies): the next fit counts on from `step`.
        self._standing: tuple[int, int] | None = None
        self._last_one_step: tuple[Any, Any, bool, Callable[[Any], Any]] | None = None
        self._window_logs: dict[str, float] | None = None  # a window closed by this step, for its callbacks

    @property
    def flops_per_step(self) -> float | None:
        """Model FLOPs of one step: as given, else counted at the first step (accelerators only)."""
        return self._meter.flops_per_step

    @flops_per_step.setter
    def flops_per_step(self, flops: float | None) -> None:
        self._meter.flops_per_step = flops

    @property
    def window_seconds(self) -> float:
        return self._meter.window_seconds

    @property
    def every_steps(self) -> int | None:
        return self._meter.every_steps

    # --- Keras hooks (all in the training thread) ---

    def on_train_begin(self, logs: dict | None = None) -> None:
        from tfopt.profiling.peak_flops import peak_flops_per_second, precision_in_use

        stale = getattr(self.model.train_function, "tfopt_monitor", None)
        if stale is not None:  # a Monitor (this one or another) whose fit raised in a callback
            stale.close()
        if self.hardware is None:
            from tfopt.hardware import detect

            self.hardware = detect()
        if self.logdir is not None:
            self._writer = _RecordWriter(self.logdir)
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        devices = _replica_devices(self.model.distribute_strategy)
        # A strategy over CPUs on a GPU host (logical CPUs in a test, say) trains on CPUs.
        accelerator = self.hardware.accelerator if any(not name.startswith("CPU") for name in devices) else "cpu"
        self._fetch = int(getattr(self.model, "steps_per_execution", 1) or 1) == 1
        meter = self._meter
        meter.discard()
        meter.batch_size = None
        meter.measure_input_wait = self._fetch
        meter.peak_flops_per_second = (
            peak_flops_per_second(self.hardware, precision_in_use(self.model, self.hardware), devices=replicas)
            if accelerator != "cpu"
            else None
        )
        self._gpus = [name for name in devices if name.startswith("GPU")] if accelerator == "gpu" else []
        self._fetch_floor = 0.0
        self._counted = False
        self._step_on_batch: Callable[[Any], Any] | None = None  # made at the fit's first step, for its data
        self._counter = step_counter(self.model)
        self._fit_start_count = self._counter_value = int(self._counter.numpy()) if self._counter is not None else 0
        standing = self._standing is not None and self._standing[1] == self._fit_start_count
        self._step = self._fit_start_step = self._standing[0] if standing else self._fit_start_count
        self._windows_before_fit = len(self.records_of("window"))
        self._epoch_records: list[dict[str, Any]] = []
        not_applicable = {
            name: why
            for name, applies, why in (
                ("mfu_percent", meter.peak_flops_per_second is not None, "no accelerator with a known peak FLOP/s"),
                ("device_memory_peak_bytes", bool(self._gpus), "no GPU"),
                ("input_wait_percent", self._fetch, "steps_per_execution > 1 keeps the fetch in Keras' graph"),
            )
            if not applies
        }
        self._emit(
            {
                "kind": "start",
                "step": self._step,
                "accelerator": accelerator,
                "replicas": replicas,
                "not_applicable": list(not_applicable),
                "note": CPU_NOTE if accelerator == "cpu" else None,
            }
        )
        if self.logdir is None and not self._said_destination:
            self._said_destination = True
            _log.warning(
                "tfopt.Monitor: no logdir or tensorboard given, so its numbers go only to the step and epoch logs "
                "(a callback after it sees them) and to monitor.records; Monitor(tensorboard=board), with board "
                "your keras.callbacks.TensorBoard, writes them as tfopt/ scalars into its log."
            )
        if not_applicable and not self._said_not_applicable:
            self._said_not_applicable = True
            _log.info(
                "tfopt.Monitor: not measured in this run: %s.",
                "; ".join(f"{name} ({why})" for name, why in not_applicable.items()),
            )
        original = getattr(self.model.train_function, "tfopt_original", self.model.train_function)
        self.model.train_function = self._wrapped(original)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch_records = []
        # The clock stopped (and synced) where the last epoch's steps ended: the gap is in no window.
        self._meter.resume(now=time.perf_counter())

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._armed = True  # the next train-function call is a step of this Monitor's own fit

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._window_logs and logs is not None:
            logs.update(self._window_logs)
        self._window_logs = None

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._pause()  # validation inside fit: its steps are not training

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._pause()
        # An epoch whose steps closed no window (shorter than a window) shows the latest one's numbers; one before
        # any window closed shows NaN for each, so that a CSVLogger (which takes its columns from the first epoch)
        # and History keep them all.
        shown = self._epoch_records or self.records_of("window")[-1:]
        if logs is None:
            return
        if shown:
            for key in shown[0]["logs"]:
                logs[key] = statistics.fmean(record["logs"][key] for record in shown)
        else:
            names = self._meter.rate_names() + (["device_memory_peak_bytes"] if self._gpus else [])
            logs.update({PREFIX + name: math.nan for name in names})

    def on_train_end(self, logs: dict | None = None) -> None:
        self._pause()
        if self._meter.is_open and self._meter.is_worth_keeping():
            self._close_window(time.perf_counter())
        if len(self.records_of("window")) == self._windows_before_fit and not self._warned_no_window:
            self._warned_no_window = True
            size = f"every_steps={self.every_steps}" if self.every_steps else f"window_seconds={self.window_seconds}"
            _log.warning(
                "tfopt.Monitor recorded no window in this fit: it trained %d step(s), to step %d, and a "
                "window takes %s after the fit's first step (never timed); one cut short at the end "
                "counts from %d steps. Pass a smaller every_steps= to measure a run this short.",
                self._step - self._fit_start_step,
                self._step,
                size,
                MIN_WINDOW_STEPS,
            )
        if self._capture.running:
            self._stop_profile()
        counter = step_counter(self.model)
        count = int(counter.numpy()) if counter is not None else 0
        trained = self._step > self._fit_start_step
        self._standing = (self._step, count) if trained and count == self._fit_start_count else None
        self.close()

    def close(self) -> None:
        """Gives the model its own train function back, stops a running capture and closes the files.

        `on_train_end` does this. Keras calls no callback when `fit` raises, so a step that raises does it
        too, and so does the next call of the wrapped train function once this Monitor's fit is over (an
        error raised by another callback); call it yourself to do it at once. Idempotent.
        """
        model = self.model
        if model is not None and getattr(model.train_function, "tfopt_monitor", None) is self:
            model.train_function = model.train_function.tfopt_original
        self._armed = False
        self._meter.discard()
        self._last_outputs = None
        self._capture.abort()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def records_of(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind ("start", "window", "profile", "alert"), in order."""
        return [record for record in self.records if record["kind"] == kind]

    # --- the wrapped train function ---

    def _wrapped(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        import tensorflow as tf

        def train_function(iterator: Any) -> Any:
            if not self._armed:  # called outside this Monitor's fit: that fit ended without on_train_end
                self.close()
                return original(iterator)
            self._armed = False
            try:
                with self._capture.marker(self._step + 1):
                    outputs, batch, fetched = self._call(original, iterator)
                return self._after_step(outputs, batch, fetched, iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data: Keras ends the epoch, as without the Monitor
            except BaseException:
                self.close()
                raise

        train_function.tfopt_original = original
        train_function.tfopt_monitor = self
        return train_function

    def _call(self, original: Callable[[Any], Any], iterator: Any) -> tuple[Mapping[str, Any], Any, float]:
        """One call of Keras' train function as `fit` makes it, the fetch timed where the Monitor makes it.

        Returns:
            The call's outputs, the batch the Monitor fetched (None under `steps_per_execution > 1`) and
            the seconds the fetch waited; `self._step` counts on by the steps the call ran.
        """
        import tensorflow as tf

        if not self._fetch:
            outputs = original(iterator)
            self._step += self._steps_in_call()
            return outputs, None, 0.0
        if self._step_on_batch is None:
            self._step_on_batch = self._one_step(original, iterator.element_spec)
        start = time.perf_counter()
        try:
            batch = next(iterator)
        except (StopIteration, tf.errors.OutOfRangeError):
            # The end of data of unknown length. `fit` without the Monitor calls its train function on the
            # spent iterator, and that call does more than raise: without XLA, TensorFlow runs the step's
            # ops that need no batch before the fetch fails, and the optimizer's `iterations += 1` did so
            # at every such epoch's end (Keras 3.15; Adam's bias correction reads it). Keras' own call on
            # the spent iterator does here whatever it does there; the clock stops first: no step runs.
            self._pause()
            original(iterator)
            raise
        fetched = max(0.0, time.perf_counter() - start - self._fetch_floor)
        outputs = self._step_on_batch(batch)
        self._step += 1
        return outputs, batch, fetched

    def _one_step(self, original: Callable[[Any], Any], spec: Any) -> Callable[[Any], Any]:
        """Keras' one-step function for this fit: the one the last fit traced, where its train function and
        data are the same. A new trace would start the step's stateful random ops (`tf.random.uniform`) over,
        where a second `fit` without the Monitor goes on with Keras' cached train function."""
        eagerly = self.model.run_eagerly
        if self._last_one_step is not None:
            known, known_spec, known_eagerly, step = self._last_one_step
            if known is original and known_spec == spec and known_eagerly == eagerly:
                return step
        step = _keras_one_step(original, spec, eagerly=eagerly)
        self._last_one_step = (original, spec, eagerly, step)  # a recompiled model's new train function replaces it
        return step

    def _steps_in_call(self) -> int:
        """The steps the last call ran under `steps_per_execution > 1`: as many as the optimizer counted,
        for a call runs fewer where the data ends (an epoch's short last call). Where the fit's first
        call advanced no counter (a train_step applying optimizers of its own), `steps_per_execution` a
        call from then on, said once at INFO."""
        steps_per_execution = self.model.steps_per_execution
        if self._counter is None:
            return steps_per_execution
        counted = int(self._counter.numpy())  # waits for the call, as Keras does next to read its logs
        steps, self._counter_value = counted - self._counter_value, counted
        if steps or self._step > self._fit_start_step:
            return steps
        self._counter = None
        if not self._said_uncounted:
            self._said_uncounted = True
            _log.info(
                "tfopt.Monitor: the model's optimizer counted no step of this fit's first call (a train_step "
                "that applies optimizers of its own, or loss scaling that skipped every update), so each call "
                "counts as steps_per_execution=%d steps, an epoch's short last call too.",
                steps_per_execution,
            )
        return steps_per_execution

    def _after_step(self, outputs: Mapping[str, Any], batch: Any, fetched: float, iterator: Any) -> Mapping[str, Any]:
        if not self._counted:
            self._first_step(batch, iterator.element_spec)
        self._last_outputs = outputs
        if self._capture.running:
            if self._capture.count_step():
                self._stop_profile()
            return outputs
        meter = self._meter
        if not meter.is_open:  # (re)start: one sync so that the window times only its own steps
            self.sync(outputs)
            meter.open(now=time.perf_counter(), first_step=self._step + 1)
            return outputs
        meter.update(step=self._step, fetch_seconds=fetched)
        if not meter.is_due(now=time.perf_counter()):
            return outputs
        self.sync(outputs)
        now = time.perf_counter()
        record = self._close_window(now)
        # This window's closing sync opens the next one: one sync per window.
        meter.open(now=now, first_step=self._step + 1)
        if self.profile_every and len(self.records_of("window")) % self.profile_every == 0:
            self._start_profile()
        # Into the step's logs the callbacks after this one see, not the train function's outputs: Keras takes an
        # epoch's logs from its metrics only where the last step's logs name just those (under several replicas a
        # step's logs are the replicas' mean, not the epoch's).
        self._window_logs = record["logs"]
        return outputs

    def _pause(self) -> None:
        """Stops the open window's clock where training steps stop (an epoch's end), after one sync."""
        if not self._meter.is_running:
            return
        if self._meter.steps:
            self.sync(self._last_outputs)
        self._meter.pause(now=time.perf_counter())

    def _first_step(self, batch: Any, spec: Any) -> None:
        """Batch size and FLOPs from the first batch (the first step traces and is never timed).

        Under `steps_per_execution > 1` the batches stay in Keras' graph: the dataset's element spec says
        their size where it is static (`drop_remainder=True`), and the FLOPs are counted on that spec;
        otherwise examples/s and MFU are not measured, said once at INFO.
        """
        import tensorflow as tf

        from tfopt.profiling.measurement import CeilingStep, train_step_flops, train_step_function

        self._counted = True
        meter = self._meter
        strategy = self.model.distribute_strategy
        if batch is not None:
            meter.batch_size = sum(
                int(tf.shape(part)[0]) for part in strategy.experimental_local_results(tf.nest.flatten(batch)[0])
            )
            self._fetch_floor = _eager_fetch_seconds(
                tf.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], batch)
            )
        else:
            meter.batch_size = _static_batch_size(spec, strategy.num_replicas_in_sync)
            batch = spec
            unmeasured = [] if meter.batch_size else ["examples_per_second"]
            if meter.flops_per_step is None and meter.peak_flops_per_second and not _fully_static(spec):
                # cost analysis counts no FLOPs in an op of unknown dimensions
                unmeasured.append("mfu_percent")
                meter.peak_flops_per_second = None
            if unmeasured and not self._said_dynamic_batch:
                self._said_dynamic_batch = True
                _log.info(
                    "tfopt.Monitor: not measured in this fit: %s (steps_per_execution > 1 keeps the batches in "
                    "Keras' graph, and the dataset's element spec leaves their shape open: batch(..., "
                    "drop_remainder=True) fixes the batch size).",
                    ", ".join(unmeasured),
                )
        if meter.flops_per_step is None and meter.peak_flops_per_second is not None:
            step = CeilingStep(step=train_step_function(self.model), batch=batch, steps_per_call=1)
            try:
                meter.flops_per_step = train_step_flops(self.model, None, prepared=step)
            except Exception as error:  # noqa: BLE001 - a metric is lost, never the user's training
                _drop("mfu_percent", error)
                meter.peak_flops_per_second = None

    def _close_window(self, now: float) -> dict[str, Any]:
        """Ends the open window at `now`: its record, written, and the alerts it starts."""
        window = self._meter.close(now=now)
        values = dict(window.rates)
        if self._gpus:
            try:
                values["device_memory_peak_bytes"] = float(_allocator_peak_bytes(self._gpus))
            except Exception as error:  # noqa: BLE001 - a metric is lost, never the user's training
                _drop("device_memory_peak_bytes", error)
                self._gpus = []
        record = {
            "kind": "window",
            "step": window.step,
            "steps": window.steps,
            "seconds": window.seconds,
            **values,
            "logs": {PREFIX + name: value for name, value in values.items()},
        }
        self._emit(record)
        self._epoch_records.append(record)
        for alert in self.rules.check(self.records_of("window")):
            self._alert(alert)
        return record

    # --- profiler captures ---

    def _start_profile(self) -> None:
        self._meter.discard()  # the captured steps are in no window: the profiler's overhead is not timed
        self._capture.start(self.logdir, self._step)

    def _stop_profile(self) -> None:
        record = self._capture.stop(self._step, self.hardware, self.model)
        self._meter.discard()
        if record is not None:
            self._emit(record)

    # --- outputs ---

    def _emit(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._writer is not None:
            self._writer.write(record)

    def _alert(self, alert: Alert) -> None:
        self.alerts.append(alert)
        self._emit({**alert.to_dict(), "kind": "alert", "alert": alert.kind})
        _log.warning("%s", alert.message)
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            except Exception:  # noqa: BLE001 - a failing chat hook must not end a long training run
                _log.exception("tfopt.Monitor: on_alert raised; training goes on")


def _logdir(logdir: str | Path | None, tensorboard: keras.callbacks.TensorBoard | None) -> Path | None:
    """Where the Monitor writes: `logdir`, or the `train` run of a Keras TensorBoard callback, or nowhere."""
    if tensorboard is None:
        return Path(logdir) if logdir is not None else None
    if logdir is not None:
        raise RecipeConfigError(
            f"Monitor: got logdir={str(logdir)!r} and tensorboard={type(tensorboard).__name__}(log_dir="
            f"{getattr(tensorboard, 'log_dir', None)!r}); pass one: tensorboard= writes into its `train` run, "
            "logdir= anywhere else."
        )
    if not isinstance(tensorboard, keras.callbacks.TensorBoard):
        raise RecipeConfigError(
            f"Monitor: tensorboard={tensorboard!r} is not a keras.callbacks.TensorBoard; pass the TensorBoard "
            "callback of the same fit, or logdir=<directory>."
        )
    # Keras' TensorBoard callback writes its training scalars to the `train` run under its log_dir.
    return Path(tensorboard.log_dir) / "train"


class _RecordWriter:
    """Writes every record as a line of `<logdir>/monitor.jsonl`, and windows and captures as TensorBoard
    scalars at their step (under `tfopt/`, captures under `tfopt/profile/`), each flushed at once: TensorBoard
    shows a window when it closes, and a run that dies keeps it. The file is opened for each record, so one
    replaced meanwhile (a resumed run's, less the steps it trains again) gets the next."""

    def __init__(self, logdir: Path):
        import tensorflow as tf

        logdir.mkdir(parents=True, exist_ok=True)
        self._summaries = tf.summary.create_file_writer(str(logdir))
        self._jsonl = logdir / RECORDS_NAME

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps({key: value for key, value in record.items() if key != "logs"}) + "\n"
        with self._jsonl.open("a+b") as lines:
            if lines.seek(0, os.SEEK_END) and (lines.seek(-1, os.SEEK_END), lines.read(1))[1] != b"\n":
                line = "\n" + line  # after a line a killed run cut short, on a line of its own
            lines.write(line.encode("utf-8"))
        if record["kind"] not in ("window", "profile"):
            return
        prefix = PREFIX if record["kind"] == "window" else PREFIX + "profile/"
        with self._summaries.as_default():
            write_scalars(
                {
                    prefix + name: value
                    for name, value in record.items()
                    if name not in ("step", "steps", "kind") and isinstance(value, (int, float))
                },
                step=record["step"],
            )
        self._summaries.flush()

    def close(self) -> None:
        self._summaries.close()


def step_counter(model: keras.Model) -> Any | None:
    """The variable that counts the model's train steps, one per step: its optimizer's `_iterations` (the
    inner optimizer's under loss scaling), which under gradient accumulation counts the micro-batches
    where `iterations` counts updates. None without a Keras optimizer."""
    optimizer = getattr(model, "optimizer", None)
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return getattr(optimizer, "_iterations", None)


def _keras_one_step(original: Callable[[Any], Any], spec: Any, *, eagerly: bool) -> Callable[[Any], Any]:
    """Keras' own one-step function on a batch the Monitor fetched, traced once for the iterator's spec.

    Keras' train function runs its one-step function on a batch of a non-`tf.data` iterator. Called with
    concrete batches, that function would trace first for the full batch's shape and again for a short
    last batch; inside `fit`'s own graph it is traced for the iterator's spec (a batch dimension of None
    without `drop_remainder`). Fixing the spec here traces the user's train_step as `fit` does: once.
    """
    import tensorflow as tf

    def step(batch: Any) -> Any:
        return original(iter((batch,)))

    return step if eagerly else tf.function(step, input_signature=(spec,), autograph=False)


def _static_batch_size(spec: Any, replicas: int) -> int | None:
    """The global batch size an element spec fixes (its first component's leading dimension, summed over
    the replicas), or None where it is not static."""
    import tensorflow as tf

    first = tf.nest.flatten(spec)[0]
    parts = [first] if isinstance(first, tf.TensorSpec) else tf.nest.flatten(first, expand_composites=True)
    sizes = [part.shape[0] if isinstance(part, tf.TensorSpec) and part.shape.rank else None for part in parts]
    if len(sizes) != max(1, replicas) or None in sizes:
        return None
    return sum(sizes)


def _fully_static(spec: Any) -> bool:
    """Whether every tensor an element spec describes has a static shape."""
    import tensorflow as tf

    parts = tf.nest.flatten(spec, expand_composites=True)
    return all(isinstance(part, tf.TensorSpec) and part.shape.is_fully_defined() for part in parts)


def _drop(metric: str, error: BaseException) -> None:
    """Says that `metric` is not measured from here on because reading it failed."""
    _log.warning(
        "tfopt.Monitor: %s is not measured from here on: reading it failed (%s: %s).",
        metric,
        type(error).__name__,
        error,
    )


def _replica_devices(strategy: Any) -> list[str]:
    """The devices the model trains on ("GPU:0", "CPU:1", ...): a strategy's replicas, else the GPUs
    TensorFlow uses, else the CPU."""
    try:
        return [name.rsplit("device:", 1)[-1] for name in strategy.extended.worker_devices]
    except RuntimeError:  # the default strategy has no replica devices of its own
        return _visible_gpus() or ["CPU:0"]


def _visible_gpus() -> list[str]:
    """The GPUs TensorFlow uses ("GPU:0", ...): its logical devices, which `set_visible_devices` and
    `CUDA_VISIBLE_DEVICES` narrow, not the machine's physical ones."""
    import tensorflow as tf

    return [device.name.removeprefix("/device:") for device in tf.config.list_logical_devices("GPU")]


def _allocator_peak_bytes(devices: list[str]) -> int:
    """The allocator's peak since the last call, over `devices`, then reset so the next window has its own."""
    import tensorflow as tf

    peak = max(int(tf.config.experimental.get_memory_info(device)["peak"]) for device in devices)
    for device in devices:
        tf.config.experimental.reset_memory_stats(device)
    return peak


def _eager_fetch_seconds(batch: Any, calls: int = 50) -> float:
    """What one eager `next()` of a batch shaped like `batch` costs when it is already there.

    Subtracted from every timed fetch, so that the eager op's own cost (a noticeable share of a
    millisecond step: docs/monitoring.md) is not read as waiting for input. Under a strategy one
    replica's share is timed undistributed: a lower floor, so the wait errs high.
    """
    import tensorflow as tf

    iterator = iter(tf.data.Dataset.from_tensors(batch).repeat().prefetch(2))
    next(iterator)
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        next(iterator)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)
