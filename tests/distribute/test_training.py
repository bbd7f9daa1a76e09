"""tfopt.distribute.fit: tfopt's own train step, checked against Keras fit on the same batches."""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.processes import child_environment
from tfopt.distribute import fit
from tfopt.errors import RecipeConfigError

HERE = Path(__file__).parent


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def make_dataset():
    rng = np.random.default_rng(1)
    features = rng.normal(size=(48, 4)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, features[:, :1] * 2.0)).batch(8)


def test_single_device_matches_keras_fit(ieee_float32):
    reference = make_model()
    expected = reference.fit(make_dataset(), epochs=2, verbose=0, shuffle=False).history["loss"]
    model = make_model()
    history = fit(model, make_dataset(), epochs=2, engine="tfopt")
    assert history.epoch == [0, 1]
    np.testing.assert_allclose(history.history["loss"], expected, rtol=1e-5)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_tfopts_loop_logs_the_models_metrics_as_keras_fit_does(ieee_float32):
    def compiled_with_metrics():
        model = make_model()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
        return model

    expected = compiled_with_metrics().fit(make_dataset(), epochs=2, verbose=0, shuffle=False).history
    history = fit(compiled_with_metrics(), make_dataset(), epochs=2, engine="tfopt").history
    assert sorted(history) == ["loss", "mae"]
    for name in expected:
        np.testing.assert_allclose(history[name], expected[name], rtol=1e-5)


def test_tfopts_loop_logs_a_metric_of_several_values_as_keras_fit_does(ieee_float32):
    def classifier():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
        model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=[keras.metrics.F1Score(average=None)])
        return model

    features = np.random.default_rng(1).normal(size=(48, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, np.eye(2, dtype="float32")[(features[:, 0] > 0) * 1]))
    expected = classifier().fit(data.batch(8), epochs=1, verbose=0, shuffle=False).history
    history = fit(classifier(), data.batch(8), epochs=1, engine="tfopt").history
    np.testing.assert_allclose(history["f1_score"][0], expected["f1_score"][0], rtol=1e-5)
    assert np.shape(history["f1_score"][0]) == (2,)


def test_tfopts_loop_runs_a_train_step_of_the_models_own(ieee_float32):
    """Its history as fit's: Keras logs the loss tracker this train_step never updates, for its logs name just it."""
    from tests import keras_examples

    def make():
        keras.utils.set_random_seed(0)
        model = keras_examples.OwnTrainStep(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
        model.compile(optimizer=keras.optimizers.SGD(0.05))
        return model

    reference = make()
    expected = reference.fit(make_dataset(), epochs=2, verbose=0, shuffle=False).history["loss"]
    model = make()
    np.testing.assert_allclose(
        fit(model, make_dataset(), epochs=2, engine="tfopt").history["loss"], expected, rtol=1e-5
    )
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_horovod_refuses_a_train_step_it_cannot_average(ieee_float32):
    from tests import keras_examples
    from tfopt.distribute.horovod import HorovodStrategy

    model = keras_examples.OwnTrainStep(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]))
    model.compile(optimizer="sgd")
    with pytest.raises(RecipeConfigError, match=r"OwnTrainStep has a train_step of its own.*strategy: multi_worker"):
        fit(model, make_dataset(), strategy=HorovodStrategy.__new__(HorovodStrategy), engine="tfopt")


def test_keras_engine_reads_one_pass_per_epoch_from_one_iterator(tmp_path):
    model, calls = make_model(), []
    keras_fit = model.fit
    model.fit = lambda x, **kwargs: calls.append((x, kwargs)) or keras_fit(x, **kwargs)
    history = fit(model, make_dataset(), epochs=3, engine="keras")

    ((x, kwargs),) = calls
    assert int(x.cardinality()) == int(tf.data.INFINITE_CARDINALITY) and kwargs["steps_per_epoch"] == 6
    assert history.epoch == [0, 1, 2] and int(model.optimizer.iterations.numpy()) == 18
    reference = make_model()  # Keras' own epochs over the finite dataset: the same passes, the same weights
    reference.fit(make_dataset(), epochs=3, verbose=0, shuffle=False)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)

    # Killed in its third epoch and resumed by BackupAndRestore: the third epoch is again one whole pass.
    def crash(epoch, logs):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(
            make_model(),
            make_dataset(),
            epochs=3,
            checkpoint_dir=tmp_path,
            engine="keras",
            callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=crash)],
        )
    resumed = make_model()
    assert fit(resumed, make_dataset(), epochs=3, checkpoint_dir=tmp_path, engine="keras").epoch == [2]
    for got, want in zip(resumed.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_callbacks_and_steps_per_epoch_keep_one_iterator():
    seen = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda step, logs: seen.append(step))
    history = fit(make_model(), make_dataset(), epochs=2, steps_per_epoch=2, callbacks=[callback], engine="tfopt")
    assert seen == [0, 1, 0, 1]
    assert history.epoch == [0, 1]


