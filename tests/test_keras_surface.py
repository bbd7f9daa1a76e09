"""tfopt takes every model Keras trains: each public class of `keras.layers`, `keras.metrics`, `keras.losses`,
`keras.optimizers` and `keras.optimizers.schedules` (listed from the modules by `tests/keras_surface.py`, not
picked), placed in a tiny model as users place it, applied with the defaults and with bf16 + XLA forced.

For each: apply works (or plain Keras fails too), the copy holds the same classes and settings, its variables
are new, it computes the user's predictions and loss within the precision's tolerance, the user's model and
objects are untouched, the copy trains, and it saves and loads as the user's model does."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests import keras_surface
from tfopt.fidelity import Outcome, agreement
from tfopt.model_copy import copy_model

FORCED = [{"mixed_precision": {"policy": "mixed_bfloat16"}}, {"xla": {"jit_compile": True}}]
MODES = {"defaults": "default", "bf16_xla_forced": FORCED}
CASES = keras_surface.all_cases()


def forward(model, batch):
    """Predictions and loss of one batch, inference mode, as Keras computes them."""
    inputs, targets, weights = keras.utils.unpack_x_y_sample_weight(batch)
    predictions = model(inputs, training=False)
    loss = model._compute_loss(inputs, targets, predictions, weights, training=False)
    flat = [np.ravel(np.asarray(tf.cast(tensor, tf.float64))) for tensor in tf.nest.flatten(predictions)]
    return Outcome(np.concatenate(flat), float(loss))


def state_of(model):
    optimizer = model.optimizer
    return (
        [variable.numpy().copy() for variable in model.variables],
        optimizer.built,
        [variable.numpy().copy() for variable in optimizer.variables],
    )


def plain_keras_error(case):
    """What plain Keras says when this case's model trains, or None where it trains."""
    model, data = case.make()
    try:
        model.fit(data, epochs=1, verbose=0)
    except Exception as error:  # noqa: BLE001 - any failure of plain Keras is the answer
        return f"{type(error).__name__}: {error}"
    return None


def without_dtypes(config):
    """A layer's config less its dtype policies (nested layers' too): what tfopt may change."""
    if isinstance(config, dict):
        return {key: without_dtypes(value) for key, value in config.items() if key != "dtype"}
    if isinstance(config, (list, tuple)):
        return [without_dtypes(value) for value in config]
    return config


def layer_configs(model):
    """Each layer's class and config; a layer `fused_layers` rewrote counts as the Keras class it computes as."""
    return [
        (_as_computed(type(layer)), without_dtypes(layer.get_config()))
        for layer in model._flatten_layers(include_self=False)
    ]


def _as_computed(layer_class):
    from tfopt.rewrites.batch_norm import FusedBatchNormalization

    return keras.layers.BatchNormalization if layer_class is FusedBatchNormalization else layer_class


def compile_configs(model):
    return {
        key: keras.saving.serialize_keras_object(value)
        for key, value in model._compile_config.config.items()
        if key != "jit_compile"
    }


def test_the_surface_is_listed_from_keras_itself():
    names = {case.name for case in CASES}
    listed = {
        name
        for module, base in (
            (keras.layers, keras.layers.Layer),
            (keras.metrics, keras.metrics.Metric),
            (keras.losses, keras.losses.Loss),
            (keras.optimizers, keras.optimizers.Optimizer),
            (keras.optimizers.schedules, keras.optimizers.schedules.LearningRateSchedule),
        )
        for name in keras_surface.public_classes(module, base)
    }
    assert listed == (names & listed) | set(keras_surface.NOT_TAKEN)
    assert set(keras_surface.NOT_TAKEN) <= listed  # no stale entry
    assert len(names & listed) > 200 and len(keras_surface.NOT_TAKEN) < 25


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_apply_copies_and_trains_what_keras_trains(case, mode, cpu_hardware, tmp_path):
    user, data = case.make()
    before = state_of(user)
    batch = next(iter(data))
    try:
        result = tfopt.apply(user, data, MODES[mode], hardware=cpu_hardware, measure_speed=False)
    except Exception as error:  # noqa: BLE001 - whatever tfopt raised, plain Keras decides whether it may
        plain = plain_keras_error(case)
        assert plain is not None, f"tfopt fails where plain Keras trains: {type(error).__name__}: {error}"
        pytest.fail(f"the case is not one Keras trains (fix tests/keras_surface.py): {plain}")
    model = result.model
    # The user's model as it was, then the same classes and settings, every variable new.
    after = state_of(user)  # before this test runs the user's model: random layers advance their seeds
    assert after[1] == before[1] and all(
        np.array_equal(a, b) for a, b in zip(after[0] + after[2], before[0] + before[2])
    )
    assert type(model) is type(user) and layer_configs(model) == layer_configs(user)
    assert compile_configs(model) == compile_configs(user)
    assert type(model.optimizer) is type(user.optimizer) and model.optimizer is not user.optimizer
    assert not {id(variable) for variable in user.variables} & {id(variable) for variable in model.variables}
    # The user's predictions and loss, within the precision's tolerance.
    checked = agreement(forward(user, batch), forward(model, batch), result.plan.dtype_policy)
    assert checked.agrees, str(checked)
    # It trains, and saves and loads as the user's model does.
    assert np.isfinite(model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])
    try:
        user.save(tmp_path / "user.keras")
        keras.saving.load_model(tmp_path / "user.keras")
    except Exception:  # noqa: BLE001 - the user's model does not save: neither need the copy
        return
    model.save(tmp_path / "copy.keras")
    loaded = keras.saving.load_model(tmp_path / "copy.keras")
    inputs = keras.utils.unpack_x_y_sample_weight(batch)[0]
    np.testing.assert_allclose(loaded(inputs, training=False), model(inputs, training=False), rtol=1e-6, atol=1e-6)
    model.save_weights(tmp_path / "copy.weights.h5")
    twin = copy_model(user)
    twin.load_weights(tmp_path / "copy.weights.h5")
    for mine, theirs in zip(twin.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)


OPTIMIZERS = [
    case
    for case in keras_surface.optimizer_cases()
    if case.name.startswith("keras.optimizers.") and "schedules" not in case.name
]


@pytest.mark.parametrize("case", OPTIMIZERS, ids=lambda case: case.name)
def test_with_each_optimizer_the_result_learns_what_plain_keras_learns(case):
    """apply builds the optimizer before fit would (to check the first batch and put the state back), and it
    must start where fit's own build starts it: ScheduleFreeAdamW's build copies the weights into its
    momentum, which fit's build, in the first step's trace, never does. Float32, so the learning is equal."""
    from tests.conftest import FAKE_HARDWARE
    from tests.same_training import assert_same_training

    user, data = case.make()
    result = tfopt.apply(user, data, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    assert result.plan.dtype_policy == "float32" and result.model.optimizer.built
    assert_same_training(result, user, case.make()[1])
