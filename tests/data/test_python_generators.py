"""apply puts back the random generators the pipeline's Python code draws from: the user's pipeline yields
after it what it would have yielded before."""

import numpy as np
import tensorflow as tf

import tfopt
from tests.data.test_read_copy import epochs_of, model, shuffled


def test_python_and_numpy_global_generators_drawn_by_the_pipeline_are_put_back():
    """keras.io's 3D CT classifier augments in a `tf.numpy_function` drawing from Python's `random`."""
    import random

    def noisy(x):
        return (x + random.random() + np.random.random()).astype("float32")

    data = shuffled().map(lambda x, y: (tf.numpy_function(noisy, [x], tf.float32, stateful=True), y))
    data = data.map(lambda x, y: (tf.ensure_shape(x, (None, 2, 2, 1)), y))
    users = model()  # Keras' set_random_seed seeds both generators
    random.seed(5)
    np.random.seed(5)
    drawn = (random.random(), np.random.random())
    random.seed(5)
    np.random.seed(5)
    tfopt.apply(users, data, steps=2, warmup_steps=1)
    assert (random.random(), np.random.random()) == drawn


GLOBAL_RNG = np.random.default_rng(7)  # a script's module-level generator, drawn from by name


class Jitter:
    """An augmentation object of the user's, holding its own generator."""

    def __init__(self, seed):
        self.state = np.random.RandomState(seed)

    def __call__(self, x):
        return (x + self.state.random_sample()).astype("float32")


def test_the_generators_a_pipelines_python_functions_hold_are_put_back():
    """NumPy recommends a generator of one's own (`default_rng`): in a closure, a module global, an object's
    attribute, and inside a `from_generator` generator, each moved on by every read tfopt made. The system's
    entropy source has no state to put back."""
    import random

    own, jitter, shuffler, system = np.random.default_rng(3), Jitter(4), random.Random(5), random.SystemRandom()

    def noisy(x):
        return (x + own.random() + GLOBAL_RNG.random() + 0 * system.random()).astype("float32")  # no state: skipped

    def generated():
        for index in shuffler.sample(range(12), 12):
            yield np.full((2, 2, 1), index, "float32"), index % 2

    signature = (tf.TensorSpec((2, 2, 1), tf.float32), tf.TensorSpec((), tf.int64))
    data = tf.data.Dataset.from_generator(generated, output_signature=signature).batch(4)
    data = data.map(lambda x, y: (tf.numpy_function(noisy, [x], tf.float32, stateful=True), y))
    data = data.map(lambda x, y: (tf.numpy_function(jitter, [x], tf.float32, stateful=True), y))
    data = data.map(lambda x, y: (tf.ensure_shape(x, (None, 2, 2, 1)), y))
    states = [own.bit_generator.state, GLOBAL_RNG.bit_generator.state, jitter.state.get_state(), shuffler.getstate()]
    expected = epochs_of(data, count=1)
    own.bit_generator.state, GLOBAL_RNG.bit_generator.state = states[0], states[1]
    jitter.state.set_state(states[2])
    shuffler.setstate(states[3])
    tfopt.apply(model(), data, steps=2, warmup_steps=1)
    assert epochs_of(data, count=1) == expected
