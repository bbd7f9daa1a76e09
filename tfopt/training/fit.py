"""`train()`: run `model.fit` on a built plan so that a killed run resumes and a diverging one stops.

Used by `tfopt-recipe run` (`tfopt.run.training`). With a `checkpoint_dir`, the run is
saved every `checkpoint_every_steps` steps; started again with the same directory, it restores the
newest checkpoint and skips the batches already trained on, so it ends after exactly the steps an
uninterrupted run takes. With or without checkpoints, a NaN or Inf loss (checked every step) or weight
(checked before the first step, at every epoch end and before every checkpoint) raises
`NonFiniteLossError`, and no checkpoint is ever written from weights that hold one.

Two data modes keep the position in the data exact:

* one pass per epoch (no `steps_per_epoch`): a finite dataset, read by `fit` as `dataset.repeat()` with
  `steps_per_epoch` = its length, so each epoch is one whole pass; a resumed epoch starts at
  `dataset.skip(steps already done in it)`.
* a stream (`steps_per_epoch` given): the dataset is repeated if finite and read as one stream across
  epochs, as Keras does for an infinite dataset; a resumed run starts at `stream.skip(global step)`.

Either way one `fit` call reads all its epochs from one iterator. Given a finite dataset, Keras makes a
new iterator per epoch and keeps the previous one alive into the next epoch, and with tf.data's
autotuning on (its default) the two iterators compete for the cores: some epochs train at a fraction of
the speed (`benchmarks/data_pipeline.py` measures it); one iterator for all epochs does not.

Resuming exactly needs a dataset whose order does not change between passes. A tf.data shuffle with
`reshuffle_each_iteration=True` (seeded or not) draws a new order for every iterator made on it, and a
restarted process makes a different number of them before training (it skips the measurements), so
the rest of a resumed epoch comes from another order: some of that epoch's examples are seen twice and
others not at all (later epochs are whole). The step count and the weights' continuity are exact either
way. `skip()` reads the skipped batches, so resuming late in a long epoch costs that reading time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tfopt.errors import DataError, NonFiniteLossError, describe_error
from tfopt.training.calls import steps_per_call, whole_calls
from tfopt.training.checkpointing import CheckpointCallback, TrainingCheckpoint
from tfopt.training.guards import NonFiniteLossGuard
from tfopt.training.stopping import StopAtStepEnd, stops_at_step_ends

if TYPE_CHECKING:
    import tensorflow as tf

    from tfopt.builder import Built

_log = logging.getLogger("tfopt")


@dataclasses.dataclass(frozen=True)
class TrainingResult:
    """What a `train()` call did.

    Attributes:
        history: Keras' per-epoch logs of this call (a resumed epoch's values cover its remaining steps).
        epochs: The epochs asked for.
        steps_per_epoch: Steps in each epoch.
        resumed_from_step: The global step restored from a checkpoint, or 0 for a fresh start.
        steps_run: Steps trained by this call.
        global_step: Steps trained in total, over all calls on this checkpoint directory.
        last_checkpoint: The newest checkpoint, or None without a checkpoint_dir.

    Example:
        >>> result = tfopt.training.train(built, epochs=2, checkpoint_dir="run/ckpt")  # doctest: +SKIP
        >>> result.global_step, result.history["loss"]  # doctest: +SKIP
    """

    history: dict[str, list[float]]
    epochs: int
    steps_per_epoch: int
    resumed_from_step: int
    steps_run: int
    global_step: int
    last_checkpoint: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def train(
    built: Built,
    *,
    epochs: int,
    steps_per_epoch: int | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every_steps: int = 100,
    keep_checkpoints: int = 3,
    async_checkpoint: bool = True,
    callbacks: Sequence[Any] = (),
    validation_data: Any = None,
    verbose: int | str = 0,
) -> TrainingResult:
    """Trains a built plan for `epochs`, resuming from `checkpoint_dir` and stopping on a NaN/Inf loss.

    Args:
        built: The result of `tfopt.builder.build(plan)` (model, dataset, strategy).
        epochs: Total epochs, counting those done before a restart.
        steps_per_epoch: Steps per epoch; None means one pass over the (finite) dataset.
        checkpoint_dir: Where to save and resume from, or None for no checkpoints.
        checkpoint_every_steps: Interval between checkpoints in steps; a kill loses at most this many
            steps (plus one being written). Checkpoints are also written at every epoch end.
        keep_checkpoints: How many of the newest checkpoints to keep.
        async_checkpoint: Write checkpoints in a background thread while training continues.
        callbacks: More Keras callbacks, run after the NaN guard and before the checkpoint.
        validation_data: Passed to `model.fit`.
        verbose: Passed to `model.fit`.

    Returns:
        What was trained, and where the newest checkpoint is.

    Raises:
        NonFiniteLossError: The loss (or a weight) became NaN or Inf; the message names the step and
            the last good checkpoint.
        DataError: The arguments are out of range, or the dataset's length is needed and unknown.
        IncompatibleModelError: `checkpoint_dir` holds a checkpoint of another model.

    Example:
        >>> from tfopt.builder import build  # doctest: +SKIP
        >>> result = train(build(plan), epochs=3, checkpoint_dir="run/ckpt")  # doctest: +SKIP
        >>> result.global_step  # doctest: +SKIP
        300
    """
    model = built.model
    _check_arguments(epochs, steps_per_epoch, checkpoint_every_steps)
    stream = steps_per_epoch is not None
    pieces = built.plan.micro_batches  # Keras steps per step counted here (an update of one of the user's batches)
    if stream:
        dataset = as_stream(built.dataset)
    else:
        dataset, keras_steps = _one_pass(built.dataset)
        steps_per_epoch = keras_steps // pieces
    total_steps = epochs * steps_per_epoch

    checkpoint = None
    start = 0
    if checkpoint_dir is not None:
        with built.strategy.scope():
            checkpoint = TrainingCheckpoint(
                checkpoint_dir,
                model,
                steps_per_epoch=steps_per_epoch,
                keep=keep_checkpoints,
                async_write=async_checkpoint,
            )
            start = checkpoint.restore() or 0
            if start == total_steps and model.optimizer is not None:
                # Finished: no fit runs, and the checkpoint was written before the last one's finalizing.
                model.optimizer.finalize_variable_values(model.trainable_weights)
    if start > total_steps:
        raise DataError(
            f"The checkpoint in {checkpoint_dir} is at step {start}, past the {total_steps} steps "
            f"of epochs={epochs}: raise epochs, or use a new checkpoint_dir."
        )

    history: dict[str, list[float]] = {}
    done = start
    saver = None
    try:
        with stops_at_step_ends():
            segments = _segments(dataset, start, total_steps, steps_per_epoch, stream, pieces)
            for first_step, steps, fit_kwargs in segments:
                run_callbacks = [NonFiniteLossGuard(steps_done=first_step, micro_batches=pieces), *callbacks]
                if checkpoint is not None:
                    saver = CheckpointCallback(
                        checkpoint, every_steps=checkpoint_every_steps, steps_done=first_step, micro_batches=pieces
                    )
                    run_callbacks.append(saver)
                run_callbacks.append(StopAtStepEnd())  # last: the step is counted and checkpointed first
                # shuffle=False: a tf.data pipeline shuffles itself; Keras' default only adds a warning.
                # The rest of a resumed epoch (steps_per_epoch None: to the end of the data) is whole calls too:
                # Keras numbers a call cut short by the data's end as if it had run all its steps.
                calls = whole_calls(model, fit_kwargs["steps_per_epoch"] or steps * pieces)
                with steps_per_call(model, calls), _finalized_at_the_end(model, first_step + steps == total_steps):
                    fitted = model.fit(
                        callbacks=run_callbacks,
                        validation_data=validation_data,
                        verbose=verbose,
                        shuffle=False,
                        **fit_kwargs,
                    )
                for key, values in fitted.history.items():
                    history.setdefault(key, []).extend(float(value) for value in values)
                done = first_step + steps
    except NonFiniteLossError as error:
        if checkpoint is None:
            raise
        checkpoint.sync()
        raise error.with_checkpoint(checkpoint.latest_path) from None
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from a scheduler: the steps trained so far are kept
        try:
            if saver is not None and saver.save_where_stopped():
                checkpoint.sync()  # the path is the one written, once its asynchronous write has ended
                _log.info("Interrupted: the steps trained so far are in %s.", checkpoint.latest_path)
        except Exception as error:  # noqa: BLE001 - the interruption is what the user must hear of
            _log.warning("Interrupted; the steps since the last checkpoint are lost: %s", describe_error(error))
        raise
    finally:
        if checkpoint is not None:
            checkpoint.sync()
    return TrainingResult(
        history=history,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        resumed_from_step=start,
        steps_run=done - start,
        global_step=done,
        last_checkpoint=checkpoint.latest_path if checkpoint else None,
    )


@contextlib.contextmanager
def _finalized_at_the_end(model: Any, last: bool) -> Iterator[None]:
    """Keras ends every `fit` with `optimizer.finalize_variable_values`, where an optimizer keeping a moving
    average (`use_ema`) writes it into the weights: once, at the end of the training in one call, so a resumed
    run's `fit` for the rest of an epoch, which is not `last`, must not."""
    optimizer = model.optimizer
    if last or optimizer is None:
        yield
        return
    own = optimizer.__dict__.get("finalize_variable_values")  # the user's own, set on the object
    optimizer.finalize_variable_values = lambda var_list: None
    try:
        yield
    finally:
        if own is None:
            del optimizer.finalize_variable_values
        else:
            optimizer.finalize_variable_values = own


