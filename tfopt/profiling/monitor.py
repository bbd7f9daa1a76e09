"""`tfopt.Monitor`: live throughput, input wait, MFU and memory of a user's own `model.fit`, with alerts.

How it measures, and why this way:

- **No per-step sync.** The Monitor wraps the model's `train_function` for the length of `fit` and does
  all its work in the training thread, inside that wrapper. It reads the loss to the host once at each
  window's end (one device sync) and adds none in between. (Keras 3 on the TensorFlow backend reads
  every call's logs to the host itself, `pythonify_logs` in its CallbackList, whatever the callbacks:
  its thread-pool dispatch is off for TensorFlow, which it does not mark thread-safe.)
- **Input wait.** Keras 3 fetches the next batch inside its traced train function, so host time between
  callbacks never sees the wait. With `steps_per_execution=1` the wrapper fetches the batch itself
  (`next(iterator)`, timed) and hands it to Keras' own one-step function, which Keras runs for any
  iterator that is not a `tf.data` one: the same step, the fetch timed in Python. Input wait % is the
  host time blocked in that fetch over the window's wall time. On an accelerator the host may run ahead
  of the device, so a short wait can overlap device work: the profiler capture (`profile_every=`) says
  how busy the device really was. With `steps_per_execution > 1` the fetch stays in Keras' graph and
  input wait is not measured.
- **MFU** (accelerators in `peak_flops`' table): FLOPs of one step counted once, from the first batch,
  by TensorFlow's cost analysis (`measurement.train_step_flops`), times steps/s, over the devices' peak.
- **Device memory peak**: TensorFlow's allocator peak per window (GPU); it reads zeros on a CPU.
- **Windows span epochs.** A window's clock stops where an epoch's training steps end (validation's
  `on_test_begin`, else `on_epoch_end`, with one sync) and starts again at the next `on_epoch_begin`, so
  validation and epoch-end callbacks are in no window while its steps may come from several epochs: a
  window of N steps closes whatever the epoch length, 20+ short epochs included. Each `fit`'s first step
  is never timed (it traces, or reads the batches a resumed run skips); the window open at the end of
  `fit` is kept when it has `MIN_WINDOW_STEPS` steps. Steps are global: they count on from the
  optimizer's `iterations`, as Keras' TensorBoard callback does, so a resumed run goes on numbering.
- **A failed fit.** Keras 3's `fit` has no `finally`: when it raises, no callback hears of it. A step
  that raises (an error, Ctrl-C) closes the Monitor on its way out; an error raised in another callback
  is caught up with at the model's next train-function call, which finds this Monitor's fit over
  (`on_train_batch_begin` did not arm it) and closes it; `close()` does it at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import keras

from tfopt.errors import RecipeConfigError
from tfopt.hardware import Hardware
from tfopt.profiling.alerts import Alert, AlertRules
from tfopt.profiling.metrics import CPU_NOTE
from tfopt.profiling.timing import read_loss

_log = logging.getLogger("tfopt")
PREFIX = "tfopt/"
PROFILE_STEPS = 5
# A window of a step or two is noise on a shared machine: one slow fetch (a new epoch's iterator filling its
# buffer) is all of it, and three such windows in a row alert. A partial window at the end of `fit` needs
# this many steps to be kept, and `tfopt-recipe run` sizes no window below it.
MIN_WINDOW_STEPS = 3


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
        logdir: Where the TensorBoard scalars and `monitor.jsonl` go; by default the `train` run of a
            `keras.callbacks.TensorBoard` in the same `fit` call, else nowhere (`records` only).
        window_seconds: Length of a window in training time.
        every_steps: Steps per window instead (exact window sizes, e.g. for tests and short runs).
        alert_windows: Consecutive windows a condition must hold before it alerts.
        mfu_drop_fraction: An MFU below (1 - this) x the median of the run's earlier windows counts as a
            drop (0.3: 30% below).
        on_alert: Called with each `Alert` (e.g. to post to a chat).
        profile_every: Capture `PROFILE_STEPS` steps with the TF Profiler after every this many windows
            and add accelerator busy % and the diagnosis; None for no captures.
        flops_per_step: Model FLOPs of one step, where known; counted from the first batch otherwise.
        hardware: The machine (decides which metrics apply); detected at the start of training.
        sync: Waits for the device given a step's logs (the loss read by default).

    Example:
        >>> model.fit(dataset, epochs=3, callbacks=[tfopt.Monitor(logdir="logs")])  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        logdir: str | Path | None = None,
        window_seconds: float = 30.0,
        every_steps: int | None = None,
        alert_windows: int = 3,
        mfu_drop_fraction: float = 0.3,
        on_alert: Callable[[Alert], Any] | None = None,
        profile_every: int | None = None,
        flops_per_step: float | None = None,
        hardware: Hardware | None = None,
        sync: Callable[[Mapping[str, Any] | None], None] = read_loss,
    ):
        super().__init__()
        if not window_seconds > 0:
            raise RecipeConfigError(f"Monitor: window_seconds={window_seconds!r} must be > 0 (e.g. 30.0).")
        for name, value in (("every_steps", every_steps), ("profile_every", profile_every)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise RecipeConfigError(f"Monitor: {name}={value!r} must be a whole number >= 1, or None.")
        if on_alert is not None and not callable(on_alert):
            raise RecipeConfigError(f"Monitor: on_alert={on_alert!r} is not callable; pass a function taking an Alert.")
        self.logdir = Path(logdir) if logdir is not None else None
        self.window_seconds = window_seconds
        self.every_steps = every_steps
        self.rules = AlertRules(alert_windows=alert_windows, mfu_drop_fraction=mfu_drop_fraction)
        self.on_alert = on_alert
        self.profile_every = profile_every
        self.flops_per_step = flops_per_step
        self.hardware = hardware
        self.sync = sync
        self.records: list[dict[str, Any]] = []
        self.alerts: list[Alert] = []
        self._writer = self._jsonl = None
        self._window: dict[str, Any] | None = None
        self._profile_left = self._profiles = 0
        self._armed = False
        self._said_not_applicable = self._warned_no_window = False

    # --- Keras hooks (all in the training thread) ---

    def on_train_begin(self, logs: dict | None = None) -> None:
        from tfopt.profiling.peak_flops import peak_flops_per_second, precision_in_use

        stale = getattr(self.model.train_function, "tfopt_monitor", None)
        if stale is not None:  # a Monitor (this one or another) whose fit raised in a callback
            stale.close()
        if self.hardware is None:
            from tfopt.hardware import detect

            self.hardware = detect()
        self.logdir = self.logdir or _tensorboard_train_dir(self)
        if self.logdir is not None:
            import tensorflow as tf

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = tf.summary.create_file_writer(str(self.logdir))
            self._jsonl = (self.logdir / "monitor.jsonl").open("a", encoding="utf-8")
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        accelerator = self.hardware.accelerator
        self._peak = (
            peak_flops_per_second(self.hardware, precision_in_use(self.model, self.hardware), devices=replicas)
            if accelerator != "cpu"
            else None
        )
        self._gpus = _visible_gpus() if accelerator == "gpu" else []
        self._fetch = int(getattr(self.model, "steps_per_execution", 1) or 1) == 1
        self._fetch_floor = 0.0
        self._step = self._fit_start_step = int(self.model.optimizer.iterations.numpy())
        self._windows_before_fit = len(self.records_of("window"))
        self._batch_size: int | None = None
        self._window = None
        self._epoch_records: list[dict[str, Any]] = []
        not_applicable = {
            name: why
            for name, applies, why in (
                ("mfu_percent", self._peak is not None, "no accelerator with a known peak FLOP/s"),
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
        if self._window is not None and self._window["start"] is None:
            # The clock stopped (and synced) where the last epoch's steps ended: the gap is in no window.
            self._window["start"] = time.perf_counter()

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self._armed = True  # the next train-function call is a step of this Monitor's own fit

    def on_test_begin(self, logs: dict | None = None) -> None:
        self._pause()  # validation inside fit: its steps are not training

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._pause()
        # An epoch whose steps closed no window (shorter than a window) shows the latest one's numbers.
        shown = self._epoch_records or self.records_of("window")[-1:]
        if logs is not None and shown:
            for key in shown[0]["logs"]:
                logs[key] = statistics.fmean(record["logs"][key] for record in shown)

    def on_train_end(self, logs: dict | None = None) -> None:
        self._pause()
        window = self._window
        if window is not None and self._step - window["first_step"] + 1 >= MIN_WINDOW_STEPS:
            self._close_window(window["seconds"])
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
        if self._profile_left:
            self._stop_profile()
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
        self._window = self._last_outputs = None
        if self._profile_left:
            import tensorflow as tf

            self._profile_left = 0
            with contextlib.suppress(Exception):  # closing after a failure: the capture is not analysed
                tf.profiler.experimental.stop()
        for output in (self._writer, self._jsonl):
            if output is not None:
                output.close()
        self._writer = self._jsonl = None

    # --- the wrapped train function ---

    def _wrapped(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        import tensorflow as tf

        def train_function(iterator: Any) -> Any:
            if not self._armed:  # called outside this Monitor's fit: that fit ended without on_train_end
                self.close()
                return original(iterator)
            self._armed = False
            try:
                with self._marker(self._step + 1):
                    if self._fetch:
                        start = time.perf_counter()
                        batch = next(iterator)
                        fetched = max(0.0, time.perf_counter() - start - self._fetch_floor)
                        outputs = original(iter((batch,)))
                    else:
                        batch, fetched = None, 0.0
                        outputs = original(iterator)
                self._step += 1 if self._fetch else self.model.steps_per_execution
                return self._after_step(outputs, batch, fetched)
            except (StopIteration, tf.errors.OutOfRangeError):
                raise  # the end of the data: Keras ends the epoch, as without the Monitor
            except BaseException:
                self.close()
                raise

        train_function.tfopt_original = original
        train_function.tfopt_monitor = self
        return train_function

    def _marker(self, step: int) -> Any:
        if not self._profile_left:
            return contextlib.nullcontext()
        import tensorflow as tf

        return tf.profiler.experimental.Trace("train", step_num=step, _r=1)

    def _after_step(self, outputs: Any, batch: Any, fetched: float) -> Any:
        if self._batch_size is None:
            self._first_step(batch)
        self._last_outputs = outputs
        if self._profile_left:
            self._profile_left -= 1
            if not self._profile_left:
                self._stop_profile()
            return outputs
        if self._window is None:  # (re)start: one sync so that the window times only its own steps
            self.sync(outputs)
            self._window = _new_window(time.perf_counter(), self._step + 1)
            return outputs
        window = self._window
        window["fetch"] += fetched
        steps = self._step - window["first_step"] + 1
        if (
            (steps < self.every_steps)
            if self.every_steps
            else (window["seconds"] + time.perf_counter() - window["start"] < self.window_seconds)
        ):
            return outputs
        self.sync(outputs)
        now = time.perf_counter()
        record = self._close_window(window["seconds"] + now - window["start"])
        # This window's closing sync opens the next one: one sync per window.
        self._window = _new_window(now, self._step + 1)
        if self.profile_every and len(self.records_of("window")) % self.profile_every == 0:
            self._start_profile()
        return {**outputs, **record["logs"]}

    def _pause(self) -> None:
        """Stops the open window's clock where training steps stop (an epoch's end), after one sync."""
        window = self._window
        if window is None or window["start"] is None:
            return
        if self._step >= window["first_step"]:
            self.sync(self._last_outputs)
        window["seconds"] += time.perf_counter() - window["start"]
        window["start"] = None

    def _first_step(self, batch: Any) -> None:
        """Batch size and FLOPs from the first batch (the first step traces and is never timed)."""
        import tensorflow as tf

        from tfopt.profiling.measurement import CeilingStep, train_step_flops, train_step_function

        if batch is None:
            self._batch_size = 0
            return
        strategy = self.model.distribute_strategy
        self._batch_size = sum(
            int(tf.shape(part)[0]) for part in strategy.experimental_local_results(tf.nest.flatten(batch)[0])
        )
        self._fetch_floor = _eager_fetch_seconds(
            tf.nest.map_structure(lambda value: strategy.experimental_local_results(value)[0], batch)
        )
        if self.flops_per_step is None and self._peak is not None:
            step = CeilingStep(step=train_step_function(self.model), batch=batch, steps_per_call=1)
            try:
                self.flops_per_step = train_step_flops(self.model, None, prepared=step)
            except Exception as error:  # noqa: BLE001 - a metric is lost, never the user's training
                self._drop("mfu_percent", error)
                self._peak = None

    def _close_window(self, seconds: float) -> dict[str, Any]:
        """The open window's record, over its `seconds` of training."""
        window = self._window
        steps = self._step - window["first_step"] + 1
        values: dict[str, float] = {"steps_per_second": steps / seconds}
        if self._batch_size:
            values["examples_per_second"] = steps * self._batch_size / seconds
        if self._fetch:
            values["input_wait_percent"] = 100.0 * window["fetch"] / seconds
        if self.flops_per_step and self._peak:
            values["mfu_percent"] = 100.0 * self.flops_per_step * steps / seconds / self._peak
        if self._gpus:
            try:
                values["device_memory_peak_bytes"] = float(_allocator_peak_bytes(self._gpus))
            except Exception as error:  # noqa: BLE001 - a metric is lost, never the user's training
                self._drop("device_memory_peak_bytes", error)
                self._gpus = []
        record = {
            "kind": "window",
            "step": self._step,
            "steps": steps,
            "seconds": seconds,
            **values,
            "logs": {PREFIX + name: value for name, value in values.items()},
        }
        self._window = None
        self._emit(record)
        self._epoch_records.append(record)
        for alert in self.rules.check(self.records_of("window")):
            self._alert(alert)
        return record

    @staticmethod
    def _drop(metric: str, error: BaseException) -> None:
        """Says that `metric` is not measured from here on because reading it failed."""
        _log.warning(
            "tfopt.Monitor: %s is not measured from here on: reading it failed (%s: %s).",
            metric,
            type(error).__name__,
            error,
        )

    # --- profiler captures ---

    def _start_profile(self) -> None:
        import tensorflow as tf

        self._window = None  # the captured steps are in no window: the profiler's overhead is not timed
        self._profiles += 1
        self._profile_dir = (self.logdir or Path(_temporary_dir())) / f"tfopt-profile-{self._profiles}"
        try:
            tf.profiler.experimental.start(str(self._profile_dir))
        except Exception as error:  # noqa: BLE001 - another profiler may hold the process (TensorBoard's)
            _log.warning("tfopt.Monitor: no profile captured at step %d: %s", self._step, error)
            return
        self._profile_left = PROFILE_STEPS

    def _stop_profile(self) -> None:
        import tensorflow as tf

        from tfopt.profiling.analyze import analyze, find_xplane
        from tfopt.profiling.diagnose import diagnose_breakdown, refine_diagnosis
        from tfopt.profiling.hotspots import find_hotspots

        tf.profiler.experimental.stop()
        self._profile_left = 0
        self._window = None
        try:
            breakdown = analyze(self._profile_dir)
        except Exception as error:  # noqa: BLE001 - a capture that cannot be read must not stop training
            _log.warning("tfopt.Monitor: the capture in %s could not be analysed: %s", self._profile_dir, error)
            return
        hotspots = find_hotspots(
            find_xplane(self._profile_dir), self.hardware, model=self.model, step_seconds=breakdown.step_seconds_mean
        )
        diagnosis = refine_diagnosis(diagnose_breakdown(breakdown, self.hardware), hotspots)
        stages, layers = hotspots.stages, hotspots.layers
        self._emit(
            {
                "kind": "profile",
                "step": self._step,
                "path": str(self._profile_dir),
                "busy_percent": breakdown.busy_percent,
                "input_wait_percent": breakdown.input_percent,
                "step_seconds": breakdown.step_seconds_mean,
                "bottlenecks": list(diagnosis.bottlenecks),
                "diagnosis": diagnosis.summary,
                "top_stage": stages.bottleneck.label if stages and stages.bottleneck else None,
                "top_stage_seconds_per_batch": (
                    stages.bottleneck.bound_seconds_per_batch if stages and stages.bottleneck else None
                ),
                "top_layer": layers.top.layer if layers and layers.top else None,
                "top_layer_seconds_per_step": layers.top.seconds_per_step if layers and layers.top else None,
            }
        )

    # --- outputs ---

    def records_of(self, kind: str) -> list[dict[str, Any]]:
        """The records of one kind ("start", "window", "profile", "alert"), in order."""
        return [record for record in self.records if record["kind"] == kind]

    def _emit(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({key: value for key, value in record.items() if key != "logs"}) + "\n")
            self._jsonl.flush()
        if self._writer is not None and record["kind"] in ("window", "profile"):
            prefix = PREFIX if record["kind"] == "window" else PREFIX + "profile/"
            _write_scalars(
                self._writer,
                record["step"],
                {
                    prefix + name: value
                    for name, value in record.items()
                    if name not in ("step", "steps", "kind") and isinstance(value, (int, float))
                },
            )
            # Live: TensorBoard shows a window when it closes, and a run that dies keeps it.
            self._writer.flush()

    def _alert(self, alert: Alert) -> None:
        self.alerts.append(alert)
        self._emit({"kind": "alert", **alert.to_dict()})
        _log.warning("%s", alert.message)
        if self.on_alert is not None:
            try:
                self.on_alert(alert)
            except Exception:  # noqa: BLE001 - a failing chat hook must not end a long training run
                _log.exception("tfopt.Monitor: on_alert raised; training goes on")


