"""Policy choice on every faked machine, and the dtypes a mixed-precision build really has."""

import keras
import numpy as np
import pytest

from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.builder import build
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan
from tfopt.recipes.mixed_precision import MixedPrecision, choose_policy, policy_scope

EXPECTED_POLICY = {
    "v100": "mixed_float16",
    "t4": "mixed_float16",
    "a100": "mixed_bfloat16",
    "h100": "mixed_bfloat16",
    "k80": "float32",
    "tpu": "mixed_bfloat16",
    "cpu_bf16": "mixed_bfloat16",
    "cpu_plain": "float32",
}


@pytest.mark.parametrize("machine", sorted(FAKE_HARDWARE))
def test_auto_policy_for_each_machine(machine):
    policy, reason = choose_policy(FAKE_HARDWARE[machine])
    assert policy == EXPECTED_POLICY[machine]
    assert reason


@pytest.mark.parametrize("machine", ["cpu_bf16", "cpu_plain"])
def test_auto_never_picks_float16_on_a_cpu(machine):
    # Measured on this project's CPU: fp16 compute is about 6x slower than float32.
    assert choose_policy(FAKE_HARDWARE[machine])[0] != "mixed_float16"


def test_reason_names_the_compute_capability():
    assert "8.0" in choose_policy(FAKE_HARDWARE["a100"])[1]
    assert "7.0" in choose_policy(FAKE_HARDWARE["v100"])[1]


@pytest.mark.parametrize(
    "policy, compute, variable",
    [
        ("mixed_bfloat16", "bfloat16", "float32"),
        ("mixed_float16", "float16", "float32"),
        ("float32", "float32", "float32"),
    ],
)
def test_built_model_dtypes(policy, compute, variable, cpu_hardware):
    user_model = make_cnn()
    plan = MixedPrecision(policy=policy)(make_plan(user_model, make_images(), hardware=cpu_hardware))
    model = build(plan).model
    conv, dense = (model.get_layer(index=i) for i in (1, 4))
    assert conv.compute_dtype == compute and conv.variable_dtype == variable
    assert all(weight.dtype == "float32" for weight in model.weights)
    # The output layer computes in float32 so softmax and the loss keep their precision.
    assert dense.compute_dtype == "float32"
    outputs = model(np.zeros((2, 12, 12, 3), "float32"))
    assert outputs.dtype == "float32"
    # The user's model and Keras' global policy are untouched.
    assert {layer.dtype_policy.name for layer in user_model.layers} == {"float32"}
    assert keras.config.dtype_policy().name == "float32"