def _segments(dataset: tf.data.Dataset, start: int, total_steps: int, steps_per_epoch: int, stream: bool, pieces: int):
    """The `fit()` calls that train from global step `start` to `total_steps`.

    A resumed run that stopped mid-epoch needs two: the rest of that epoch, then the remaining epochs.
    Steps count updates: with micro-batches (`pieces` > 1) `fit` runs `pieces` of its steps for each.
    Yields (first global step, steps, fit keyword arguments).
    """
    epoch, step_in_epoch = divmod(start, steps_per_epoch)
    epochs = total_steps // steps_per_epoch
    if step_in_epoch:
        steps = steps_per_epoch - step_in_epoch
        data = dataset.skip(start * pieces) if stream else dataset.skip(step_in_epoch * pieces)
        yield (
            start,
            steps,
            dict(x=data, initial_epoch=epoch, epochs=epoch + 1, steps_per_epoch=steps * pieces if stream else None),
        )
        epoch += 1
    if epoch < epochs:
        first = epoch * steps_per_epoch
        # A stream goes on where it stopped; a finite dataset repeats in one iterator for all epochs (see the
        # module docstring).
        data = (dataset.skip(first * pieces) if first else dataset) if stream else dataset.repeat()
        yield (
            first,
            total_steps - first,
            dict(x=data, initial_epoch=epoch, epochs=epochs, steps_per_epoch=steps_per_epoch * pieces),
        )


