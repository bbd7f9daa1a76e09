"""The steps_per_execution recipe: N steps per call train as one per call does (history, weights, moving
statistics, dropout's random numbers), with the user's own train_step and compile too; "auto" keeps the fastest
number only where it measured faster than the setup's own in every round."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests.conftest import FAKE_HARDWARE
from tests.same_training import assert_same_training
from tfopt.builder import build
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.profiling.measurement import SideBySide
from tfopt.recipes import StepsPerExecution
from tfopt.registry import from_item
from tfopt.verdict import built_again, decided_alone

BUILD_ONLY = dict(measure_speed=False)
FOUR = [{"steps_per_execution": {"steps": 4}}]


def mlp(dropout=0.3):
    keras.utils.set_random_seed(5)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(dropout),
            keras.layers.BatchNormalization(name="norm"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def numbers(count=100, batch=8):
    """13 batches: 3 calls of 4 steps and one of 1, cut short by the epoch's end."""
    rng = np.random.default_rng(0)
    features = rng.normal(size=(count, 8)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((features, rng.integers(0, 3, count))).batch(batch)


def test_settings_are_checked():
    assert from_item("steps_per_execution") == StepsPerExecution(steps="auto")
    assert from_item({"steps_per_execution": {"steps": 8}}).steps == 8
    for wrong in ("many", 0, True, 2.5):
        with pytest.raises(
            RecipeConfigError, match=r"steps=.* is not valid\. Expected 'auto' or a whole number"
        ) as caught:
            StepsPerExecution(steps=wrong)
        assert caught.value.setting == "steps"


def test_the_copy_runs_four_steps_per_call_and_learns_as_one_per_call_does():
    user, data = mlp(), numbers()
    result = tfopt.apply(user, data, recipes=FOUR, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    assert result.model.steps_per_execution == 4 and user.steps_per_execution == 1
    assert result.plan.steps_per_call == 4
    step = next(step for step in result.plan.applied if step.recipe == "steps_per_execution")
    assert step.detail.startswith("4 training steps per call") and "Keras calls back once per call" in step.detail
    calls = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: calls.append(batch))
    result.model.fit(data.take(8), epochs=1, verbose=0, callbacks=[counter])
    assert calls == [3, 7]  # Keras calls back once per call, with the last step's index
    result = tfopt.apply(mlp(), data, recipes=FOUR, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    assert_same_training(result, user, data, epochs=3)
    for mine, theirs in zip(result.model.get_layer("norm").weights, user.get_layer("norm").weights, strict=True):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5)
    assert result.model.optimizer.iterations.numpy() == user.optimizer.iterations.numpy() == 3 * 13


def test_under_bfloat16_and_xla_it_learns_as_one_step_per_call_does():
    """The path a GPU keeps: bf16 + XLA forced, at 4 steps per call and at 1, from the same start."""
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}, {"xla": {"jit_compile": True}}]
    histories, weights = [], []
    for recipes in ([*forced, *FOUR], forced):
        result = tfopt.apply(mlp(), numbers(), recipes=recipes, hardware=FAKE_HARDWARE["cpu_bf16"], **BUILD_ONLY)
        assert result.plan.jit_compile and result.plan.dtype_policy == "mixed_bfloat16"
        histories.append(result.model.fit(result.dataset, epochs=3, verbose=0, shuffle=False).history)
        weights.append(result.model.get_weights())
    assert histories[0]["loss"][-1] < histories[0]["loss"][0]
    for name in histories[1]:
        np.testing.assert_allclose(histories[0][name], histories[1][name], rtol=1e-5)
    for mine, theirs in zip(*weights, strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


class OwnStep(keras.Model):
    """A model of the kind keras-io's GANs are: its own compile arguments and its own train_step."""

    def __init__(self):
        super().__init__()
        self.body = keras.layers.Dense(3)
        self.tracker = keras.metrics.Mean(name="loss")

    def compile(self, optimizer, loss_fn):
        super().compile(optimizer=optimizer)
        self.loss_fn = loss_fn

    def call(self, inputs):
        return self.body(inputs)

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        inputs, targets = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(targets, self(inputs, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


def test_a_model_with_its_own_compile_and_train_step_runs_four_steps_per_call():
    def own():
        keras.utils.set_random_seed(2)
        model = OwnStep()
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model(np.zeros((1, 8), "float32"))
        return model

    user, data = own(), numbers()
    result = tfopt.apply(own(), data, recipes=FOUR, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY)
    assert result.model.steps_per_execution == 4 and result.model.loss_fn is not None
    assert_same_training(result, user, data, epochs=2)


def test_auto_keeps_the_fastest_number_faster_in_every_round():
    plan = StepsPerExecution()(make_plan(mlp(), numbers(), hardware=FAKE_HARDWARE["cpu_plain"]))
    assert plan.applied[-1].detail.startswith("1 step(s) per call unless 4 or 16 measure faster side by side")
    own = build(plan)
    sides = [("at 1 step(s) per call", own)]
    sides += [(f"{n} steps per call", built_again(own, own.plan.with_compile(steps_per_execution=n))) for n in (4, 16)]
    assert [built.model.steps_per_execution for _, built in sides] == [1, 4, 16]
    assert sides[2][1].dataset is own.dataset and sides[2][1].model is not own.model

    def measured(four, sixteen):
        return SideBySide(measurements=(None,) * 3, rounds=((1.0, 1.0, 1.0), four, sixteen))

    fastest = decided_alone("steps_per_execution", sides, measured((2.0, 2.1, 1.9), (3.0, 2.9, 3.2)))
    assert fastest.model.steps_per_execution == 16 and fastest.plan.steps_per_call == 16
    assert fastest.plan.applied[-1].detail.endswith(
        "16 steps per call: kept: measured 3.00x [2.90-3.20] over 3 rounds against the same setup at 1 step(s) "
        f"per call on this machine ({FAKE_HARDWARE['cpu_plain'].describe()}) (beside 4 steps per call 2.00x "
        "[1.90-2.10])"
    )
    steady = decided_alone("steps_per_execution", sides, measured((1.3, 1.2, 1.4), (3.0, 0.9, 3.2)))
    assert steady.model.steps_per_execution == 4  # the fastest is not faster in every round: the next is kept
    neither = decided_alone("steps_per_execution", sides, measured((1.1, 0.9, 1.0), (1.2, 0.95, 1.3)))
    assert neither.model is own.model and neither.plan.steps_per_call == 1
    step = neither.plan.applied[-1]
    assert step.skipped and step.detail.startswith("16 steps per call: left out: measured 1.20x [0.95-1.30]")
    assert step.detail.endswith("within noise (beside 4 steps per call 1.00x [0.90-1.10])")


def test_auto_without_a_measurement_leaves_the_number_as_it_was_and_says_so():
    result = tfopt.apply(
        mlp(), numbers(), recipes=["steps_per_execution"], hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY
    )
    step = next(step for step in result.plan.applied if step.recipe == "steps_per_execution")
    assert step.skipped and step.detail == "not measured (measure_speed=False): 1 step(s) per call, as before"
    assert result.model.steps_per_execution == 1


def test_a_model_at_sixteen_steps_per_call_has_no_larger_number_to_try():
    model = mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=16)
    plan = StepsPerExecution()(make_plan(model, numbers(), hardware=FAKE_HARDWARE["cpu_plain"]))
    assert plan.steps_per_call == 16 and plan.applied[-1].skipped
    assert plan.applied[-1].detail == "the model runs 16 steps per call already: kept"


def test_auto_through_apply_measures_the_numbers_side_by_side():
    """A small model's step is short: the host's cost per call is much of it. Whichever way the measurement
    went on this shared machine, the plan says it with the ratio, and the model runs what the plan says."""
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    result = tfopt.apply(model, numbers(count=400), recipes=["steps_per_execution"], steps=32, warmup_steps=4)
    step = next(step for step in result.plan.applied if step.recipe == "steps_per_execution")
    median = float(re.search(r"measured (\d+\.\d+)x \[", step.detail).group(1))
    assert median > 1.0  # the best of 4 and 16 steps per call, over one per call (3-6x on a 2-core Xeon)
    if step.skipped:
        assert result.model.steps_per_execution == 1 and "left out: measured" in step.detail
    else:
        assert result.model.steps_per_execution in (4, 16) and "kept: measured" in step.detail
        assert (
            step.detail.startswith("1 step(s) per call unless 4 or 16")
            and f"{result.model.steps_per_execution} steps" in step.detail
        )
    assert result.after.real.window_steps % result.model.steps_per_execution == 0


def test_with_fused_layers_and_gradient_accumulation_it_learns_as_gradient_accumulation_alone_does():
    """The recipes decided on their own compose with the optimizer's accumulation: fused BatchNormalization,
    biases folded, 2 micro-batches per update and 4 steps per call train as Keras' own layers at one step
    per call with the same accumulation (each micro-batch normalised by its own statistics in both)."""
    from tests.conftest import make_images
    from tests.recipes.test_fused_layers import cnn
    from tfopt.rewrites.batch_norm import FusedBatchNormalization

    data = make_images(count=48, batch_size=8)  # 6 steps an epoch: calls of 4 and 2, 3 updates
    accumulated = [{"grad_accum": {"steps": 2}}]
    fused = [*accumulated, {"fused_layers": {"batch_norm": True, "conv_bias": True}}, *FOUR]
    histories, outputs = [], []
    for recipes in (fused, accumulated):
        result = tfopt.apply(
            cnn(use_bias=True), data, recipes=recipes, hardware=FAKE_HARDWARE["cpu_plain"], **BUILD_ONLY
        )
        assert (type(result.model.get_layer("bn0")) is FusedBatchNormalization) == (recipes is fused)
        assert result.model.optimizer.gradient_accumulation_steps == 2
        histories.append(result.model.fit(result.dataset, epochs=3, verbose=0, shuffle=False).history)
        assert result.model.optimizer.iterations.numpy() == 3 * 6 // 2
        # The folded biases live in the moving means: the models are compared by what they compute.
        outputs.append(np.concatenate([result.model(images, training=False) for images, _ in data]))
    np.testing.assert_allclose(histories[0]["loss"], histories[1]["loss"], rtol=2e-4)
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=2e-4, atol=2e-5)
