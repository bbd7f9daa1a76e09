"""LinearWarmup: values per step and the serialization round trip through compile configs."""

import keras
import numpy as np
import pytest

from tfopt.distribute.warmup import LinearWarmup


def test_ramps_to_the_scaled_rate():
    schedule = LinearWarmup(0.1, scale=4, warmup_steps=4)
    np.testing.assert_allclose([float(schedule(step)) for step in range(6)], [0.1, 0.2, 0.3, 0.4, 0.4, 0.4], rtol=1e-6)


def test_wraps_a_schedule_and_round_trips():
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    schedule = LinearWarmup(decay, scale=2, warmup_steps=0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    for step in (0, 5, 20):
        np.testing.assert_allclose(float(restored(step)), 2 * float(decay(step)), rtol=1e-6)


def test_rejects_negative_warmup():
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        LinearWarmup(0.1, warmup_steps=-1)
