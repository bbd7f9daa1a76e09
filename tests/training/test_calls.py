"""A model run at another number of steps per call for a while: its own train, test and predict functions come
back, and an epoch that is not a whole number of its calls trains at a divisor of it."""

import keras
import numpy as np
import tensorflow as tf

from tfopt.training.calls import steps_per_call, whole_calls


def test_after_a_block_at_one_step_per_call_the_model_evaluates_and_predicts_all_of_its_data():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.normal(size=(64, 4)), rng.normal(size=(64, 1)))).batch(8)
    model.fit(data, verbose=0)
    loss, predictions = model.evaluate(data, verbose=0), model.predict(data, verbose=0)
    functions = (model.train_function, model.test_function, model.predict_function)
    with steps_per_call(model, 1):
        assert model.steps_per_execution == 1 and model.predict_function is None
        assert model.predict(data.take(1), verbose=0).shape == (8, 1)  # made at one step per call
        model.evaluate(data.take(3), verbose=0)
    assert model.steps_per_execution == 4
    assert (model.train_function, model.test_function, model.predict_function) == functions
    assert model.evaluate(data, verbose=0) == loss  # all 8 batches, as before
    np.testing.assert_array_equal(model.predict(data, verbose=0), predictions)  # 64 rows


def test_an_epoch_trains_at_the_divisor_of_its_steps_nearest_to_the_models_number():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
    expected = {8: 4, 10: 5, 6: 3, 7: 7, 3: 3, 1: 1, 469: 7, 1875: 5, None: 4}
    assert {steps: whole_calls(model, steps) for steps in expected} == expected
