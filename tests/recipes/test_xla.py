"""XLA is set explicitly, left off on CPU by 'auto', and refused with the layer named when unsupported."""

import collections
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.builder import build, xla_blockers
from tfopt.data.batches import static_batches
from tfopt.plan import make_plan
from tfopt.recipes.batch_size import BatchSize
from tfopt.recipes.xla import Xla

REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


class NoJitLayer(keras.layers.Layer):
    """A layer that declares it cannot be compiled with XLA, as TextVectorization does."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_jit = False

    def call(self, inputs):
        return inputs


def model_with_unsupported_layer():
    inputs = keras.Input((12, 12, 3))
    x = NoJitLayer(name="no_jit")(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(x))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("machine", ["cpu_bf16", "cpu_plain"])
def test_auto_is_off_on_cpu_with_reason(machine):
    hardware = FAKE_HARDWARE[machine]
    plan = Xla()(make_plan(make_cnn(), make_images(), hardware=hardware))
    assert plan.jit_compile is False
    detail = plan.applied[-1].detail
    assert plan.applied[-1].skipped and f"no GPU or TPU ({hardware.describe()})" in detail
    # The plan once claimed "XLA measured about 2x slower on CPU" on every machine: a figure from one.
    assert "measured" not in detail and "2x" not in detail and "jit_compile: true" in detail


@pytest.mark.parametrize("machine", ["a100", "tpu"])
def test_auto_is_on_for_accelerators(machine):
    plan = Xla()(make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE[machine]))
    assert plan.jit_compile is True and plan.compile_config["jit_compile"] is True


def test_forced_xla_compiles_and_trains_on_cpu(cpu_hardware):
    plan = Xla(jit_compile=True)(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    model = build(plan).model
    assert model.jit_compile is True and model.get_compile_config()["jit_compile"] is True  # a saved copy's too
    loss = model.fit(make_images(), epochs=1, verbose=0).history["loss"][0]
    assert np.isfinite(loss)


def test_unsupported_layer_is_named_and_the_build_compiles_without_xla():
    # 20 examples in batches of 8: XLA would have dropped the last 4, which without XLA are kept.
    plan = Xla()(
        make_plan(model_with_unsupported_layer(), make_images(count=20, batch_size=8), hardware=FAKE_HARDWARE["a100"])
    )
    assert plan.jit_compile is True  # the recipe decides without building a model
    built = build(plan)
    assert built.model.jit_compile is False and built.plan.jit_compile is False
    assert built.plan.applied[-1].skipped and "'no_jit' (NoJitLayer)" in built.plan.applied[-1].detail
    assert [int(x.shape[0]) for x, _ in built.dataset] == [8, 8, 4]
    assert np.isfinite(built.model.fit(built.dataset, epochs=1, verbose=0).history["loss"][0])


def test_the_recipe_builds_no_model():
    plan = make_plan(model_with_unsupported_layer(), make_images(), hardware=FAKE_HARDWARE["a100"])
    calls = []
    counting = plan.replace(model_fn=lambda: calls.append(1) or plan.model_fn())
    assert Xla()(counting).jit_compile is True and calls == []
    build(Xla()(counting))
    assert calls == [1]  # the one build


def test_op_without_xla_kernel_is_reported():
    inputs = keras.Input((4,))
    outputs = keras.layers.Lambda(
        lambda x: keras.ops.cast(
            keras.ops.convert_to_tensor(__import__("tensorflow").strings.as_string(x)) != "", "float32"
        )
    )(inputs)
    model = keras.Model(inputs, outputs)
    blockers = xla_blockers(model, np.zeros((2, 4), "float32"))
    assert len(blockers) == 1 and "XLA could not compile" in blockers[0]


def test_off_is_explicit_false(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    assert plan.compile_config["jit_compile"] is False  # the honest baseline
    assert Xla(jit_compile=False)(plan).compile_config["jit_compile"] is False


def compiled_with_xla(jit_compile):
    model = make_cnn()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", jit_compile=jit_compile)
    return model


@pytest.mark.parametrize("machine", ["cpu_bf16", "h100"])
def test_auto_keeps_the_xla_the_user_chose(machine):
    """The baseline is the user's XLA too, and their own XLA trains on their batches, partial ones included. Keras
    keeps only what its compile made of "auto" on this machine: a choice is told apart where it differs."""
    data = make_images(count=20, batch_size=8)
    chosen = not make_cnn()._resolve_auto_jit_compile()  # False on a GPU host, True on a CPU-only one
    arguments = {"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"}
    for own in (True, False):
        for baseline in (
            make_plan(
                make_cnn(compiled=False),
                data,
                hardware=FAKE_HARDWARE[machine],
                compile=arguments | {"jit_compile": own},
            ),
            *([make_plan(compiled_with_xla(own), data, hardware=FAKE_HARDWARE[machine])] if own is chosen else []),
        ):
            assert baseline.jit_compile is own
            plan = Xla()(baseline)
            step = plan.applied[-1]
            assert plan.jit_compile is own and step.skipped is not own
            assert f"jit_compile={own} kept, as your compile set it" in step.detail
            built = build(plan)
            assert built.model.jit_compile is own and [int(x.shape[0]) for x, _ in built.dataset] == [8, 8, 4]
    left = make_plan(compiled_with_xla(not chosen), data, hardware=FAKE_HARDWARE[machine])  # reads as "auto"
    assert left.jit_compile is False and "kept, as your compile set it" not in str(Xla()(left).applied[-1])
    asked = Xla(jit_compile=True)(make_plan(compiled_with_xla(False), data, hardware=FAKE_HARDWARE[machine]))
    assert asked.jit_compile is True  # a recipe set explicitly is asked for too, later than the compile


def reshuffled_images(count, batch_size):
    """Images reshuffled each pass before batching: the partial batch holds other examples each epoch."""
    images, labels = next(iter(make_images(count=count, batch_size=count)))
    return tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(count, seed=1).batch(batch_size)


def test_the_build_keeps_batch_shapes_static_under_xla_and_says_what_it_drops():
    # 20 examples in batches of 8: the last batch of 4 compiled the XLA step again every epoch.
    plan = Xla()(make_plan(make_cnn(), reshuffled_images(20, 8), hardware=FAKE_HARDWARE["h100"]))
    assert plan.jit_compile is True and plan.dataset.element_spec[0].shape[0] is None  # the recipe only decides
    built = build(plan)
    assert built.dataset.element_spec[0].shape.as_list() == [8, 12, 12, 3]
    assert [int(x.shape[0]) for x, _ in built.dataset] == [8, 8] and len(built.dataset) == 2
    assert built.plan.applied[-1].recipe == "xla"
    assert "the last 4 examples of each pass are dropped" in built.plan.applied[-1].detail


def test_a_partial_batch_of_the_same_examples_every_epoch_is_kept_under_xla():
    """An unshuffled pipeline (keras.io's timeseries_dataset_from_array, say) ends each pass in the same examples:
    dropped for XLA's full batches, they would never be trained on, where plain Keras trains them every epoch."""
    for data in (
        make_images(count=20, batch_size=8),
        make_images(count=20, batch_size=8).shuffle(3, seed=1),  # batches shuffled: the same 4 in the partial one
    ):
        built = build(Xla()(make_plan(make_cnn(), data, hardware=FAKE_HARDWARE["h100"])))
        assert built.model.jit_compile is True and sorted(int(x.shape[0]) for x, _ in built.dataset) == [4, 8, 8]
        step = built.plan.applied[-1]
        assert "partial batch of 4 examples that ends each pass is kept" in step.detail
        assert "shuffle before .batch()" in step.detail


def test_full_static_batches_are_built_as_they_are():
    data = make_images(count=16, batch_size=8).unbatch().batch(8, drop_remainder=True)
    plan = Xla(jit_compile=True)(make_plan(make_cnn(), data, hardware=FAKE_HARDWARE["cpu_bf16"]))
    built = build(plan)
    assert built.dataset is plan.dataset and built.plan.applied == plan.applied


def test_static_batches_leaves_full_batches_alone_and_counts_what_it_cannot_know():
    import tensorflow as tf

    full = make_images(count=16, batch_size=8).unbatch().batch(8, drop_remainder=True)
    assert static_batches(full, 8) == (full, 0)
    repeated = tf.data.Dataset.range(20).repeat().batch(8)  # repeated before batching: never a partial batch
    assert static_batches(repeated, 8)[1] == 0
    filtered, dropped = static_batches(tf.data.Dataset.range(20).filter(lambda i: i % 3 > 0).batch(8), 8)
    assert dropped is None and [len(batch) for batch in filtered] == [8]  # 13 examples: 5 dropped, count unknown


def test_static_batches_never_make_a_batch_of_others_examples():
    """Repeated after batching, each pass ends in a partial batch: left out where it is, never glued to the next
    pass's first (padded batches of other lengths could not be glued at all)."""
    import tensorflow as tf

    rows = [[1, 2], [3], [4, 5, 6], [7, 8, 9, 9, 9], [1]]
    data = tf.data.Dataset.from_generator(
        lambda: iter(rows), output_signature=tf.TensorSpec([None], tf.int64)
    ).padded_batch(2)
    mine, dropped = static_batches(data.repeat(2), 2)
    assert dropped is None and mine.element_spec.shape.as_list() == [2, None]  # a generator: examples unknown
    theirs = [batch.tolist() for batch in data.as_numpy_iterator()][:2]
    assert [batch.tolist() for batch in mine.as_numpy_iterator()] == theirs * 2
    dense, dropped = static_batches(tf.data.Dataset.range(20).batch(8).repeat(), 8)
    assert dropped == 4 and [int(batch[0]) for batch in dense.take(4)] == [0, 8, 0, 8]
    twice, dropped = static_batches(tf.data.Dataset.range(20).batch(8).repeat(2), 8)
    assert dropped == 4 and [int(batch[0]) for batch in twice] == [0, 8, 0, 8] and len(twice) == 4
    # Where an op between the batch and the end keeps only some batches, which are partial is not known: the
    # length is left unknown rather than asserted (a wrong one fails the iteration).
    for unknown in (
        tf.data.Dataset.range(16).batch(8).concatenate(tf.data.Dataset.range(20).batch(8)),  # 4 full, not 5
        tf.data.Dataset.range(28).batch(8).repeat(2).shard(2, 0),  # 4 full, not 3
        tf.data.Dataset.range(20).batch(8).take(1),
    ):
        kept, dropped = static_batches(unknown, 8)
        assert dropped is None and int(kept.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
        assert all(int(batch.shape[0]) == 8 for batch in kept)
    Pair = collections.namedtuple("Pair", ["x", "y"])  # stays one element: tf.data unpacks plain tuples only
    pairs = tf.data.Dataset.range(20).map(lambda i: Pair(i, 2 * i)).batch(8)
    named, _ = static_batches(pairs, 8)
    assert type(named.element_spec) is Pair and [int(batch.y[1]) for batch in named] == [2, 18]


def test_the_length_of_a_rewritten_pipeline_is_kept_under_xla(cpu_hardware):
    """The README's one-iterator training reads it: a rewritten pipeline counts its examples by the user's."""
    from tfopt.recipes.data_pipeline import DataPipeline

    plan = make_plan(make_cnn(), reshuffled_images(20, 8), hardware=cpu_hardware)
    built = build(Xla(jit_compile=True)(DataPipeline()(plan)))
    assert len(built.dataset) == 2 and [int(x.shape[0]) for x, _ in built.dataset] == [8, 8]
    assert "the last 4 examples of each pass are dropped" in built.plan.applied[-1].detail


def test_a_new_batch_size_under_xla_is_made_static_at_that_size():
    plan = Xla(jit_compile=True)(make_plan(make_cnn(), reshuffled_images(20, 8), hardware=FAKE_HARDWARE["cpu_bf16"]))
    built = build(BatchSize(batch_size=6)(plan))  # 20 examples: 3 batches of 6, 2 dropped
    assert [int(x.shape[0]) for x, _ in built.dataset] == [6, 6, 6] and len(built.dataset) == 3
    assert built.dataset.element_spec[0].shape[0] == 6
    assert "the last 2 examples of each pass are dropped" in built.plan.applied[-1].detail


COMPILE_THREE_EPOCHS = """
import sys
import tensorflow as tf
from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.builder import build
from tfopt.plan import make_plan
from tfopt.recipes.xla import Xla

images, labels = next(iter(make_images(count=20, batch_size=20)))
data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(20, seed=1).batch(8)  # reshuffled: 4 dropped
if sys.argv[1] == "recipe":
    built = build(Xla()(make_plan(make_cnn(), data, hardware=FAKE_HARDWARE["h100"])))
    model, data = built.model, built.dataset
else:  # Keras alone, on the same batches
    model = make_cnn(compiled=False)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", jit_compile=True)
model.fit(data, epochs=3, verbose=0)
"""


def xla_step_compilations(directory, how):
    """XLA's own count: with --xla_dump_to, XLA writes one module per compilation of the train step."""
    dump = directory / how.replace(" ", "_")
    subprocess.run(
        [sys.executable, "-c", COMPILE_THREE_EPOCHS, how],
        check=True,
        cwd=REPOSITORY,
        timeout=600,
        capture_output=True,
        env={**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}"},
    )
    return len(list(dump.glob("*one_step_on_data*before_optimizations.txt")))


@pytest.mark.slow
def test_the_xla_step_compiles_once_over_three_epochs(tmp_path):
    compilations = {how: xla_step_compilations(tmp_path, how) for how in ("recipe", "keras jit_compile")}
    # Without static shapes the partial batch of 4 compiles the step a second time (then XLA caches it).
    assert compilations == {"recipe": 1, "keras jit_compile": 2}


@pytest.mark.gpu
def test_the_xla_step_compiles_once_on_the_gpu(tmp_path):
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        pytest.skip("needs a GPU; on CPU test_the_xla_step_compiles_once_over_three_epochs counts the same")
    assert xla_step_compilations(tmp_path, "recipe") == 1  # 3 epochs of 20 examples in batches of 8


def test_a_model_without_call_keeps_xla_until_its_first_batch_fails_under_it_only(cpu_hardware):
    """Its train_step hands the loss to Python (`tf.numpy_function`: no XLA kernel); its forward pass has
    nothing to lower, so the first batch decides."""
    import tensorflow as tf

    import tfopt
    from tests.keras_examples import OwnTrainStep, regression_data

    def logged(loss):
        return tf.ensure_shape(tf.numpy_function(lambda value: value, [loss], tf.float32), [])

    user = OwnTrainStep(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), report=logged)
    user.compile(optimizer="sgd")
    data = regression_data()
    assert xla_blockers(user, np.zeros((8, 4), "float32")) == []  # nothing to lower before the first batch
    result = tfopt.apply(user, data, [{"xla": {"jit_compile": True}}], hardware=cpu_hardware, measure_speed=False)
    step = next(step for step in result.plan.applied if step.recipe == "xla")
    assert step.skipped and step.detail.startswith("off: the first batch fails under XLA only: ")
    assert result.model.jit_compile is False and result.plan.jit_compile is False
    assert [int(x.shape[0]) for x, _ in result.dataset] == [8, 8, 4]  # built again: no static batches dropped
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])


def test_a_layer_failing_in_16_bits_is_no_xla_blocker(cpu_hardware):
    """Lowering the forward pass in 16 bits fails in such a layer without XLA too: the first batch keeps the
    layer float32, and XLA stays on (it used to be turned off as if XLA could not compile the layer)."""
    import tfopt
    from tests.keras_examples import Shifted, regression_data

    inputs = keras.Input((4,))
    user = keras.Model(inputs, keras.layers.Dense(1)(Shifted(name="shifted")(keras.layers.Dense(3)(inputs))))
    user.compile(optimizer="sgd", loss="mse")
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}, {"xla": {"jit_compile": True}}]
    result = tfopt.apply(user, regression_data(), forced, hardware=cpu_hardware, measure_speed=False)
    assert result.plan.jit_compile is True and result.model.jit_compile is True
    assert result.plan.dtype_policy == "mixed_bfloat16" and result.plan.float32_layers == ("shifted",)
    assert not any(step.recipe == "xla" and step.skipped for step in result.plan.applied)
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])