def test_running_out_of_data_stops_with_a_warning(caplog):
    model = make_model()
    history = fit(model, make_dataset(), epochs=3, steps_per_epoch=4, engine="tfopt")  # 6 batches in all
    assert history.epoch == [0, 1]
    assert int(model.optimizer.iterations.numpy()) == 6
    assert "ran out after 2 steps" in caplog.text


def test_checkpoint_resume_equals_uninterrupted_training(tmp_path):
    straight = make_model()
    fit(straight, make_dataset(), epochs=3, engine="tfopt")
    interrupted = make_model()
    fit(interrupted, make_dataset(), epochs=2, checkpoint_dir=tmp_path, engine="tfopt")
    resumed = make_model()  # a fresh process would start here, from random weights
    history = fit(resumed, make_dataset(), epochs=3, checkpoint_dir=tmp_path, engine="tfopt")
    assert history.epoch == [2]
    assert sorted(os.listdir(tmp_path))[:1] == ["checkpoint"]
    for got, want in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


@pytest.mark.parametrize("kwargs, words", [({"engine": "fast"}, "Expected one of"), ({"epochs": 0}, "positive")])
def test_bad_arguments_raise(kwargs, words):
    with pytest.raises(RecipeConfigError, match=words):
        fit(make_model(), make_dataset(), **kwargs)


@pytest.mark.slow
def test_mirrored_two_cpus_matches_single_device():
    """Two logical CPUs need a fresh process: TensorFlow fixes its devices when it starts."""
    completed = subprocess.run(
        [sys.executable, str(HERE / "mirrored_script.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_environment(),
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stderr[-3000:]
    results = json.loads(lines[0][len("RESULT ") :])
    assert "mirrored with 2 replica(s)" in results["applied"]
    for engine in ("tfopt", "keras"):
        run = results[engine]
        assert run["replicas"] == 2 and run["variable_type"] == "MirroredVariable"
        assert run["components_before_equal"] and run["components_after_max_diff"] == 0.0
        np.testing.assert_allclose(run["loss"], results["single"]["loss"], rtol=1e-5)
        for got, want in zip(run["weights"], results["single"]["weights"]):
            np.testing.assert_allclose(got, want, atol=1e-5)
    for name in ("apply_float32", "apply_bf16", "own_loss_bf16"):
        assert not any(step.startswith(("fidelity", "mixed_precision: skipped")) for step in results[name]["applied"])
    assert results["apply_bf16"]["policy"] == "mixed_bfloat16"
    assert results["no_call_bf16"].startswith("VAE has no call() of its own, and Keras builds a model under a")


@pytest.mark.parametrize("engine", ["keras", "tfopt"])
def test_a_model_at_four_steps_per_call_trains_every_epoch_exactly(engine, caplog):
    """6 batches an epoch: Keras' fit, given steps_per_epoch, would run its last call of 4 whole (8 steps an
    epoch), so it trains at 3 per call; tfopt's own loop runs one per call, and says that the number is not
    used. Either way 12 updates in 2 epochs, the loss of Keras' fit at one step per call, and the model's
    number kept."""
    reference = make_model()
    expected = reference.fit(make_dataset(), epochs=2, verbose=0, shuffle=False).history["loss"]
    model = make_model()
    model.steps_per_execution = 4
    history = fit(model, make_dataset(), epochs=2, engine=engine)
    assert int(model.optimizer.iterations.numpy()) == 12 and model.steps_per_execution == 4
    np.testing.assert_allclose(history.history["loss"], expected, rtol=1e-5)
    said = "runs one step per call: the model's steps_per_execution=4 is not used here"
    assert (said in caplog.text) == (engine == "tfopt")
