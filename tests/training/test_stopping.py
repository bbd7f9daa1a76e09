"""A stop asked for while training ends it at the end of that step, and only inside a training loop."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfopt.errors import RunInterrupted
from tfopt.training.stopping import StopAtStepEnd, deferred, stops_at_step_ends


class _AskDuringStep(keras.callbacks.Callback):
    """Stands in for the signal handler: asks for a stop while step 3 is being handled."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2:
            assert deferred("SIGTERM")


def test_a_stop_asked_during_a_step_ends_training_after_that_step():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((64, 4), "float32"), np.ones((64, 1), "float32"))).batch(8)
    assert not deferred("SIGTERM")  # no loop runs: the handler raises at once
    with stops_at_step_ends(), pytest.raises(RunInterrupted, match="SIGTERM"):
        model.fit(data, epochs=1, verbose=0, callbacks=[_AskDuringStep(), StopAtStepEnd()])
    assert int(model.optimizer.iterations.numpy()) == 3  # steps 1-3 ran, none after
    assert not deferred("SIGTERM")


@pytest.mark.parametrize("signal_name, raised", [("SIGTERM", RunInterrupted), ("SIGINT", KeyboardInterrupt)])
def test_a_stop_no_step_end_took_is_taken_where_the_block_ends(signal_name, raised):
    """A signal while a run measures, or trains no step after it (train.epochs: 0), once ended nothing."""
    with pytest.raises(raised):
        with stops_at_step_ends():
            with stops_at_step_ends():  # an inner block's end is not the work's end
                assert deferred(signal_name)
            assert deferred(signal_name)  # still asked for: the outer block goes on
    assert not deferred(signal_name)
    with stops_at_step_ends():  # nothing asked: nothing raised
        pass
