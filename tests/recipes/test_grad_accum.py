import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import make_cnn, make_images
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes.grad_accum import GradAccum, with_gradient_accumulation

MICRO_BATCH, STEPS, UPDATES = 4, 4, 2


def dense_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(2)])


def data():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(MICRO_BATCH * STEPS * UPDATES, 5)).astype("float32")
    y = rng.normal(size=(MICRO_BATCH * STEPS * UPDATES, 2)).astype("float32")
    return x, y


def train(optimizer, batch_size, reduction="sum_over_batch_size"):
    model = dense_model()
    model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction=reduction))
    x, y = data()
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size), epochs=1, verbose=0)
    return model


# IEEE float32 with a different summation order: equal to ~1e-7 relative; 1e-5 leaves room for Adam's sqrt.
@pytest.mark.parametrize(
    "optimizer",
    [lambda: keras.optimizers.SGD(0.1, momentum=0.9), lambda: keras.optimizers.Adam(0.01)],
    ids=["sgd", "adam"],
)
def test_accumulated_micro_batches_equal_one_large_batch(optimizer, ieee_float32):
    accumulated = train(with_gradient_accumulation(optimizer(), STEPS), MICRO_BATCH)
    large = train(optimizer(), MICRO_BATCH * STEPS)
    initial = dense_model()
    assert int(accumulated.optimizer.iterations.numpy()) == int(large.optimizer.iterations.numpy()) == UPDATES
    for got, expected, start in zip(accumulated.weights, large.weights, initial.weights, strict=True):
        assert not np.allclose(expected.numpy(), start.numpy())  # the updates did move the weights
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_sum_reduction_gives_one_nth_of_the_update():
    """Why the recipe rejects reduction='sum': Keras divides the accumulated gradients by N anyway."""
    initial = dense_model()
    accumulated = train(with_gradient_accumulation(keras.optimizers.SGD(0.001), STEPS), MICRO_BATCH, "sum")
    large = train(keras.optimizers.SGD(0.001), MICRO_BATCH * STEPS, "sum")
    first_update_accumulated = accumulated.weights[0].numpy() - initial.weights[0].numpy()
    first_update_large = large.weights[0].numpy() - initial.weights[0].numpy()
    ratio = np.linalg.norm(first_update_large) / np.linalg.norm(first_update_accumulated)
    assert ratio == pytest.approx(STEPS, rel=0.05)


def plan_for(model=None, loss="sparse_categorical_crossentropy", optimizer=None):
    from tfopt.hardware import Hardware

    model = model or make_cnn(compiled=False)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05), loss=loss)
    return make_plan(model, make_images(batch_size=8), hardware=Hardware())


def test_recipe_sets_accumulation_steps_and_records_effective_batch():
    plan = plan_for()
    result = GradAccum(effective_batch_size=32, scale_learning_rate="linear")(plan)
    config = result.compile_config["optimizer"]["config"]
    assert config["gradient_accumulation_steps"] == 4
    assert config["learning_rate"] == pytest.approx(0.2)
    assert "accumulates 4 micro-batches of 8" in result.applied[-1].detail
    assert "learning rate 0.05 -> 0.2" in result.applied[-1].detail
    assert plan.compile_config["optimizer"]["config"]["gradient_accumulation_steps"] is None  # pure
    assert result.batch_size == plan.batch_size  # each step still feeds one micro-batch


def test_an_optimizer_accumulating_already_counts_in_the_effective_batch_and_the_learning_rate():
    """The user's SGD accumulates 2 batches of 8: an update stands for 16, and effective_batch_size=32 takes 2 of
    them (it took 4, and said each update stood for 32 where it stood for 64)."""
    from tfopt.builder import build

    plan = plan_for(optimizer=keras.optimizers.SGD(0.05, gradient_accumulation_steps=2))
    result = GradAccum(effective_batch_size=32, scale_learning_rate="linear")(plan)
    config = result.compile_config["optimizer"]["config"]
    assert config["gradient_accumulation_steps"] == 4 and config["learning_rate"] == pytest.approx(0.1)
    assert "accumulates 4 micro-batches of 8: each update stands for a batch of 32" in result.applied[-1].detail
    assert "accumulates 8 micro-batches of 8" in GradAccum(steps=4)(plan).applied[-1].detail
    with pytest.raises(RecipeConfigError, match=r"of the batch size 16 \(8 accumulated 2 at a time by your optimizer"):
        GradAccum(effective_batch_size=24).check(plan)
    built = build(result)
    built.model.fit(built.dataset, epochs=1, verbose=0)  # the 4 batches of 8: one update of 32
    assert int(built.model.optimizer.iterations.numpy()) == 1


