"""Training under any strategy, including the multi-worker case where Keras 3's `fit` fails.

Keras 3 `model.fit` under MultiWorkerMirroredStrategy with two or more workers raises "Attempt to
convert a value (PerReplica...) to a Tensor" (keras-team/keras#20585, tensorflow/tensorflow#72388;
verified with TF 2.21 / Keras 3.15, while one worker works). tfopt does not patch Keras internals:
`fit` here runs the model's own `train_step` (Keras', or the user's override: a GAN's, a distiller's) under
`strategy.run` in a loop of Keras pieces (`keras.callbacks.CallbackList`, the model's metrics, and, for the
epoch's logs, the Trainer's own `_get_metrics_result_or_logs`), so it trains what `fit` would. Under Horovod,
which averages the gradients between `tape.gradient` and the update, the step is Keras' own, written with
`model.compute_loss`, `optimizer.scale_loss` and `optimizer.apply`: a `train_step` of the user's cannot be
reached there. With `engine="auto"` it hands over to `model.fit` wherever that is known to work, including
multi-worker once `tfopt.distribute.probe` has seen the bug fixed.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

from tfopt.distribute.checkpoints import WorkerCheckpoint
from tfopt.errors import DistributionError, RecipeConfigError
from tfopt.training.calls import steps_per_call, whole_calls
from tfopt.training.optimizer_build import build_as_fit_does

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

_log = logging.getLogger("tfopt")
ENGINES = ("auto", "tfopt", "keras")


def fit(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    strategy: tf.distribute.Strategy | None = None,
    epochs: int = 1,
    steps_per_epoch: int | None = None,
    callbacks: list[Any] | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    verbose: int = 0,
    engine: str = "auto",
) -> Any:
    """Trains a compiled Keras model like `model.fit`, on one device, several, several workers or Horovod.

    The model must have been built and compiled inside `strategy.scope()` (as `tfopt.build` does).
    `dataset` yields global batches; each replica gets its share (sharded by the dataset's
    `experimental_distribute.auto_shard_policy`, set by the distribution recipe).

    Args:
        model: A compiled Keras model.
        dataset: A batched `tf.data.Dataset` of (inputs, targets[, sample_weights]).
        strategy: The strategy the model was built under; None for the current one.
        epochs: The total number of epochs, counting those a resumed run already completed.
        steps_per_epoch: Steps per epoch; None runs each epoch to the end of the dataset. With a value, one
            iterator is kept across epochs (as Keras does) and training stops when it runs dry.
        callbacks: Keras callbacks (History and, with verbose, a progress bar are added). Under several
            workers they run on every worker; guard side effects with the worker's chief status.
        checkpoint_dir: Saves model, optimizer and epoch after each epoch here (the chief's copy is kept,
            other workers write to temporary directories), and resumes from the latest one at start.
        verbose: 0 silent, 1 progress bar (only on the chief).
        engine: "tfopt" (tfopt's train step), "keras" (`model.fit`, with `BackupAndRestore` for
            checkpoints) or "auto": Keras where it works, tfopt's step under multi-worker and Horovod.

    Returns:
        The `keras.callbacks.History` of this run (resumed runs list only the epochs they trained).

    Raises:
        DistributionError: A worker was lost or a collective timed out; restart all workers to resume.
        RecipeConfigError: A bad argument (engine name, epochs).

    Example:
        >>> history = fit(model, dataset, epochs=2)  # doctest: +SKIP
        >>> history.history["loss"]  # doctest: +SKIP
        [0.71, 0.52]
    """
    import tensorflow as tf

    if engine not in ENGINES:
        raise RecipeConfigError(f"engine={engine!r} is not an engine. Expected one of {', '.join(ENGINES)}.")
    if not isinstance(epochs, int) or epochs < 1:
        raise RecipeConfigError(f"epochs={epochs!r}: expected a positive integer.")
    strategy = strategy or tf.distribute.get_strategy()
    if _choose_engine(engine, strategy) == "keras":
        return _keras_fit(
            model,
            dataset,
            epochs,
            steps_per_epoch,
            callbacks,
            checkpoint_dir,
            verbose,
            one_iterator=not is_multi_worker(strategy),
        )
    return _Loop(model, dataset, strategy, steps_per_epoch).run(epochs, callbacks, checkpoint_dir, verbose)


def worker_role(strategy: tf.distribute.Strategy) -> tuple[int, bool]:
    """(worker index, is chief) of this process under `strategy`; (0, True) outside a cluster."""
    from tfopt.distribute.horovod import HorovodStrategy

    if isinstance(strategy, HorovodStrategy):
        return strategy.worker_index, strategy.is_chief
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0, True
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    index = task_id if task_type == "chief" or not has_chief else task_id + 1
    return index, task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` spans several processes (multi-worker collectives or Horovod)."""
    from tfopt.distribute.horovod import HorovodStrategy

    if isinstance(strategy, HorovodStrategy):
        return strategy.num_replicas_in_sync > 1
    extended = getattr(strategy, "extended", None)
    return bool(getattr(extended, "_in_multi_worker_mode", lambda: False)())


