"""A tiny deterministic regression problem for the training tests: 40 examples, 4 per batch."""

import numpy as np
import pytest

STEPS_PER_EPOCH = 10


def make_built(seed=0, poison_batch=None, optimizer="adam"):
    """A built plan of a small Dense model; `seed` sets its initial weights (the data is always the same),
    `poison_batch` puts NaN inputs into that batch (0-based).

    The model is used as built here rather than through `build()`: train() only needs what `Built` holds,
    and these tests should not depend on the strategy code.
    """
    import keras
    import tensorflow as tf

    from tfopt.builder import Built
    from tfopt.hardware import Hardware
    from tfopt.plan import make_plan

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * STEPS_PER_EPOCH, 3)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.1).astype("float32")
    if poison_batch is not None:
        x[4 * poison_batch : 4 * poison_batch + 4] = np.nan
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.get(optimizer), loss="mse")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    plan = make_plan(model, dataset, hardware=Hardware())
    return Built(model=model, dataset=dataset, strategy=tf.distribute.get_strategy(), plan=plan)


@pytest.fixture
def built():
    return make_built()