def _new_window(start: float, first_step: int) -> dict[str, Any]:
    """A window whose clock runs from `start`; `seconds` holds its training time before a pause."""
    return {"start": start, "seconds": 0.0, "first_step": first_step, "fetch": 0.0}


def _write_scalars(writer: Any, step: int, values: Mapping[str, float]) -> None:
    """Writes TensorBoard scalars, as `tf.summary.scalar` would, in one summary: one eager op per window
    instead of one per scalar (0.16 ms against 0.86 ms for four, measured on CPU: AMD EPYC, 2 cores with
    bf16 instructions (no GPU or TPU)), which a window every few short steps would feel."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    summary = summary_pb2.Summary(
        value=[
            summary_pb2.Summary.Value(
                tag=tag, tensor=tf.make_tensor_proto(float(value), dtype=tf.float32), metadata=metadata
            )
            for tag, value in values.items()
        ]
    )
    with writer.as_default():
        tf.summary.experimental.write_raw_pb(summary.SerializeToString(), step=step)


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

    Subtracted from every timed fetch, so that the eager op's own cost (0.12-0.15 ms for an (x, y)
    batch of 32, measured on CPU: AMD EPYC, 2 cores with bf16 instructions (no GPU or TPU): a seventh of
    a 1 ms step) is not read as waiting for input. Under a strategy one replica's share is timed
    undistributed: a lower floor, so the wait errs high.
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


def _tensorboard_train_dir(monitor: Monitor) -> Path | None:
    """The `train` run of a `keras.callbacks.TensorBoard` in the same `fit` call, or None.

    Keras gives a callback no handle on its siblings; the `CallbackList` calling `on_train_begin` is
    the caller's `self` a few frames up, so it is looked up there (and only there).
    """
    import inspect

    frame = inspect.currentframe()
    for _ in range(6):
        frame = frame.f_back if frame is not None else None
        owner = frame.f_locals.get("self") if frame is not None else None
        if isinstance(owner, keras.callbacks.CallbackList) and monitor in owner.callbacks:
            for callback in owner.callbacks:
                if isinstance(callback, keras.callbacks.TensorBoard):
                    return Path(callback.log_dir) / "train"
            return None
    return None


def _temporary_dir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="tfopt-monitor-")