def _choose_engine(engine: str, strategy: tf.distribute.Strategy) -> str:
    from tfopt.distribute.horovod import HorovodStrategy

    if isinstance(strategy, HorovodStrategy):
        if engine == "keras":
            raise RecipeConfigError(
                "engine='keras' cannot train under Horovod: horovod.tensorflow.keras never averages "
                "gradients on Keras 3. Use engine='tfopt' (or 'auto')."
            )
        return "tfopt"
    if engine != "auto":
        return engine
    if not is_multi_worker(strategy):
        return "keras"
    from tfopt.distribute.probe import cached_keras_fit_works

    return "keras" if cached_keras_fit_works() else "tfopt"


def _keras_fit(model, dataset, epochs, steps_per_epoch, callbacks, checkpoint_dir, verbose, *, one_iterator):
    """`model.fit`; one pass per epoch is read as `dataset.repeat()` with `steps_per_epoch` = its length.

    Given a finite dataset, Keras makes a new iterator per epoch while the previous one is still alive,
    and with tf.data's autotuning about a third of those epochs train at half speed on CPU (see
    `tfopt.training.fit`); one iterator for all epochs never does, and each epoch is still one whole
    pass. Only on one worker: under several, each worker's share of a pass is not the dataset's length.
    BackupAndRestore saves at epoch ends, so a resumed fit starts its iterator at a pass boundary too.
    """
    import keras

    callbacks = list(callbacks or [])
    if checkpoint_dir is not None:
        callbacks.append(keras.callbacks.BackupAndRestore(os.fspath(checkpoint_dir)))
    length = int(dataset.cardinality())
    if one_iterator and steps_per_epoch is None and length > 0:
        dataset, steps_per_epoch = dataset.repeat(), length
    # Whole calls where the epoch's length is known: Keras numbers a call cut short by the data's end as if it
    # had run all its steps.
    with steps_per_call(model, whole_calls(model, steps_per_epoch or (length if length > 0 else None))):
        return model.fit(
            dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=verbose, shuffle=False
        )


