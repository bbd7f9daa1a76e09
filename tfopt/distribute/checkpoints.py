"""Checkpoints that several workers write together, and that a restarted run resumes from.

Under MultiWorkerMirroredStrategy every worker must take part in saving (saving may run collectives),
but only the chief's files are kept: the others write to a private temporary directory and delete it,
as TensorFlow's multi-worker guide prescribes. Every worker restores from the chief's directory, so a
restarted cluster resumes at the last completed epoch. Under Horovod only rank 0 saves.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import TYPE_CHECKING

from tfopt.training.optimizer_build import build_as_fit_does

if TYPE_CHECKING:
    import keras

_log = logging.getLogger("tfopt")


class WorkerCheckpoint:
    """The model, optimizer and epoch counter of one worker, saved once per epoch.

    Args:
        directory: The chief's checkpoint directory (on a filesystem every worker can read).
        model: The Keras model whose variables are saved.
        is_chief: Whether this worker's files are the ones kept.
        worker_index: This worker's index, naming its temporary directory.
        collective_save: Whether every worker must call save (tf.distribute) or only the chief
            (Horovod, whose ranks hold identical copies and save nothing collectively).
        max_to_keep: How many of the chief's checkpoints to keep.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        model: keras.Model,
        is_chief: bool,
        worker_index: int,
        collective_save: bool = True,
        max_to_keep: int = 2,
    ):
        import tensorflow as tf

        self.directory = os.fspath(directory)
        self.is_chief = is_chief
        self.collective_save = collective_save
        self._write_directory = (
            self.directory if is_chief else os.path.join(self.directory, f".tfopt_worker_{worker_index}_tmp")
        )
        # The epoch counter is a variable so it is saved and restored with the weights atomically.
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfopt_epoch")
        if model.optimizer is not None and not model.optimizer.built:
            # Keras creates optimizer slots on the first step; build them now so a restore fills them
            # instead of being silently deferred.
            build_as_fit_does(model.optimizer, model)
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, epoch=self.epoch)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self._write_directory, max_to_keep=max_to_keep if is_chief else 1
        )

    def restore(self) -> int:
        """Restores the chief's latest checkpoint, if there is one.

        Returns:
            The number of epochs already completed (0 for a fresh start).
        """
        import tensorflow as tf

        latest = tf.train.latest_checkpoint(self.directory)
        if latest is None:
            return 0
        self._checkpoint.restore(latest).assert_existing_objects_matched()
        _log.info("Resumed from %s after epoch %d", latest, int(self.epoch.numpy()))
        return int(self.epoch.numpy())

    def save(self, completed_epochs: int) -> str | None:
        """Saves after `completed_epochs` epochs; returns the kept path on the chief, else None."""
        self.epoch.assign(completed_epochs)
        if not self.is_chief and not self.collective_save:
            return None
        path = self._manager.save(checkpoint_number=completed_epochs)
        if not self.is_chief:
            shutil.rmtree(self._write_directory, ignore_errors=True)
            return None
        return path
