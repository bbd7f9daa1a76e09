"""Checkpoints that let a killed run resume where it stopped, losing at most the steps since the last one.

Keras' `BackupAndRestore` is not enough here: it restores the weights saved mid-epoch, but then replays
that epoch from its first batch (it records the batch but never uses it), so a run killed mid-epoch and
restarted trains more steps than asked and sees some batches twice. tfopt therefore saves the model,
the optimizer (moments, iteration count, gradient accumulators) and the global step with
`tf.train.CheckpointManager`, and `train()` skips the batches already trained on when it resumes.

Why these checkpoints survive a kill at any moment: TensorFlow writes a checkpoint's files first and
only then rewrites the small `checkpoint` state file, atomically (`atomic_write_string_to_file`); with
asynchronous writing the state file is updated by a callback after the background write finished. A
kill mid-write therefore leaves the previous checkpoint as the latest one. Every checkpoint gets a new
name (`ckpt-<global step>`), so no complete checkpoint is ever overwritten in place.

A write that fails (a full disk, a quota) stops training with a `CheckpointWriteError` that names the
directory and the newest complete checkpoint, which stays the one a resumed run starts from; the partial
files TensorFlow leaves (a `ckpt-<step>_temp` directory) are removed, then and when a run starts on the
directory. An asynchronous write's failure would otherwise only show at the next save, or be printed and
ignored at exit: `sync()` raises it.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil

import keras

from tfopt.errors import CheckpointWriteError, DataError, IncompatibleModelError, describe_error, released
from tfopt.training.guards import check_finite_weights
from tfopt.training.optimizer_build import build_as_fit_does

_log = logging.getLogger("tfopt")


class TrainingCheckpoint:
    """The model, its optimizer and the training position, saved to and restored from one directory.

    Args:
        directory: Where checkpoints go; one run per directory.
        model: A compiled Keras model; its optimizer is built here (in the model's strategy scope) if it
            is not yet, so its variables exist to be restored into. Its variables (weights and
            seed-generator states) and the optimizer's are saved in order, so the same architecture built
            afresh restores them.
        steps_per_epoch: Steps in one epoch, stored so a resumed run with other epochs is caught.
        keep: How many of the newest checkpoints to keep (older ones are deleted after a new one is
            complete).
        async_write: Write checkpoint files in a background thread (the values are copied first, so
            training may change the weights meanwhile).

    Example:
        >>> import keras, tempfile
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> checkpoint = TrainingCheckpoint(tempfile.mkdtemp(), model, steps_per_epoch=10)
        >>> checkpoint.restore() is None  # an empty directory: start from step 0
        True
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        model: keras.Model,
        *,
        steps_per_epoch: int,
        keep: int = 3,
        async_write: bool = True,
    ):
        import tensorflow as tf

        if keep < 1:
            raise DataError(f"keep_checkpoints must be at least 1; received {keep}.")
        self.directory = os.fspath(directory)
        self.model = model
        self.steps_per_epoch = steps_per_epoch
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            build_as_fit_does(optimizer, model)
        # Plain CPU variables: the position is host bookkeeping, not state to mirror across replicas.
        with tf.device("/cpu:0"):
            self._global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self._steps_per_epoch = tf.Variable(
                steps_per_epoch, dtype=tf.int64, trainable=False, name="steps_per_epoch"
            )
        # The TensorFlow variables under the Keras ones, in order, rather than the Keras objects: TF's
        # asynchronous checkpointing fails from the second save on with Keras 3 variables
        # (KerasVariable._copy_trackable_to_cpu creates a tf.Variable inside TF's traced copy function:
        # "tf.function only supports singleton tf.Variables"); plain ones work. Keras paths cannot be the
        # keys: Keras makes names unique per process (dense_3 in a second model), so they change.
        self._checkpoint = tf.train.Checkpoint(
            model_variables=[v.value for v in model.variables],
            optimizer_variables=[v.value for v in optimizer.variables],
            global_step=self._global_step,
            steps_per_epoch=self._steps_per_epoch,
        )
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self.directory, max_to_keep=keep, checkpoint_name="ckpt"
        )
        self._options = tf.train.CheckpointOptions(enable_async=async_write)
        self._async = async_write
        self._last_saved_step: int | None = None
        self._remove_partial_writes()  # of a run killed while it wrote

    @property
    def latest_path(self) -> str | None:
        """The newest complete checkpoint (an async write in progress is not complete yet)."""
        return self._manager.latest_checkpoint

    def restore(self) -> int | None:
        """Loads the newest readable checkpoint into the model and optimizer.

        A checkpoint whose files were damaged after it was written (a copy cut short, a full disk) is
        skipped with a warning for the next newest one, so a run loses the steps since that one rather
        than all of them.

        Returns:
            The global step it was written at, or None where the directory holds no checkpoint.

        Raises:
            IncompatibleModelError: The checkpoint was written by a different model or optimizer.
            DataError: It was written with another number of steps per epoch, so the position in the
                data cannot be recovered; or every checkpoint in the directory is damaged.
        """
        damaged = []
        for path in reversed(self._manager.checkpoints):  # newest first
            try:
                # A shape mismatch raises ValueError during restore; a missing variable fails the assertion.
                self._checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
            except (AssertionError, ValueError) as error:
                raise IncompatibleModelError(
                    f"The checkpoint {path} does not match this model and optimizer ({error}). It was written by "
                    "a different model: train with a new checkpoint_dir, or delete the old one to start over."
                ) from error
            except Exception as error:  # noqa: BLE001 - whatever a damaged file raises (DataLossError, IndexError)
                damaged.append(f"{os.path.basename(path)} ({describe_error(error)})")
                _log.warning(
                    "The checkpoint %s is damaged (%s); trying the one before it.", path, describe_error(error)
                )
                continue
            if damaged:
                _log.warning("Resuming from %s: the newer %s could not be read.", path, ", ".join(damaged))
            break
        else:
            if damaged:
                raise DataError(
                    f"Every checkpoint in {self.directory} is damaged: {'; '.join(damaged)}. Delete "
                    "them to train from the start, or restore the directory from a copy."
                )
            return None
        saved_steps_per_epoch = int(self._steps_per_epoch.numpy())
        self._steps_per_epoch.assign(self.steps_per_epoch)
        if saved_steps_per_epoch != self.steps_per_epoch:
            raise DataError(
                f"The checkpoint {path} was written with steps_per_epoch={saved_steps_per_epoch}; this run has "
                f"steps_per_epoch={self.steps_per_epoch}, so where to resume in the data is unknown. Resume "
                "with the same dataset and steps_per_epoch, or use a new checkpoint_dir."
            )
        step = int(self._global_step.numpy())
        self._last_saved_step = step
        _log.info("Resumed from %s at global step %d.", path, step)
        return step

    def save(self, global_step: int) -> None:
        """Writes a checkpoint of the current state at `global_step` (once per step).

        Raises:
            NonFiniteLossError: A weight is NaN or Inf; nothing is written, so the previous checkpoint
                stays the newest good one.
        """
        if global_step == self._last_saved_step:
            return
        check_finite_weights(self.model, step=global_step)  # nothing is written from broken weights
        self._global_step.assign(global_step)
        try:
            self._manager.save(checkpoint_number=global_step, options=self._options)
        except Exception as error:  # noqa: BLE001 - raised again in words (an earlier asynchronous write's, too)
            self.sync()
            raise self._not_written(error) from released(error)
        self._last_saved_step = global_step

    def sync(self) -> None:
        """Waits until an asynchronous write has finished, so `latest_path` is final.

        Raises:
            CheckpointWriteError: That write failed.
        """
        if not self._async:
            return
        self._checkpoint.sync()
        # TensorFlow keeps a background write's error for its next save, or prints and ignores it at exit.
        helper = getattr(self._checkpoint, "_async_checkpointer_impl", None)
        error = getattr(helper, "_async_error", None)
        if error is not None:
            helper._async_error = None
            raise self._not_written(error) from error

    def _not_written(self, error: BaseException) -> CheckpointWriteError:
        """The error that says a write failed, once its partial files are gone."""
        self._remove_partial_writes()
        latest = self._manager.latest_checkpoint
        kept = (
            f"the newest complete checkpoint, {latest}, is kept and a resumed run starts from it"
            if latest
            else "no checkpoint had been written yet"
        )
        return CheckpointWriteError(
            f"Writing a checkpoint to {self.directory} failed ({describe_error(error)}): {kept}. Training stopped "
            "rather than go on unsaved: free space on that disk (or choose another checkpoint directory) and "
            "train again with the same directory to resume."
        )

    def _remove_partial_writes(self) -> None:
        """Removes what TensorFlow leaves of a write that failed or was killed (`<prefix>_temp` directories)."""
        for partial in pathlib.Path(self.directory).glob("ckpt-*_temp"):
            shutil.rmtree(partial, ignore_errors=True)