class _Loop:
    """tfopt's training loop: one compiled step function, run by the strategy on every replica."""

    def __init__(
        self,
        model: keras.Model,
        dataset: tf.data.Dataset,
        strategy: tf.distribute.Strategy,
        steps_per_epoch: int | None,
    ):
        import keras
        import tensorflow as tf

        from tfopt.distribute.horovod import HorovodStrategy

        if model.optimizer is None:
            raise RecipeConfigError(
                "The model is not compiled: call model.compile(optimizer=..., loss=...) "
                "inside strategy.scope() before training."
            )
        self.model, self.strategy, self.steps_per_epoch = model, strategy, steps_per_epoch
        if model.steps_per_execution > 1:
            _log.warning(
                "tfopt's training loop (for %s, where Keras' fit fails) runs one step per call: the model's "
                "steps_per_execution=%d is not used here",
                type(strategy).__name__,
                model.steps_per_execution,
            )
        if model.jit_compile:
            _log.warning(
                "tfopt's training loop (for %s, where Keras' fit fails) runs without XLA: the model's "
                "jit_compile=True is not used here",
                type(strategy).__name__,
            )
        self.horovod = isinstance(strategy, HorovodStrategy)
        if self.horovod and type(model).train_step is not keras.Model.train_step:
            raise RecipeConfigError(
                f"{type(model).__name__} has a train_step of its own, and tfopt's Horovod loop averages the "
                "gradients of Keras' own step between computing and applying them, which a train_step of yours "
                "does not let it do. Train it with `distribution: {strategy: multi_worker}` (which runs your "
                "train_step on every worker), or average the gradients in your train_step with Horovod yourself."
            )
        self.worker_index, self.is_chief = worker_role(strategy)
        self.lost_worker_errors = (
            tf.errors.UnavailableError,
            tf.errors.DeadlineExceededError,
            tf.errors.CancelledError,
            tf.errors.AbortedError,
        )
        if self.horovod:
            self.lost_worker_errors += strategy.lost_worker_errors()
            self.dataset = strategy.shard(dataset, _global_batch_size(dataset), steps_per_epoch)
        else:
            self.dataset = strategy.experimental_distribute_dataset(dataset)
        if not model.optimizer.built:
            # Optimizer slots created lazily inside the traced step break under MirroredStrategy
            # ("You must feed a value for placeholder"): create them up front.
            build_as_fit_does(model.optimizer, model)
        self.step = tf.function(self._distributed_step, reduce_retracing=True)

    def _horovod_step(self, data: Any) -> dict[str, Any]:
        """Keras' own train step with the gradients averaged over the ranks, and its loss: the mean of theirs."""
        import keras
        import tensorflow as tf

        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        model = self.model
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            # Horovod is no tf.distribute strategy: compute_loss sees one replica, and the ranks' gradients
            # are averaged below, those of the global batch's mean loss.
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            scaled_loss = model.optimizer.scale_loss(loss)
        gradients = self.strategy.average_gradients(tape.gradient(scaled_loss, model.trainable_variables))
        model.optimizer.apply(gradients, model.trainable_variables)
        return {"loss": self.strategy.mean(loss)}

    def _distributed_step(self, data: Any) -> dict[str, Any]:
        """One training step on every replica, and its logs averaged over them (as Keras' fit reduces them)."""
        import tensorflow as tf

        if self.horovod:
            return self._horovod_step(data)
        logs = self.strategy.run(self.model.train_step, args=(data,))
        return {
            name: self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None) for name, value in logs.items()
        }

    def run(self, epochs: int, callbacks: list[Any] | None, checkpoint_dir: Any, verbose: int) -> Any:
        import keras

        checkpoint = None
        initial_epoch = 0
        if checkpoint_dir is not None:
            with self.strategy.scope():
                checkpoint = WorkerCheckpoint(
                    checkpoint_dir,
                    model=self.model,
                    is_chief=self.is_chief,
                    worker_index=self.worker_index,
                    collective_save=not self.horovod,
                )
            initial_epoch = checkpoint.restore()
        if self.horovod:
            # Every rank starts from rank 0's weights and optimizer state (restored or fresh).
            self.strategy.broadcast_variables(self.model.variables + self.model.optimizer.variables)
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=bool(verbose) and self.is_chief,
            model=self.model,
            verbose=verbose,
            epochs=epochs,
            steps=self.steps_per_epoch,
        )
        self.model.stop_training = False
        callback_list.on_train_begin()
        iterator = iter(self.dataset) if self.steps_per_epoch else None
        for epoch in range(initial_epoch, epochs):
            self.model.reset_metrics()  # as fit does: the logs of an epoch are its own steps' means
            callback_list.on_epoch_begin(epoch)
            logs, steps, exhausted = self._run_epoch(iterator, callback_list, epoch)
            if exhausted:
                _log.warning(
                    "The dataset ran out after %d steps of epoch %d; stopping. Make the dataset "
                    "long enough for epochs x steps_per_epoch (e.g. dataset.repeat()).",
                    steps,
                    epoch + 1,
                )
            callback_list.on_epoch_end(epoch, logs)
            if checkpoint is not None and not exhausted:
                self._guard(functools.partial(checkpoint.save, epoch + 1), epoch)
            if exhausted or self.model.stop_training:
                break
        callback_list.on_train_end()
        return next(c for c in callback_list.callbacks if isinstance(c, keras.callbacks.History))

    def _run_epoch(self, iterator: Any, callback_list: Any, epoch: int) -> tuple[dict[str, float], int, bool]:
        """The epoch's logs (`_epoch_logs`), its steps, and whether the data ran out before `steps_per_epoch`."""
        iterator = iterator if iterator is not None else iter(self.dataset)
        logs: dict[str, float] = {}
        total, steps = 0.0, 0
        while self.steps_per_epoch is None or steps < self.steps_per_epoch:
            try:
                batch = self._guard(functools.partial(next, iterator), epoch)
            except StopIteration:
                return self._epoch_logs(logs), steps, self.steps_per_epoch is not None
            callback_list.on_train_batch_begin(steps)
            logs = _read(self._guard(functools.partial(self.step, batch), epoch))
            steps += 1
            if self.horovod:  # the step's own loss: the epoch's is the mean of its steps', as in fit
                total += logs["loss"]
                logs["loss"] = total / steps
            callback_list.on_train_batch_end(steps - 1, logs)
            if self.model.stop_training:
                break
        return self._epoch_logs(logs), steps, False

    def _epoch_logs(self, logs: dict[str, float]) -> dict[str, float]:
        """What fit gives the epoch's end: the model's metrics where the last step's logs name exactly those
        (Keras' `_get_metrics_result_or_logs`: a train_step of the user's that returns its own "loss" gets the
        loss tracker's value, as in fit), else the last step's logs."""
        if self.horovod or not logs:
            return logs
        return _read(self.model._get_metrics_result_or_logs(logs))

    def _guard(self, action: Any, epoch: int) -> Any:
        """Runs `action`, turning a lost peer or a collective timeout into one clear DistributionError."""
        try:
            return action()
        except self.lost_worker_errors as error:
            message = getattr(error, "message", str(error))
            raise DistributionError(
                f"Worker {self.worker_index} lost contact with the other workers during epoch {epoch + 1} "
                f"({type(error).__name__}: {message.strip()[:400]}). Another worker has probably died or "
                "stalled. Restart all workers; with checkpoint_dir set, training resumes from the last "
                "completed epoch."
            ) from error


def _read(logs: dict[str, Any]) -> dict[str, Any]:
    """Logs as Keras' callbacks get them: a number where a value is one, else an array (F1Score per class)."""
    import numpy as np

    values = {name: np.asarray(value) for name, value in logs.items()}
    return {name: float(value) if value.ndim == 0 else value for name, value in values.items()}


def _global_batch_size(dataset: tf.data.Dataset) -> int:
    import tensorflow as tf

    first = tf.nest.flatten(dataset.element_spec)[0]
    if first.shape.rank is None or first.shape[0] is None:
        raise DistributionError(
            "The dataset's batch size is not static, so it cannot be split evenly over Horovod ranks. "
            "Batch it with dataset.batch(global_batch_size, drop_remainder=True)."
        )
    return int(first.shape[0])
