"""build() makes the model once with the user's weights, under the plan's scopes, and restores globals."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import make_cnn, make_images
from tfopt.builder import build
from tfopt.errors import IncompatibleModelError
from tfopt.layer_policies import set_dtype_policy
from tfopt.plan import make_plan
from tfopt.policies import dtype_policy_scope


def assert_same_weights(first, second):
    a, b = first.get_weights(), second.get_weights()
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def trained(model, data):
    model.fit(data, epochs=1, verbose=0)  # moves weights away from their initial values
    return model


def test_functional_clone_has_user_weights(cpu_hardware):
    user_model = trained(make_cnn(), make_images())
    built = build(make_plan(user_model, make_images(), hardware=cpu_hardware))
    assert built.model is not user_model
    assert_same_weights(user_model, built.model)
    assert built.model.optimizer is not user_model.optimizer


def test_sequential_clone_has_user_weights(cpu_hardware):
    user_model = keras.Sequential([keras.Input((12, 12, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
    user_model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trained(user_model, make_images())
    built = build(make_plan(user_model, make_images(), hardware=cpu_hardware))
    assert isinstance(built.model, keras.Sequential)
    assert_same_weights(user_model, built.model)


class Subclassed(keras.Model):
    def __init__(self, units=3):
        super().__init__()
        self.dense = keras.layers.Dense(units, activation="softmax")

    def call(self, inputs):
        return self.dense(keras.ops.mean(inputs, axis=(1, 2)))


def test_subclassed_model_with_model_fn(cpu_hardware):
    user_model = Subclassed()
    user_model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    trained(user_model, make_images())
    plan = make_plan(user_model, make_images(), model_fn=Subclassed, hardware=cpu_hardware)
    built = build(plan.replace(dtype_policy="mixed_bfloat16"))
    assert_same_weights(user_model, built.model)
    # The user's class, not a wrapper; the layer producing the output computes in float32.
    assert type(built.model) is Subclassed
    assert built.model.dense.compute_dtype == "float32"
    assert built.model(np.zeros((2, 12, 12, 3), "float32")).dtype == "float32"


def test_model_fn_that_does_not_match_the_weights(cpu_hardware):
    user_model = Subclassed(units=3)
    user_model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    user_model(np.zeros((1, 12, 12, 3), "float32"))
    plan = make_plan(user_model, make_images(), model_fn=lambda: Subclassed(units=5), hardware=cpu_hardware)
    with pytest.raises(IncompatibleModelError, match="does not match"):
        build(plan)


def test_global_policy_restored_when_build_fails(cpu_hardware):
    def broken():
        raise RuntimeError("boom")

    plan = make_plan(make_cnn(), make_images(), model_fn=broken, hardware=cpu_hardware)
    with pytest.raises(IncompatibleModelError, match="model_fn raised RuntimeError: boom"):
        build(plan.replace(dtype_policy="mixed_bfloat16"))
    assert keras.config.dtype_policy().name == "float32"


def test_policy_keeps_layers_pinned_to_another_dtype():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4, dtype="float64", name="pinned")(inputs)
    hidden = keras.layers.Dense(4, name="middle")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2, name="out")(hidden))
    set_dtype_policy(model, "mixed_bfloat16", None)
    assert model.get_layer("pinned").dtype_policy.name == "float64"
    assert model.get_layer("middle").compute_dtype == "bfloat16"
    assert model.get_layer("out").compute_dtype == "float32"


@pytest.mark.slow
def test_resnet50_small_clone(cpu_hardware):
    user_model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3), classes=3)
    user_model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    data = make_images(count=4, image_size=32, batch_size=2)
    built = build(make_plan(user_model, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert_same_weights(user_model, built.model)
    assert built.model.get_layer("conv1_conv").compute_dtype == "bfloat16"
    assert built.model.layers[-1].compute_dtype == "float32"


def test_functional_model_with_ops_and_residual_adds_clones_under_mixed_precision(cpu_hardware):
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    hidden = keras.ops.relu(hidden) + hidden * 2  # keras.ops calls and operators are not layers
    user_model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    user_model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"))).batch(4)
    built = build(make_plan(user_model, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert_same_weights(user_model, built.model)
    batch = np.random.default_rng(0).random((4, 4), dtype=np.float32)
    np.testing.assert_allclose(built.model(batch), user_model(batch), atol=5e-2)


def test_model_built_under_mixed_float16_keeps_it_and_its_loss_scaling(cpu_hardware):
    with dtype_policy_scope("mixed_float16"):
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(2, dtype="float32")(keras.layers.Dense(8)(inputs))
        user_model = keras.Model(inputs, outputs)
        user_model.compile(optimizer="adam", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"))).batch(4)
    baseline = make_plan(user_model, data, hardware=cpu_hardware)
    assert baseline.dtype_policy == "mixed_float16"
    kept = build(baseline).model
    assert kept.layers[1].compute_dtype == "float16"
    assert isinstance(kept.optimizer, keras.optimizers.LossScaleOptimizer)
    # Choosing float32 really rebuilds the mixed layers in float32, without loss scaling.
    float32 = build(baseline.replace(dtype_policy="float32")).model
    assert [layer.compute_dtype for layer in float32.layers[1:]] == ["float32", "float32"]
    assert not isinstance(float32.optimizer, keras.optimizers.LossScaleOptimizer)


def test_sequential_without_input_that_was_never_called(cpu_hardware):
    user_model = keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
    user_model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    built = build(make_plan(user_model, make_images(), hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert built.model.layers[-1].compute_dtype == "float32"
    assert np.isfinite(built.model.fit(make_images(), epochs=1, verbose=0).history["loss"][0])


def test_a_copy_that_fails_names_the_model_and_the_model_fn_fix(cpu_hardware):
    class NeedsItsUnits(keras.layers.Dense):
        """A layer whose __new__ takes an argument: no empty instance of it can be made."""

        def __new__(cls, units, **kwargs):
            return super().__new__(cls, units, **kwargs)

    inputs = keras.Input((12, 12, 3))
    outputs = NeedsItsUnits(3, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
    user_model = keras.Model(inputs, outputs, name="tiny_cnn")
    user_model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(IncompatibleModelError) as caught:
        build(make_plan(user_model, make_images(), hardware=cpu_hardware))
    message = str(caught.value)
    assert "could not copy your model 'tiny_cnn' (TypeError: " in message and "'units'" in message
    assert "model_fn=" in message and "model_fn raised" not in message


def test_float16_leaves_a_train_step_of_the_users_own_to_scale_its_loss(cpu_hardware):
    """Keras' train_step scales the loss for a LossScaleOptimizer; the VAE's own does not, and a wrapped optimizer
    would divide its gradients by the scale."""
    from tests import keras_examples

    user, images = keras_examples.vae()
    built = build(make_plan(user, images, hardware=cpu_hardware).replace(dtype_policy="mixed_float16"))
    assert not isinstance(built.model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert "left as your compile made it: your own train_step decides loss scaling" in str(built.plan.applied[-1])
    plain = build(make_plan(make_cnn(), make_images(), hardware=cpu_hardware).replace(dtype_policy="mixed_float16"))
    assert isinstance(plain.model.optimizer, keras.optimizers.LossScaleOptimizer)


class ScalesItsOwnLoss(keras.Model):
    """A train_step of the user's that scales its loss for the LossScaleOptimizer Keras gave the model."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(keras.ops.cast(self(x), "float32") - y))
            scaled = self.optimizer.scale_loss(loss)
        self.optimizer.apply(tape.gradient(scaled, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def users_float16_model(model_class=keras.Model, policy="mixed_float16", **compile_arguments):
    with dtype_policy_scope(policy):
        inputs = keras.Input((4,))
        outputs = keras.layers.Dense(2, dtype="float32")(keras.layers.Dense(8)(inputs))
        model = model_class(inputs, outputs)
        model.compile(**{"optimizer": "sgd", "loss": "mse", **compile_arguments})
    return model


def test_at_the_models_own_precision_its_optimizer_stays_as_it_was_made(cpu_hardware):
    """Keras' wrapper kept for a train_step of the user's that scales its loss; no wrapper where the user's compile
    said auto_scale_loss=False; the user's own wrapper under bfloat16 kept."""
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"))).batch(4)
    own_step = users_float16_model(ScalesItsOwnLoss)
    built = build(make_plan(own_step, data, hardware=cpu_hardware))
    assert isinstance(built.model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert not any("loss scaling" in str(step) for step in built.plan.applied)
    unscaled = users_float16_model(auto_scale_loss=False)
    assert type(build(make_plan(unscaled, data, hardware=cpu_hardware)).model.optimizer) is keras.optimizers.SGD
    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0**10)
    bfloat16 = users_float16_model(policy="mixed_bfloat16", optimizer=wrapped)
    kept = build(make_plan(bfloat16, data, hardware=cpu_hardware)).model.optimizer
    assert isinstance(kept, keras.optimizers.LossScaleOptimizer) and kept is not wrapped
    assert float(kept.initial_scale) == 2.0**10
    # Moved to bfloat16 by a recipe, the wrapper Keras made for float16 comes off.
    moved = build(make_plan(own_step, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert type(moved.model.optimizer) is keras.optimizers.SGD


def test_xla_is_said_off_for_a_model_compiled_to_run_eagerly(cpu_hardware):
    user = make_cnn()
    user.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", run_eagerly=True)
    plan = make_plan(user, make_images(), hardware=cpu_hardware)
    built = build(plan.with_compile(jit_compile=True).record("xla", "on"))
    assert built.model.run_eagerly and not built.model.jit_compile and not built.plan.jit_compile
    (xla,) = [step for step in built.plan.applied if step.recipe == "xla"]
    assert xla.skipped and "run_eagerly=True" in xla.detail


class OwnCompile(keras.Model):
    """A compile of its own with Keras' first three arguments, setting an attribute its train_step reads."""

    def compile(self, optimizer, loss, metrics=None):
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics)
        self.loss_scale = 0.5

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return self.loss_scale * super().compute_loss(x, y, y_pred, sample_weight, training=training)


def test_a_model_fn_model_is_compiled_by_its_own_compile_where_it_takes_the_arguments(cpu_hardware):
    def make():
        inputs = keras.Input((12, 12, 3))
        outputs = keras.layers.Dense(3, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
        return OwnCompile(inputs, outputs)

    user = make()
    user.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    built = build(make_plan(user, make_images(), hardware=cpu_hardware, model_fn=make))
    assert built.model is not user and built.model.loss_scale == 0.5
    assert np.isfinite(built.model.fit(make_images(), epochs=1, verbose=0).history["loss"][0])


def test_a_subclassed_model_keeps_its_own_policy_so_it_serves_what_the_user_feeds_it(cpu_hardware, tmp_path):
    """Its layers compute in bfloat16; the model itself (what its call() computes between them, and the input
    signature `export` writes) stays the user's: a float32 request once failed against a bfloat16 signature."""
    from tests import keras_examples

    user, data = keras_examples.distiller()
    built = build(make_plan(user, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    model = built.model
    assert model.dtype_policy.name == "float32" and model.input_dtype == "float32"
    assert {layer.compute_dtype for layer in model.student.layers[:-1]} == {"bfloat16"}
    model.export(tmp_path / "served", verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    x = next(iter(data))[0]
    np.testing.assert_allclose(served.serve(x), model.predict(x, verbose=0), rtol=1e-2, atol=1e-2)


class ClassToken(keras.Model):
    """A ViT's class token: a weight of the model's own, which its call() concatenates to a layer's outputs."""

    def __init__(self):
        super().__init__()
        self.proj = keras.layers.Dense(8)
        self.head = keras.layers.Dense(2)

    def build(self, input_shape):
        self.token = self.add_weight(shape=(1, 1, 8), initializer="zeros")

    def call(self, inputs):
        token = tf.tile(self.token, [tf.shape(inputs)[0], 1, 1])
        return self.head(tf.reduce_mean(tf.concat([token, self.proj(inputs)], 1), 1))


def test_a_model_mixing_weights_of_its_own_with_its_layers_computes_at_their_precision(cpu_hardware):
    user = ClassToken()
    user(np.zeros((2, 3, 4), "float32"))
    user.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((16, 3, 4), "float32"), np.ones((16, 2), "float32"))).batch(8)
    built = build(make_plan(user, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert built.model.compute_dtype == "bfloat16" and built.model.proj.compute_dtype == "bfloat16"
    assert np.isfinite(built.model.fit(built.dataset, epochs=1, verbose=0).history["loss"][0])


def _mlp():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def _mlp_in_float16():
    with dtype_policy_scope("mixed_float16"):
        return keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3, dtype="float32")]
        )


def _layers_of_one_name_in_two_models():
    """Keras asks unique names of a model's own layers only: the optimizer's slots of the two 'd' share a name."""
    inner_inputs = keras.Input((4,))
    inner = keras.Model(inner_inputs, keras.layers.Dense(4, name="d")(inner_inputs), name="inner")
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(keras.layers.Dense(4, name="d")(inner(inputs))))


@pytest.mark.parametrize("make", [_mlp, _mlp_in_float16, _layers_of_one_name_in_two_models])
def test_a_recipe_making_the_optimizer_again_starts_it_where_the_users_stood(make):
    """grad_accum makes the optimizer again from its config: a trained model's step count, moments and loss scale
    go on, each slot on its own variable, as they do where plain Keras trains on at the whole batch."""
    import tfopt
    from tests.conftest import FAKE_HARDWARE

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4)).astype("float32"), rng.integers(0, 3, 32).astype("int32")

    def data(batch_size):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)

    def trained():
        keras.utils.set_random_seed(0)
        model = make()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(True))
        model.fit(data(16), epochs=1, verbose=0)
        return model

    user, reference = trained(), trained()
    result = tfopt.apply(
        user, data(8), [{"grad_accum": {"steps": 2}}], hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False
    )
    scaled = isinstance(user.optimizer, keras.optimizers.LossScaleOptimizer)
    copied, theirs = result.model.optimizer, user.optimizer
    assert isinstance(copied, keras.optimizers.LossScaleOptimizer) is scaled
    if scaled:
        assert int(copied.step_counter) == int(theirs.step_counter) > 0
        assert float(copied.dynamic_scale) == float(theirs.dynamic_scale)
        copied, theirs = copied.inner_optimizer, theirs.inner_optimizer
    assert copied.gradient_accumulation_steps == 2 and int(copied.iterations) == int(theirs.iterations) == 2
    moments = [variable for variable in copied.variables if variable.path.endswith(("momentum", "velocity"))]
    expected = [variable for variable in theirs.variables if variable.path.endswith(("momentum", "velocity"))]
    assert len(moments) == len(expected) == 2 * len(user.trainable_variables)
    for variable, original in zip(moments, expected, strict=True):
        np.testing.assert_array_equal(variable.numpy(), original.numpy())
    if not scaled:  # float16 rounds the accumulated gradients otherwise than the whole batch's
        result.model.fit(result.dataset, epochs=1, verbose=0)
        reference.fit(data(16), epochs=1, verbose=0)
        for mine, whole in zip(result.model.get_weights(), reference.get_weights(), strict=True):
            np.testing.assert_allclose(mine, whole, rtol=1e-5, atol=1e-6)