def test_float16_compiles_with_loss_scaling(cpu_hardware):
    plan = MixedPrecision(policy="mixed_float16")(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    model = build(plan).model
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    model.fit(make_images(), epochs=1, verbose=0)
    assert float(model.optimizer.dynamic_scale) > 0


def _sequential_cnn():
    model = keras.Sequential([keras.Input((12, 12, 3)), *make_cnn(compiled=False).layers[1:]])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


class _SubclassedCnn(keras.Model):
    def __init__(self):
        # Named: Keras names it "_subclassed_cnn", no valid root name scope, and a trace of it fails (plain fit's
        # too), leaving that scope on Keras' stack, in every later variable's path.
        super().__init__(name="subclassed_cnn")
        self.cnn = make_cnn(compiled=False)

    def call(self, inputs):
        return self.cnn(inputs * 2.0)  # computes between its layers: stays in the user's precision


def _subclassed_cnn():
    model = _SubclassedCnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model(np.zeros((1, 12, 12, 3), "float32"))
    return model


@pytest.mark.parametrize("make_model", [make_cnn, _sequential_cnn])
def test_a_float16_copy_compiled_again_or_reloaded_keeps_loss_scaling(make_model, cpu_hardware, tmp_path):
    """A second stage of fine-tuning compiles the copy again: Keras wraps its optimizer for a model whose own
    policy is mixed_float16, which a model that only runs its layers takes; a saved copy loads with the wrapper
    and its state."""
    model = build(
        MixedPrecision(policy="mixed_float16")(make_plan(make_model(), make_images(), hardware=cpu_hardware))
    ).model
    assert model.dtype_policy.name == "mixed_float16"
    assert model(np.zeros((2, 12, 12, 3), "float32")).dtype == "float32"
    model.fit(make_images(), epochs=1, verbose=0)
    model.save(tmp_path / "stage1.keras")
    loaded = keras.saving.load_model(tmp_path / "stage1.keras")
    assert isinstance(loaded.optimizer, keras.optimizers.LossScaleOptimizer)
    assert len(loaded.optimizer.variables) == len(model.optimizer.variables)
    for mine, saved in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(mine, saved)
    model.compile(optimizer=keras.optimizers.Adam(1e-5), loss="sparse_categorical_crossentropy")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_a_float16_subclassed_copy_keeps_its_own_policy(cpu_hardware):
    model = build(
        MixedPrecision(policy="mixed_float16")(make_plan(_subclassed_cnn(), make_images(), hardware=cpu_hardware))
    ).model
    assert model.dtype_policy.name == "float32"
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.cnn.layers[1].compute_dtype == "float16"


def test_bfloat16_has_no_loss_scaling(cpu_hardware):
    plan = MixedPrecision(policy="mixed_bfloat16")(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    assert not isinstance(build(plan).model.optimizer, keras.optimizers.LossScaleOptimizer)


def test_mixed_model_starts_from_the_user_weights(cpu_hardware):
    user_model = make_cnn()
    model = build(
        MixedPrecision(policy="mixed_bfloat16")(make_plan(user_model, make_images(), hardware=cpu_hardware))
    ).model
    for mine, theirs in zip(user_model.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    batch = np.random.default_rng(0).random((4, 12, 12, 3), dtype=np.float32)
    # bfloat16 keeps ~3 significant digits: outputs agree with float32 to about 1e-2.
    np.testing.assert_allclose(model(batch, training=False), user_model(batch, training=False), atol=2e-2)


def test_recorded_reason_and_skip_on_plain_cpu():
    plan = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["cpu_plain"])
    step = MixedPrecision()(plan).applied[-1]
    assert step.skipped and "bfloat16 instructions" in step.detail


def test_float16_on_tpu_is_rejected_early():
    plan = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["tpu"])
    with pytest.raises(RecipeConfigError, match="mixed_bfloat16"):
        MixedPrecision(policy="mixed_float16").check(plan)


def test_policy_scope_restores_the_global_policy():
    with policy_scope("auto", hardware=FAKE_HARDWARE["v100"]) as chosen:
        assert chosen == "mixed_float16"
        assert keras.layers.Dense(2).compute_dtype == "float16"
    assert keras.config.dtype_policy().name == "float32"
    with pytest.raises(RecipeConfigError):
        with policy_scope("half"):
            pass


@pytest.mark.parametrize(
    "machine, has_tf32",
    [("a100", True), ("h100", True), ("v100", False), ("t4", False), ("cpu_bf16", False), ("tpu", False)],
)
def test_tf32_is_named_in_the_baseline_plan_on_ampere_and_newer(machine, has_tf32, ieee_float32):
    import tensorflow as tf

    hardware = FAKE_HARDWARE[machine]
    assert hardware.has_tf32 is has_tf32
    tf.config.experimental.enable_tensor_float_32_execution(True)  # TensorFlow's default; the fixture restores
    plan = make_plan(make_cnn(), make_images(), hardware=hardware)
    assert plan.tf32 is True
    notes = [step.detail for step in plan.applied if step.recipe == "baseline"]
    if has_tf32:
        major, minor = hardware.min_compute_capability
        assert notes == [
            f"float32 baseline: TF32 on this GPU (compute capability {major}.{minor} >= 8.0: TensorFlow "
            "runs float32 matmuls and convolutions with a 10-bit mantissa); mixed_precision tf32: false "
            "gives IEEE float32"
        ]
    else:
        assert notes == []


def test_tf32_off_is_planned_and_built(ieee_float32):
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(True)
    plan = make_plan(make_cnn(), make_images(), hardware=FAKE_HARDWARE["h100"])
    ieee = MixedPrecision(policy="float32", tf32=False)(plan)
    assert ieee.tf32 is False and plan.tf32 is True
    assert "float32 math in IEEE float32 (TF32 turned off" in ieee.applied[-1].detail
    kept = MixedPrecision()(plan)
    assert kept.tf32 is True and "float32 math runs in TF32 on this GPU (tf32: false" in kept.applied[-1].detail
    build(ieee)
    assert tf.config.experimental.tensor_float_32_execution_enabled() is False  # kept for training
    build(plan)
    assert tf.config.experimental.tensor_float_32_execution_enabled() is True  # the baseline is measured as it was


def test_tf32_setting_must_be_a_boolean():
    with pytest.raises(RecipeConfigError, match=r"tf32='off'. Expected true"):
        MixedPrecision(tf32="off")
    assert MixedPrecision(tf32=False).get_config() == {"policy": "auto", "tf32": False}


def compiled_step_hlo(model, stage):
    """The HLO of one XLA-compiled training step (forward, loss and gradients) of `model` on tiny images."""
    import tensorflow as tf

    images, labels = next(iter(make_images(count=8)))

    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        return tape.gradient(loss, model.trainable_variables)

    return step.experimental_get_compiler_ir(images, labels)(stage=stage)


def test_bf16_step_convolves_in_bf16(cpu_hardware):
    # The faked-hardware side of the GPU test below: what the policy makes the compiled step compute in.
    model = build(
        MixedPrecision(policy="mixed_bfloat16")(make_plan(make_cnn(), make_images(), hardware=cpu_hardware))
    ).model
    assert [layer.dtype_policy.name for layer in model.layers[1:]] == ["mixed_bfloat16"] * 3 + ["float32"]
    convolutions = [line for line in compiled_step_hlo(model, "hlo").splitlines() if " convolution(" in line]
    assert convolutions and all(line.split("=", 1)[1].lstrip().startswith("bf16[") for line in convolutions)


@pytest.mark.gpu
def test_the_policy_for_this_gpu_runs_its_convolutions_in_16_bits():
    import tensorflow as tf

    from tfopt.hardware import detect

    if not tf.config.list_logical_devices("GPU"):
        pytest.skip("needs a GPU: the policy choice is tested with faked GPUs (test_auto_policy_for_each_machine)")
    hardware = detect()
    policy, _ = choose_policy(hardware)
    plan = MixedPrecision()(make_plan(make_cnn(), make_images(), hardware=hardware))
    model = build(plan).model
    assert plan.dtype_policy == policy
    assert [layer.dtype_policy.name for layer in model.layers[1:]] == [policy] * 3 + ["float32"]
    hlo_dtype = {"mixed_bfloat16": "bf16", "mixed_float16": "f16"}.get(policy)
    if hlo_dtype is None:
        pytest.skip(f"{hardware.describe()}: no 16-bit tensor cores, float32 kept")
    # cuDNN runs the convolutions, forward and both backward ones (fused with bias and activation where XLA
    # can), each giving a 16-bit result: the optimized HLO names operands without their types.
    convolutions = [line for line in compiled_step_hlo(model, "optimized_hlo").splitlines() if "__cudnn$conv" in line]
    results = [line.split("=", 1)[1].split("custom-call(", 1)[0].strip().lstrip("(") for line in convolutions]
    assert results and all(result.startswith(f"{hlo_dtype}[") for result in results), convolutions


def test_outputs_made_by_keras_ops_keep_the_layers_before_them_in_float32(cpu_hardware):
    """Keras 3 functional code often ends in a keras.ops call (`outputs = ops.softmax(logits)`): the layers
    whose results that call reads are the ones kept float32, so the outputs are float32."""
    import tensorflow as tf

    import tfopt

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    logits = keras.ops.add(keras.layers.Dense(4, name="head")(hidden), keras.layers.Dense(4, name="bias")(inputs))
    user = keras.Model(inputs, keras.ops.softmax(logits))
    user.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.random((16, 6), dtype=np.float32), rng.integers(0, 4, 16).astype("int32"))
    ).batch(8)
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    model = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False).model
    assert {layer.name: layer.compute_dtype for layer in model.layers if layer.weights} == {
        "hidden": "bfloat16",
        "head": "float32",
        "bias": "float32",
    }
    assert model(next(iter(data))[0]).dtype == tf.float32
