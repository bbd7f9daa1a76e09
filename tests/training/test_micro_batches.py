"""Out-of-memory recovery: a batch the device cannot hold trains as micro-batches with the same updates.

The allocation failures here are real: a layer asks TensorFlow's CPU allocator for more memory than the host
has (256 GiB) where its batch is larger than a chosen size, and TensorFlow answers as a GPU's allocator does,
with `ResourceExhaustedError` (after its allocator's 10 s of retrying, so each test provokes few of them).
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests.same_training import assert_same_training
from tfopt.builder import Built, build
from tfopt.errors import IncompatibleModelError, OutOfMemoryError, TfoptError
from tfopt.plan import make_plan
from tfopt.training import train
from tfopt.training.micro_batches import in_micro_batches, out_of_memory, split_batches

FORCED = [{"mixed_precision": {"policy": "mixed_bfloat16"}}, {"xla": {"jit_compile": True}}]


@keras.saving.register_keras_serializable("tfopt_tests")
class Hungry(keras.layers.Layer):
    """Passes its inputs on, after allocating 256 GiB where its batch holds more than `fits` examples.

    XLA folds the allocation away (it never materializes a filled tensor), so the layer is not for XLA."""

    def __init__(self, fits, **kwargs):
        super().__init__(**kwargs)
        self.fits = fits
        self.supports_jit = False

    def call(self, inputs):
        rows = tf.where(tf.shape(inputs)[0] > self.fits, 2**26, 1)
        filled = tf.fill(tf.stack([rows, 1024]), tf.reduce_mean(inputs))
        return inputs + 0.0 * tf.reduce_min(filled)

    def get_config(self):
        return {**super().get_config(), "fits": self.fits}


def regression(fits, optimizer=None, loss="mse", seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [keras.Input((4,)), Hungry(fits), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
    )
    model.compile(optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    return model


def regression_data(examples=64, batch_size=16, shuffled=False):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [0.3]], "float32")).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y))
    return (data.shuffle(examples, seed=1) if shuffled else data).batch(batch_size)


def plain_twin(model):
    """The same model and weights, its Hungry layer never hungry: what plain Keras trains on a big enough device."""
    twin = regression(fits=10**9)
    twin.set_weights(model.get_weights())
    return twin


@pytest.mark.parametrize(
    ("batch", "pieces", "expected"),
    [
        (tf.data.Dataset.range(8).batch(4, drop_remainder=True), 2, [[0, 1], [2, 3], [4, 5], [6, 7]]),
        (tf.data.Dataset.range(10).batch(4), 2, [[0, 1], [2, 3], [4, 5], [6, 7], [8], [9]]),
        (tf.data.Dataset.range(9).batch(6), 3, [[0, 1], [2, 3], [4, 5], [6], [7], [8]]),
    ],
    ids=["static", "short_last_batch", "three_pieces"],
)
def test_split_batches_cuts_each_batch_into_consecutive_pieces(batch, pieces, expected):
    split = split_batches(batch, pieces)
    assert [piece.numpy().tolist() for piece in split] == expected
    assert int(split.cardinality()) == len(expected)


def test_split_batches_keeps_structures_and_static_shapes():
    features = {"a": tf.reshape(tf.range(24.0), (8, 3)), "b": tf.range(8)}
    data = tf.data.Dataset.from_tensor_slices((features, tf.range(8) * 10, tf.ones(8))).batch(8, drop_remainder=True)
    split = split_batches(data, 4)
    assert split.element_spec[0]["a"].shape.as_list() == [2, 3]  # static: what XLA compiles once
    pieces = list(split)
    assert len(pieces) == 4
    np.testing.assert_array_equal(np.concatenate([p[0]["a"] for p in pieces]), features["a"].numpy())
    assert [p[1].numpy().tolist() for p in pieces] == [[0, 10], [20, 30], [40, 50], [60, 70]]
    assert all(p[2].shape == (2,) for p in pieces)


def test_out_of_memory_is_found_in_the_error_or_what_it_was_raised_from():
    try:
        tf.fill([2**36], 1.0)  # 256 GiB
    except tf.errors.ResourceExhaustedError as error:
        exhausted = error
    assert out_of_memory(exhausted) is exhausted
    try:
        try:
            raise exhausted
        except tf.errors.ResourceExhaustedError as cause:
            raise TfoptError("Training failed") from cause
    except TfoptError as wrapped:
        assert out_of_memory(wrapped) is exhausted
    unallocated = tf.errors.InternalError(None, None, "Dst tensor is not initialized.")
    assert out_of_memory(unallocated) is unallocated
    assert out_of_memory(ValueError("shapes do not match")) is None
    assert out_of_memory(tf.errors.InternalError(None, None, "cuDNN launch failure")) is None


def test_a_batch_that_does_not_fit_trains_as_micro_batches_with_plain_kerass_updates(cpu_hardware):
    model = regression(fits=8)
    data = regression_data()
    before = [weight.copy() for weight in model.get_weights()]
    twin = plain_twin(model)

    result = tfopt.apply(model, data, recipes=["data_pipeline"], hardware=cpu_hardware, measure_speed=False)

    (users,) = [step.detail for step in result.baseline_plan.applied if step.recipe == "micro_batches"]
    assert "the batch of 16 does not fit the device (ResourceExhaustedError: OOM when allocating" in users
    (step,) = [step.detail for step in result.plan.applied if step.recipe == "micro_batches"]
    assert "the batch of 16 does not fit the device (your setup ran out of memory on it)" in step
    assert "2 micro-batches of 8 whose gradients make one update" in step
    assert (result.plan.batch_size, result.plan.micro_batches) == (8, 2)
    assert result.model.optimizer.gradient_accumulation_steps == 2
    assert result.baseline_plan.micro_batches == 2  # the user's setup cannot hold the batch either
    pieces = list(result.dataset)
    assert [int(piece[0].shape[0]) for piece in pieces] == [8] * 8
    np.testing.assert_array_equal(np.concatenate([piece[0] for piece in pieces]), np.concatenate([x for x, _ in data]))
    for mine, theirs in zip(model.get_weights(), before):
        np.testing.assert_array_equal(mine, theirs)  # the user's model is never trained

    assert_same_training(result, twin, data, epochs=3)
    assert int(result.model.optimizer.iterations.numpy()) == 3 * 4  # updates: one per batch of 16


def test_a_model_at_four_steps_per_call_keeps_them_in_micro_batches(cpu_hardware):
    """A model the user runs at 4 steps per call (set on it, not through compile) keeps its number, which now
    counts micro-batches: the first-batch check runs the 2 pieces of its batch in one call, and the copy
    trains as plain Keras does (16 micro-batches an epoch: whole calls)."""
    model = regression(fits=8)
    model.steps_per_execution = 4
    twin = plain_twin(model)
    result = tfopt.apply(
        model, regression_data(), recipes=["data_pipeline"], hardware=cpu_hardware, measure_speed=False
    )
    assert (result.plan.micro_batches, result.model.steps_per_execution) == (2, 4)
    assert result.model.get_compile_config()["steps_per_execution"] == 4
    assert_same_training(result, twin, regression_data(), epochs=2)
    assert int(result.model.optimizer.iterations.numpy()) == 2 * 4


def test_bf16_and_xla_forced_keep_the_micro_batches(cpu_hardware):
    model = regression(fits=8)
    result = tfopt.apply(model, regression_data(), recipes=FORCED, hardware=cpu_hardware, measure_speed=False)

    assert (result.plan.batch_size, result.plan.micro_batches, result.plan.dtype_policy) == (8, 2, "mixed_bfloat16")
    xla = [step for step in result.plan.applied if step.recipe == "xla"][-1]
    assert xla.skipped and "does not support XLA" in xla.detail  # the hungry layer, by its own flag
    history = result.model.fit(result.dataset, epochs=2, verbose=0).history
    assert np.all(np.isfinite(history["loss"])) and history["loss"][1] < history["loss"][0]
    assert int(result.model.optimizer.iterations.numpy()) == 2 * 4


def test_resumed_training_counts_updates_and_ends_where_an_uninterrupted_run_does(cpu_hardware, tmp_path):
    model = regression(fits=8)
    data = regression_data()
    uninterrupted = tfopt.apply(model, data, recipes=[], hardware=cpu_hardware, measure_speed=False)
    whole = train(_built(uninterrupted), epochs=2)
    assert (whole.steps_per_epoch, whole.global_step) == (4, 8)

    # Built again from the plan that fits (from the user's weights), as a restarted run's apply would build it.
    stopped = train(build(uninterrupted.plan), epochs=1, checkpoint_dir=tmp_path, checkpoint_every_steps=3)
    assert (stopped.global_step, stopped.last_checkpoint.rsplit("-", 1)[1]) == (4, "4")
    assert sorted(path.name for path in tmp_path.glob("ckpt-*.index")) == ["ckpt-3.index", "ckpt-4.index"]
    again = build(uninterrupted.plan)
    resumed = train(again, epochs=2, checkpoint_dir=tmp_path)

    assert (resumed.resumed_from_step, resumed.steps_run, resumed.global_step) == (4, 4, 8)
    np.testing.assert_allclose(resumed.history["loss"], whole.history["loss"][1:], rtol=1e-6)
    for mine, theirs in zip(again.model.get_weights(), uninterrupted.model.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_a_static_xla_pipeline_is_cut_after_its_short_batch_is_dropped(cpu_hardware):
    model = regression(fits=10**9)
    model.layers[0].supports_jit = True  # never hungry: XLA may compile it
    data = regression_data(examples=60, shuffled=True)  # a last batch of 12, of other examples each epoch
    plan = make_plan(model, data, hardware=cpu_hardware).with_compile(jit_compile=True)

    built = build(in_micro_batches(plan, 4, "a test's words"))

    assert built.dataset.element_spec[0].shape.as_list() == [4, 4]
    assert [int(piece[0].shape[0]) for piece in built.dataset] == [4] * 12  # 3 whole batches; the 12 dropped
    xla = next(step.detail for step in built.plan.applied if step.recipe == "xla")
    assert "batches of 16 kept full" in xla and "the last 12 examples of each pass are dropped" in xla


def test_a_summed_loss_cannot_be_accumulated_and_says_what_to_do(cpu_hardware):
    model = regression(fits=8, loss=keras.losses.MeanSquaredError(reduction="sum"))
    with pytest.raises(OutOfMemoryError) as raised:
        tfopt.apply(model, regression_data(), recipes=[], hardware=cpu_hardware, measure_speed=False)
    message = str(raised.value)
    assert "The batch of 16 does not fit the device (ResourceExhaustedError" in message
    assert "reduction='sum'" in message and "Lower the batch size" in message


def test_a_model_that_does_not_fit_one_example_says_so(cpu_hardware):
    model = regression(fits=0)
    with pytest.raises(OutOfMemoryError, match="micro-batches of one example too"):
        tfopt.apply(model, regression_data(batch_size=2), recipes=[], hardware=cpu_hardware, measure_speed=False)


def test_a_train_step_with_optimizers_of_its_own_is_not_split(cpu_hardware):
    class OwnOptimizer(keras.Sequential):
        """A train_step that applies an optimizer of its own, as a GAN's does, leaving `self.optimizer` unused."""

        def compile(self, **kwargs):
            super().compile(**kwargs)
            self.own = keras.optimizers.SGD(0.1)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
            self.own.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"loss": loss}

    keras.utils.set_random_seed(0)
    model = OwnOptimizer([keras.Input((4,)), Hungry(8), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(IncompatibleModelError, match="made 0 updates where one was due"):
        tfopt.apply(model, regression_data(), recipes=[], hardware=cpu_hardware, measure_speed=False)


def _built(result):
    return Built(model=result.model, dataset=result.dataset, strategy=result.strategy, plan=result.plan)


HUNGRY_MODELS = """
import json

import keras

from tests.training.test_micro_batches import Hungry


def hungry_classifier(input_shape, classes, fits):
    return keras.Sequential(
        [keras.Input(input_shape), keras.layers.Flatten(), Hungry(fits), keras.layers.Dense(classes, "softmax")]
    )
"""


def test_tfopt_recipe_run_trains_micro_batches_and_reports_them(tmp_path, capsys):
    from tfopt.cli import main

    (tmp_path / "oom_test_models.py").write_text(HUNGRY_MODELS)
    (tmp_path / "recipe.yaml").write_text(
        "model: {name: 'oom_test_models:hungry_classifier', fits: 4}\n"
        "data: {source: synthetic, kind: image, examples: 32, image_size: [8, 8], batch_size: 8}\n"
        "train: {epochs: 2}\nrecipes: [data_pipeline]\nprofile: {steps: 2, warmup_steps: 1}\n"
    )
    run_dir = tmp_path / "run"
    code = main(["run", str(tmp_path / "recipe.yaml"), "--out", str(run_dir), "--quiet"])
    err = capsys.readouterr().err
    assert code == 0, err
    report = json.loads((run_dir / "report.json").read_text())
    (step,) = [step for step in report["applied"] if step["recipe"] == "micro_batches"]
    assert "the batch of 8 does not fit the device" in step["detail"] and "2 micro-batches of 4" in step["detail"]
    assert "micro_batches" in (run_dir / "report.md").read_text()
    training = json.loads((run_dir / "training.json").read_text())
    # Steps count the recipe's batches of 8 (updates), as a run that fits counts them.
    assert (training["steps_per_epoch"], training["global_step"], len(training["history"]["loss"])) == (4, 8, 2)
