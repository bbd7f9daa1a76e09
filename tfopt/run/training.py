"""Training a run's optimized model: resumable in one process, `tfopt.distribute.fit` across processes.

One process (any single-process strategy) trains with `tfopt.training.train`: checkpoints every
`train.checkpoint_every_steps` steps and at epoch ends, a killed run resumes mid-epoch, and a NaN/Inf
loss stops with `NonFiniteLossError`. Several processes (multi-worker, Horovod) train with
`tfopt.distribute.fit`, because Keras 3's `model.fit` fails under MultiWorkerMirroredStrategy
(keras-team/keras#20585) and `train()` is built on `model.fit`; its checkpoints are per epoch, so a
restarted cluster resumes from the last completed epoch. The NaN guard runs in both.

Training in one process runs under `tfopt.Monitor`: about `WINDOWS_PER_RUN` windows over the run, each
window's scalars beside the epoch scalars with its record in `monitor.jsonl`, and all in `training.json`.

Only the chief writes: TensorBoard scalars, `monitor.jsonl`, `training.json`, and the kept checkpoints (the
other workers' copies go to temporary directories that `distribute.fit` removes). In one process
`training.json` is written at every epoch end too (`"complete": false` until training ends), so a run
killed and resumed keeps the epochs of every attempt: the resumed record takes the earlier attempts'
epochs and windows up to the checkpoint it resumed from, then its own.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import TYPE_CHECKING, Any

from tfopt.errors import TfoptError, describe_error, released
from tfopt.run.directory import CHECKPOINTS_NAME, TRAINING_NAME

if TYPE_CHECKING:
    import keras

    from tfopt.builder import Built
    from tfopt.profiling.monitor import Monitor
    from tfopt.recipe_file.loader import RecipeFile
    from tfopt.recipe_file.schema import TrainSection

MULTI_PROCESS_STRATEGIES = ("multi_worker", "horovod")
# The Monitor's windows over a run of known length: a curve in the report, not one point per step.
WINDOWS_PER_RUN = 20


def train_model(
    built: Built,
    recipe: RecipeFile,
    run_dir: pathlib.Path,
    callbacks: list[keras.callbacks.Callback],
    *,
    tensorboard_dir: pathlib.Path,
    chief: bool = True,
) -> dict[str, Any]:
    """Trains `built` for the recipe's epochs and returns what was trained (also saved as training.json).

    Args:
        built: The optimized model, dataset and strategy.
        recipe: The resolved recipe (its `train:` section).
        run_dir: The run directory; checkpoints go to `<run_dir>/checkpoints`.
        callbacks: The caller's own callbacks (progress bars), after tfopt's.
        tensorboard_dir: Where the epoch scalars go (`<dir>/train`), and the Monitor's scalars and
            `monitor.jsonl`.
        chief: Whether this process writes the run's files.

    Returns:
        engine ("tfopt.training.train" or "tfopt.distribute.fit"), history, global_step,
        resumed_from_step, steps_per_epoch and last_checkpoint; with `tfopt.training.train`, also
        monitor: the `tfopt.Monitor` window records (step, steps, seconds, steps_per_second, and
        examples_per_second, input_wait_percent, mfu_percent, device_memory_peak_bytes where measured).

    Raises:
        NonFiniteLossError: The loss went NaN/Inf; the message names the step and the last good checkpoint.
        TfoptError: Training raised anything else (one paragraph with its cause).
        Either message ends with where the Monitor's windows recorded before the failure are
        (`monitor.jsonl`), when there are any.
    """
    train = recipe.train
    callbacks = [scalar_summaries(tensorboard_dir / "train"), *callbacks] if chief else list(callbacks)
    checkpoints = run_dir / CHECKPOINTS_NAME
    monitor = None
    try:
        if built.plan.strategy in MULTI_PROCESS_STRATEGIES:
            # tfopt.distribute.fit runs its own step loop, which the Monitor (it wraps Keras' train
            # function) cannot time.
            record = _distributed(built, train, checkpoints, callbacks)
        else:
            from tfopt.training import train as resumable_train

            monitor = _monitor(built, train, tensorboard_dir / "train" if chief else None)
            records = _epoch_records(run_dir / TRAINING_NAME, monitor)
            result = resumable_train(
                built,
                epochs=train.epochs,
                steps_per_epoch=train.steps_per_epoch,
                checkpoint_dir=checkpoints,
                checkpoint_every_steps=train.checkpoint_every_steps,
                callbacks=[monitor, *callbacks, *([records] if chief else [])],
            )
            record = records.whole({"engine": "tfopt.training.train", **result.to_dict()})
    except TfoptError as error:
        error.args = (f"{error}{_windows_kept(monitor)}",)
        raise
    except Exception as error:  # noqa: BLE001 - raised again as a tfopt error, in words
        raise TfoptError(f"Training failed: {describe_error(error)}{_windows_kept(monitor)}") from released(error)
    finally:
        if monitor is not None:
            monitor.close()  # Keras ends no callback when fit raises; after a normal end it does nothing
    if chief:
        from tfopt._atomic import write_atomic

        record = {**record, "complete": True}
        write_atomic(run_dir / TRAINING_NAME, json.dumps(record, indent=2) + "\n")
    return record


def _windows(monitor: Monitor) -> list[dict[str, Any]]:
    """The Monitor's window records as training.json keeps them."""
    return [
        {key: value for key, value in window.items() if key not in ("kind", "logs")}
        for window in monitor.records_of("window")
    ]