def test_updates_crossing_passes_are_said():
    """Keras counts micro-batches across epochs: 4 per pass in updates of 3 leaves one to the next pass's update."""
    plan = plan_for()
    assert len(plan.dataset) == 4
    assert "not a multiple" not in GradAccum(steps=2)(plan).applied[-1].detail
    assert (
        "a pass holds 4 micro-batches, not a multiple of 3: the last 1 of each pass go into an update with the next "
        "pass's first" in GradAccum(steps=3)(plan).applied[-1].detail
    )


def test_built_model_accumulates():
    from tfopt.builder import build

    built = build(GradAccum(steps=2)(plan_for()))
    built.model.fit(built.dataset, epochs=1, verbose=0)  # 4 micro-batches
    assert built.model.optimizer.gradient_accumulation_steps == 2
    assert int(built.model.optimizer.iterations.numpy()) == 2


@pytest.mark.parametrize(
    "settings, words",
    [
        ({"steps": 1}, "Expected an integer >= 2"),
        ({"effective_batch_size": 1}, "effective_batch_size=1"),
        ({"scale_learning_rate": "cubic"}, "Expected one of 'none', 'linear', 'sqrt'"),
    ],
)
def test_bad_settings(settings, words):
    with pytest.raises(RecipeConfigError, match=words):
        GradAccum(**settings)


def test_effective_batch_must_be_a_multiple():
    with pytest.raises(RecipeConfigError, match=r"effective_batch_size=20 is not a multiple .* of the batch size 8"):
        GradAccum(effective_batch_size=20).check(plan_for())


@pytest.mark.parametrize("reduction", ["sum", "mean_with_sample_weight", "none", None])
def test_a_reduction_whose_accumulated_update_is_not_the_large_batchs_is_rejected(reduction):
    """ "sum", and no reduction (one loss per example, summed into the gradient): Keras divides the accumulated
    gradients by N anyway. "mean_with_sample_weight": each micro-batch is divided by its own weights' sum (masked
    tokens count likewise), not by the large batch's."""
    plan = plan_for(loss=keras.losses.SparseCategoricalCrossentropy(reduction=reduction))
    with pytest.raises(RecipeConfigError, match=f"reduction={reduction!r}"):
        GradAccum().check(plan)


def test_functional_form_wraps_inner_optimizer_of_loss_scaling():
    wrapped = with_gradient_accumulation(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), 3)
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.inner_optimizer.gradient_accumulation_steps == 3


def test_sum_reduction_on_any_output_is_rejected(cpu_hardware):
    inputs = keras.Input((4,))
    model = keras.Model(
        inputs, {"o1": keras.layers.Dense(1, name="o1")(inputs), "o2": keras.layers.Dense(1, name="o2")(inputs)}
    )
    model.compile(
        "sgd", loss={"o1": keras.losses.MeanSquaredError(), "o2": keras.losses.MeanSquaredError(reduction="sum")}
    )
    x, y = np.ones((16, 4), "float32"), np.ones((16, 1), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, {"o1": y, "o2": y})).batch(8)
    with pytest.raises(RecipeConfigError, match="reduction='sum'"):
        GradAccum(steps=2).check(make_plan(model, data, hardware=cpu_hardware))


def test_a_learning_rate_schedule_is_rejected():
    """Keras 3 calls the schedule with the micro-batches counted: it would run N times faster than for the large
    batch (measured: after 2 updates of 2 micro-batches a piecewise schedule had already dropped)."""
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([1], [0.5, 0.0])
    with pytest.raises(RecipeConfigError, match=r"the learning rate is a schedule \(PiecewiseConstantDecay\)"):
        GradAccum(steps=2).check(plan_for(optimizer=keras.optimizers.SGD(schedule)))
    optimizer = keras.optimizers.SGD(schedule, gradient_accumulation_steps=2)
    assert float(optimizer._get_current_learning_rate()) == 0.5
    optimizer._iterations.assign(2)  # two micro-batches in: one update
    assert int(optimizer.iterations) == 1 and float(schedule(1)) == 0.5
    assert float(optimizer._get_current_learning_rate()) == 0.0  # Keras' trap: the schedule read at step 2


def test_a_train_step_applying_optimizers_of_its_own_is_refused(cpu_hardware):
    import tfopt
    from tests import keras_examples

    user, data = keras_examples.conditional_gan()
    with pytest.raises(RecipeConfigError, match="applies its optimizers d_optimizer, g_optimizer, not the one"):
        tfopt.apply(user, data, [{"grad_accum": {"steps": 2}}], hardware=cpu_hardware, measure_speed=False)


def test_an_optimizer_keeping_a_moving_average_is_refused():
    """Keras moves the average at every micro-batch, and fit writes it into the weights at its end."""
    with pytest.raises(RecipeConfigError, match=r"moving average of the weights \(use_ema=True\)"):
        GradAccum().check(plan_for(optimizer=keras.optimizers.Adam(use_ema=True)))