class CheckpointCallback(keras.callbacks.Callback):
    """Saves a `TrainingCheckpoint` every `every_steps` global steps and at every epoch end.

    Args:
        checkpoint: Where to save.
        every_steps: Interval in global steps.
        steps_done: Global steps trained before this `fit()` call.
        micro_batches: Keras steps per global step (`tfopt.training.micro_batches`): saved only where an
            update ends, for a micro-batch's accumulated gradients are in no checkpoint.

    Example:
        >>> checkpoint = TrainingCheckpoint(model, "run/ckpt")  # doctest: +SKIP
        >>> model.fit(dataset, epochs=3, callbacks=[CheckpointCallback(checkpoint, every_steps=100)])  # doctest: +SKIP
    """

    def __init__(
        self, checkpoint: TrainingCheckpoint, *, every_steps: int, steps_done: int = 0, micro_batches: int = 1
    ):
        super().__init__()
        self.checkpoint = checkpoint
        self.every_steps = every_steps
        self.micro_batches = micro_batches
        self._epoch_base = steps_done
        self._step = steps_done
        self._steps_done = steps_done
        self._iterations_at_start: int | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        optimizer = _counting_optimizer(self.model)
        self._iterations_at_start = None if optimizer is None else int(optimizer.iterations.numpy())

    def save_where_stopped(self) -> bool:
        """Saves the steps trained when training was interrupted (a signal raised between two Python lines
        of Keras' loop), where the optimizer says which step the weights are at: one update per step (see
        `_counting_optimizer`), so the steps since `fit` began, as this callback counted them or one more
        whose end it did not see yet. Returns whether it saved."""
        optimizer = _counting_optimizer(self.model)
        if optimizer is None or self._iterations_at_start is None:
            return False
        step = self._steps_done + int(optimizer.iterations.numpy()) - self._iterations_at_start
        if step not in (self._step, self._step + 1):
            return False
        self.checkpoint.save(step)
        return True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if (batch + 1) % self.micro_batches:
            return  # within an update: its micro-batches' gradients are not applied yet
        previous, self._step = self._step, self._epoch_base + (batch + 1) // self.micro_batches
        # steps_per_execution may run several steps per call: save when an interval boundary was crossed.
        crossed_interval = self._step // self.every_steps > previous // self.every_steps
        if crossed_interval or self._step % self.checkpoint.steps_per_epoch == 0:
            self.checkpoint.save(self._step)

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self._epoch_base = self._step


def _counting_optimizer(model: keras.Model) -> keras.optimizers.Optimizer | None:
    """The model's optimizer where its `iterations` counts the training's steps one for one: Keras' own
    train_step, one step per execution, no loss scaling (it skips the updates of non-finite steps) and no
    gradient accumulation (it counts updates). Else None: a GAN's own train_step applies optimizers of its
    own, and what the others count cannot tell a step that ran from one that did not."""
    optimizer = getattr(model, "optimizer", None)
    plain = (
        isinstance(optimizer, keras.optimizers.Optimizer)
        and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and not optimizer.gradient_accumulation_steps
    )
    own_step = type(model).train_step is keras.Model.train_step
    return optimizer if plain and own_step and int(getattr(model, "steps_per_execution", 1) or 1) == 1 else None