def _check_arguments(epochs: int, steps_per_epoch: int | None, checkpoint_every_steps: int) -> None:
    if not isinstance(epochs, int) or epochs < 1:
        raise DataError(f"train: epochs must be a positive integer; received {epochs!r}.")
    if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int) or steps_per_epoch < 1):
        raise DataError(
            f"train: steps_per_epoch must be a positive integer or None (one pass over the "
            f"dataset); received {steps_per_epoch!r}."
        )
    if not isinstance(checkpoint_every_steps, int) or checkpoint_every_steps < 1:
        raise DataError(
            f"train: checkpoint_every_steps must be a positive integer; received {checkpoint_every_steps!r}."
        )


def as_stream(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset read as one stream across epochs of `steps_per_epoch` steps: repeated where it is finite."""
    import tensorflow as tf

    infinite = int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY)
    return dataset if infinite else dataset.repeat()


def _one_pass(dataset: tf.data.Dataset) -> tuple[Any, int]:
    """The dataset with a known length, and that length in batches (read once where it was unknown)."""
    import tensorflow as tf

    cardinality = int(dataset.cardinality())
    if cardinality == int(tf.data.INFINITE_CARDINALITY):
        raise DataError("train: the dataset repeats forever, so an epoch has no end. Pass steps_per_epoch=N.")
    if cardinality == int(tf.data.UNKNOWN_CARDINALITY):
        _log.info(
            "The dataset's length is unknown (filter() or rebatch() hide it): reading it once to count "
            "batches. Pass steps_per_epoch= to skip this."
        )
        cardinality = int(dataset.reduce(tf.constant(0, tf.int64), lambda count, _: count + 1))
        # Tell Keras too: with an unknown length it learns the epoch's end from an OutOfRange error and warns.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(cardinality))
    if cardinality == 0:
        raise DataError(
            "train: the dataset yields no batch. Check its source (and drop_remainder=True "
            "with a batch larger than the data)."
        )
    return dataset, cardinality