def test_an_optimizer_made_again_keeps_the_folded_biases_slots_so_a_saved_copy_reloads_its_state(tmp_path):
    import warnings

    import tfopt
    from tests.conftest import FAKE_HARDWARE

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, name="conv")(inputs))
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x)))
    user = keras.Model(inputs, outputs)
    user.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="mse")
    data = tf.data.Dataset.from_tensor_slices((tf.ones((8, 8, 8, 3)), tf.ones((8, 2)))).batch(4)
    recipes = [{"fused_layers": {"batch_norm": False, "conv_bias": True}}, {"grad_accum": {"steps": 2}}]
    result = tfopt.apply(user, data, recipes, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    assert not result.model.get_layer("conv").bias.trainable  # folded
    result.model.fit(result.dataset, epochs=2, verbose=0)
    result.model.save(tmp_path / "copy.keras")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Keras warns where it skips the optimizer's state
        loaded = keras.saving.load_model(tmp_path / "copy.keras")
    assert int(loaded.optimizer.iterations) == 2
    for mine, theirs in zip(loaded.optimizer.variables, result.model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


def test_the_optimizer_the_build_compiles_with_decides_the_conv_bias_fold():
    """The build compiles after the rewrites: a model compiled with SGD and given compile= with Adam trains under
    Adam, which moves a cancelled bias in plain Keras, so it keeps its bias."""
    import tfopt
    from tests.conftest import FAKE_HARDWARE

    inputs = keras.Input((8, 8, 3))
    x = keras.layers.BatchNormalization()(keras.layers.Conv2D(4, 3, name="conv")(inputs))
    user = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.GlobalAveragePooling2D()(x)))
    user.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((tf.ones((8, 8, 8, 3)), tf.ones((8, 2)))).batch(4)
    recipes = [{"fused_layers": {"batch_norm": False, "conv_bias": True}}]
    compile = {"optimizer": keras.optimizers.Adam(0.01), "loss": "mse"}
    result = tfopt.apply(user, data, recipes, compile=compile, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    assert type(result.model.optimizer) is keras.optimizers.Adam and result.model.get_layer("conv").bias.trainable
    step = next(step for step in result.plan.applied if step.recipe == "fused_layers")
    assert step.skipped and "the optimizer (Adam) scales each update" in step.detail


def test_a_model_fn_returning_the_users_model_itself_is_refused_and_the_model_left_as_it_was(cpu_hardware):
    import tfopt

    user = make_cnn()
    with pytest.raises(IncompatibleModelError, match="model_fn returned a model tfopt already holds"):
        tfopt.apply(user, make_images(), hardware=cpu_hardware, model_fn=lambda: user, measure_speed=False)
    assert not user.optimizer.built and all(layer.dtype_policy.name == "float32" for layer in user.layers)


def test_a_model_fn_opening_its_own_strategy_scope_is_told_to_leave_placement_to_tfopt(cpu_hardware):
    import tfopt

    def make():
        with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
            return make_cnn()

    with pytest.raises(IncompatibleModelError, match=r"Take the `with strategy.scope\(\):` out of model_fn"):
        tfopt.apply(None, make_images(), hardware=cpu_hardware, model_fn=make, measure_speed=False)


def test_model_none_takes_the_compile_its_model_fn_makes(cpu_hardware):
    import tfopt

    def make():
        model = make_cnn(compiled=False)
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="sparse_categorical_crossentropy")
        return model

    result = tfopt.apply(None, make_images(), recipes=[], hardware=cpu_hardware, model_fn=make, measure_speed=False)
    assert type(result.model.optimizer) is keras.optimizers.SGD
    assert float(result.model.optimizer.learning_rate) == pytest.approx(0.05)
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])