def embedding_model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4), keras.layers.Flatten(), keras.layers.Dense(1)]
    )


def train_embedding(optimizer, batch_size):
    model = embedding_model()
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 10, size=(MICRO_BATCH * STEPS * UPDATES, 3)).astype("int32")  # ids repeat within a batch
    targets = rng.normal(size=(len(ids), 1)).astype("float32")
    model.fit(tf.data.Dataset.from_tensor_slices((ids, targets)).batch(batch_size), epochs=1, verbose=0)
    return model.get_weights()


@pytest.mark.parametrize(
    "optimizer, why",
    [
        (lambda: keras.optimizers.SGD(0.1, momentum=0.9), None),
        (lambda: keras.optimizers.Adam(0.01), "which Adam applies slice by slice"),
        (lambda: keras.optimizers.SGD(0.1, clipvalue=0.001), r"clipping \(clipvalue=0.001\) measures slice by slice"),
    ],
    ids=["sgd", "adam", "sgd_clipped"],
)
def test_sparse_gradients_accumulate_to_the_large_batchs_update_for_sgd_alone(optimizer, why, ieee_float32):
    """Keras applies an Embedding's gradient (`tf.IndexedSlices`) a slice per id looked up: Adam squares each
    slice of an id looked up several times before they add up, and clipping measures each; an accumulated
    gradient is dense, each id's slices summed first. So the recipe accepts an Embedding beside SGD without
    clipping and refuses it beside the others."""
    accumulated = train_embedding(with_gradient_accumulation(optimizer(), STEPS), MICRO_BATCH)
    large = train_embedding(optimizer(), MICRO_BATCH * STEPS)
    close = [np.allclose(got, expected, rtol=1e-5, atol=1e-6) for got, expected in zip(accumulated, large, strict=True)]
    assert all(close) if why is None else not all(close)
    model = embedding_model()
    plan = plan_for(model=model, loss="mse", optimizer=optimizer())
    if why is None:
        GradAccum().check(plan)
    else:
        with pytest.raises(RecipeConfigError, match=r"Embedding 'embedding.*' get\(s\) sparse gradients, .* " + why):
            GradAccum().check(plan)


def test_weights_breaking_their_own_constraint_are_refused(ieee_float32):
    """Keras applies constraints after every micro-batch: the first update's later micro-batches are computed at
    the constrained weights (an update 2e-2 off the large batch's). Weights that keep it accumulate as one batch."""

    def constrained(broken):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((5,))
        kernel = keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg(), name="kept")
        model = keras.Model(inputs, kernel(inputs))
        if not broken:
            kernel.kernel.assign(abs(kernel.kernel))
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
        return model

    x, y = data()
    for broken in (True, False):
        weights = {}
        for name, optimizer, batch in (
            ("accumulated", with_gradient_accumulation(keras.optimizers.SGD(0.5), STEPS), MICRO_BATCH),
            ("large", keras.optimizers.SGD(0.5), MICRO_BATCH * STEPS),
        ):
            model = constrained(broken)
            model.compile(optimizer=optimizer, loss="mse")
            model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), epochs=1, verbose=0)
            weights[name] = model.get_weights()[0]
        assert np.allclose(weights["accumulated"], weights["large"], rtol=1e-5, atol=1e-6) is not broken
    with pytest.raises(RecipeConfigError, match=r"break their own constraint \(kept/kernel: NonNeg\)"):
        GradAccum().check(plan_for(model=constrained(True), loss="mse"))
    GradAccum().check(plan_for(model=constrained(False), loss="mse"))
    # A norm constraint rescales weights that keep it by 1 +- 1e-7: kept, within rounding.
    inputs = keras.Input((5,))
    bounded = keras.Model(inputs, keras.layers.Dense(2, kernel_constraint=keras.constraints.MaxNorm(3.0))(inputs))
    GradAccum().check(plan_for(model=bounded, loss="mse"))


def test_what_exclude_from_weight_decay_set_goes_into_the_accumulating_optimizer(cpu_hardware, ieee_float32):
    """No optimizer config holds the variables or names excluded from weight decay: tfopt's copy of the model
    kept the original's variables excluded (so its own decayed), and the optimizer the recipe makes again from
    the config excluded nothing."""
    import tfopt

    def compiled(model):
        optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
        optimizer.exclude_from_weight_decay(var_list=model.layers[0].weights[:1], var_names=["bias"])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    x, y = data()
    result = tfopt.apply(
        compiled(dense_model()),
        tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH),
        [{"grad_accum": {"steps": STEPS}}],
        hardware=cpu_hardware,
        measure_speed=False,
    )
    result.model.fit(result.dataset, epochs=1, verbose=0)
    large = compiled(dense_model())
    large.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(MICRO_BATCH * STEPS), epochs=1, verbose=0)
    for got, expected in zip(result.model.weights, large.weights, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