def _epoch_records(path: pathlib.Path, monitor: Monitor | None) -> keras.callbacks.Callback:
    """A Keras callback keeping the run's whole record: the earlier attempts' epochs and Monitor windows up
    to where this attempt starts (what came after was trained again), then this attempt's. The chief
    adds it to training, and it writes training.json at every epoch end (`"complete": false`), so a killed
    run's record survives it; `whole(record)` is the record of a finished attempt."""
    import keras

    from tfopt._atomic import write_atomic

    earlier = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}

    class EpochRecords(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.history: dict[str, list[float]] = earlier.get("history", {})
            self.windows: list[dict[str, Any]] = earlier.get("monitor", [])
            self.started = False

        def on_train_begin(self, logs: dict | None = None) -> None:
            if not self.started:  # the first fit() of this attempt starts at the restored step, as numbered
                from tfopt.profiling.monitor import RECORDS_NAME, step_counter  # as the Monitor counts (micro-batches)

                counter = step_counter(self.model)
                start = int(counter.numpy()) if counter is not None else 0
                self.windows = [window for window in self.windows if window["step"] <= start]
                if monitor is not None and monitor.logdir is not None:
                    _keep_records_to(monitor.logdir / RECORDS_NAME, start)

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            if not self.started:  # Keras numbers epochs from initial_epoch: the run's own count
                self.started = True
                self.history = {key: list(values[:epoch]) for key, values in self.history.items()}

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            from tfopt.profiling.monitor import PREFIX

            for key, value in (logs or {}).items():
                # The Monitor's numbers are kept per window; their epoch mean (NaN before the first) is not JSON.
                if not key.startswith(PREFIX):
                    self.history.setdefault(key, []).append(float(value))
            record = {
                "engine": "tfopt.training.train",
                "complete": False,
                "epochs_done": epoch + 1,
                "global_step": int(self.model.optimizer.iterations.numpy()),
            }
            write_atomic(path, json.dumps(self.whole(record), indent=2) + "\n")

        def whole(self, record: dict[str, Any]) -> dict[str, Any]:
            """`record` with every attempt's epochs and windows. Where no epoch ran here (nothing was left
            to train, or the callback was not given to training) the earlier record stands as it was."""
            history = self.history if self.started or self.history else record.get("history", {})
            return {**record, "history": history, "monitor": [*self.windows, *_windows(monitor)]}

    return EpochRecords()


def _keep_records_to(path: pathlib.Path, step: int) -> None:
    """Drops the Monitor's records past `step` from `path`: an earlier attempt's, of the steps this one
    trains again, so that each step's window is in the file once, as in training.json. A line a kill cut
    short goes too."""
    from tfopt._atomic import write_atomic

    lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.is_file() else []
    kept = [line for line, at in ((line, _record_step(line)) for line in lines) if at is not None and at <= step]
    if len(kept) < len(lines):
        write_atomic(path, "".join(kept))


def _record_step(line: str) -> int | None:
    """The step of one of the Monitor's records, or None for a line that is none (cut short by a kill)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None


def _monitor(built: Built, train: TrainSection, logdir: pathlib.Path | None) -> Monitor:
    """A `tfopt.Monitor` for the run's training: about `WINDOWS_PER_RUN` windows where the run's length is
    known, never under `MIN_WINDOW_STEPS` steps each, else its 30-second windows. It writes to `logdir`
    (beside the epoch scalars), or nowhere (None: not the chief)."""
    from tfopt.profiling.monitor import MIN_WINDOW_STEPS, Monitor

    # In Keras steps, as the Monitor counts them: micro-batches where the batch did not fit.
    steps = (train.steps_per_epoch or 0) * built.plan.micro_batches or (
        len(built.dataset) if int(built.dataset.cardinality()) > 0 else None
    )
    every_steps = max(MIN_WINDOW_STEPS, steps * train.epochs // WINDOWS_PER_RUN) if steps else None
    return Monitor(logdir=logdir, every_steps=every_steps, hardware=built.plan.hardware)


def _windows_kept(monitor: Monitor | None) -> str:
    """A failure message's pointer to the Monitor's windows recorded before it ('' where none was written)."""
    windows = monitor.records_of("window") if monitor is not None and monitor.logdir is not None else []
    if not windows:
        return ""
    from tfopt.profiling.monitor import RECORDS_NAME

    return (
        f" The {len(windows)} tfopt.Monitor window(s) recorded before it, to step {windows[-1]['step']}, "
        f"are in {monitor.logdir / RECORDS_NAME}."
    )


def _distributed(
    built: Built, train: TrainSection, checkpoints: pathlib.Path, callbacks: list[keras.callbacks.Callback]
) -> dict[str, Any]:
    from tfopt.distribute import fit
    from tfopt.training import NonFiniteLossGuard
    from tfopt.training.fit import as_stream

    model = built.model
    counted = _steps_counted()
    history = fit(
        model,
        # Epochs of steps_per_epoch steps read one stream, as on one process (tfopt.training.train).
        as_stream(built.dataset) if train.steps_per_epoch else built.dataset,
        strategy=built.strategy,
        epochs=train.epochs,
        steps_per_epoch=train.steps_per_epoch,
        callbacks=[NonFiniteLossGuard(), counted, *callbacks],
        checkpoint_dir=checkpoints,
        verbose=0,
    )
    resumed_from_epoch = history.epoch[0] if history.epoch else train.epochs
    # Steps, not `optimizer.iterations`: a GAN's train_step steps optimizers of its own. Epochs restored from a
    # checkpoint ran `steps_per_epoch` steps each, or, where epochs are passes over the data, as many as these.
    per_epoch = train.steps_per_epoch or (counted.steps // len(history.epoch) if history.epoch else None)
    # Nothing left to train, epochs of unknown length: the optimizer's count, where it counts steps.
    global_step = model.optimizer.iterations.numpy() if per_epoch is None else resumed_from_epoch * per_epoch
    return {
        "engine": "tfopt.distribute.fit",
        "epochs": train.epochs,
        "steps_per_epoch": train.steps_per_epoch,
        "history": {key: [float(value) for value in values] for key, values in history.history.items()},
        "resumed_from_epoch": resumed_from_epoch,
        "global_step": int(global_step) + counted.steps,
        "replicas": int(built.strategy.num_replicas_in_sync),
        "last_checkpoint": os.fspath(checkpoints),
    }


def _steps_counted() -> keras.callbacks.Callback:
    """A Keras callback counting the training steps it sees end (`.steps`)."""
    import keras

    class StepsCounted(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.steps += 1

    return StepsCounted()


def scalar_summaries(directory: pathlib.Path) -> keras.callbacks.Callback:
    """A Keras callback writing each epoch's metrics as TensorBoard scalars, with TensorFlow alone.

    Not `keras.callbacks.TensorBoard`: it needs the `tensorboard` package, which TensorFlow 2.21 no longer
    installs (`tfopt.profiling.scalars`).
    """
    import keras
    import tensorflow as tf

    from tfopt.profiling.scalars import write_scalars

    class ScalarSummaries(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.writer = tf.summary.create_file_writer(os.fspath(directory))

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            with self.writer.as_default():
                write_scalars({f"epoch_{name}": value for name, value in (logs or {}).items()}, step=epoch)
            self.writer.flush()

        def on_train_end(self, logs: dict | None = None) -> None:
            self.writer.flush()  # not closed: a resumed run calls fit() twice (rest of an epoch, then the others)

    return ScalarSummaries()