def test_compile_given_the_models_own_trained_optimizer_goes_on_from_its_state():
    """As plain Keras goes on after `model.compile(optimizer=model.optimizer, loss=other)`."""
    import tfopt
    from tests.conftest import FAKE_HARDWARE

    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices((rng.random((32, 4), dtype=np.float32), rng.integers(0, 3, 32))).batch(8)
    summed = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    def trained():
        keras.utils.set_random_seed(0)
        model = _mlp()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=keras.losses.SparseCategoricalCrossentropy(True))
        model.fit(data, epochs=1, verbose=0)
        return model

    user, plain = trained(), trained()
    again = dict(optimizer=user.optimizer, loss=summed)
    result = tfopt.apply(user, data, [], compile=again, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    assert int(result.model.optimizer.iterations) == int(user.optimizer.iterations) == 4
    plain.compile(optimizer=plain.optimizer, loss=summed)
    mine = result.model.fit(data, epochs=1, verbose=0).history["loss"]
    assert mine == plain.fit(data, epochs=1, verbose=0).history["loss"]
    for a, b in zip(result.model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


class OwnStepAfterBuild(keras.Model):
    """A subclassed model with a train_step of its own, whose user calls `build(shape)` before `compile`."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        return self.head(self.hidden(inputs))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def test_a_model_built_from_a_shape_before_its_layers_ran_trains_as_fit_trains_it(cpu_hardware):
    """`Model.build(shape)` marks a subclassed model built and leaves its layers without variables: an optimizer
    built on its (no) trainable variables then refused the first step's. `fit` asks whether every layer is built."""
    import tfopt
    from tests.same_training import assert_same_training

    keras.utils.set_random_seed(0)
    user = OwnStepAfterBuild()
    user.build((None, 3))
    user.compile(optimizer="sgd", loss="mse")
    assert user.built and not user.weights
    features = np.random.default_rng(0).normal(size=(32, 3)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((features, features.sum(axis=1, keepdims=True))).batch(8)
    result = tfopt.apply(user, data, recipes=[], hardware=cpu_hardware, measure_speed=False)
    assert len(result.model.weights) == 4 and not user.weights
    assert_same_training(result, user, data)
