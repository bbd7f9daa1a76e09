import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests.conftest import FAKE_HARDWARE, make_cnn, make_images
from tfopt.errors import MeasurementError, RecipeConfigError
from tfopt.hardware import Hardware, detect
from tfopt.plan import make_plan
from tfopt.recipes import batch_size as batch_size_module
from tfopt.recipes.batch_size import BatchSize, find_batch_size, rebatch

MIB = 2**20
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def conv_plan(hardware=None, examples=256):
    """A small CNN on 64x64x3 inputs: its activations grow host memory visibly with the batch."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((64, 64, 3))
    x = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    outputs = keras.layers.Dense(5)(keras.layers.GlobalAveragePooling2D()(x))
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    rng = np.random.default_rng(0)
    images = rng.random((examples, 64, 64, 3), dtype=np.float32)
    labels = rng.integers(0, 5, examples).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)
    return make_plan(model, dataset, hardware=hardware or Hardware())


LOW_BUDGET_SEARCH = """
import json
from tests.recipes.test_batch_size import MIB, conv_plan
from tfopt.recipes.batch_size import find_batch_size
from tfopt.training.peak_memory import host_rss_bytes

budget = host_rss_bytes() + 100 * MIB  # low on purpose: batches of 96-128 need more
search = find_batch_size(conv_plan(), min_batch_size=8, max_batch_size=256, memory_budget_bytes=budget,
                         trial_steps=2)
print("SEARCH", json.dumps({"budget": budget, "search": search.to_dict(), "table": search.to_markdown(),
                            "memory_kind": search.memory_kind}))
"""


def test_finder_picks_the_fastest_trial_within_a_low_ram_budget():
    # A fresh process: the budget is on the process's resident memory, and a process that already holds
    # memory from earlier tests reuses it without growing, so a long test session could never exceed it.
    # GPUs are hidden from it: this is the CPU's bound (on a GPU the model's memory is the GPU's).
    process = subprocess.run(
        [sys.executable, "-c", LOW_BUDGET_SEARCH],
        capture_output=True,
        text=True,
        cwd=REPOSITORY,
        timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert process.returncode == 0, process.stderr[-3000:]
    (line,) = [line for line in process.stdout.splitlines() if line.startswith("SEARCH ")]
    result = json.loads(line[len("SEARCH ") :])
    budget, search = result["budget"], result["search"]
    ok = [trial for trial in search["trials"] if trial["status"] == "ok"]
    fastest = max(ok, key=lambda trial: trial["examples_per_second"])
    assert search["best_batch_size"] == fastest["batch_size"]
    assert all(trial["peak_memory_bytes"] <= budget for trial in ok)
    assert any(trial["status"] in ("over_budget", "skipped") for trial in search["trials"]), result["table"]
    assert result["memory_kind"] == "host RSS"


def test_gpu_path_backs_off_on_out_of_memory(monkeypatch):
    """A faked 16 GiB V100: 64 MiB per example, device OOM from 128 up, peaks read from get_memory_info."""
    fake_trials(monkeypatch, out_of_memory_from=128)
    search = find_batch_size(conv_plan(hardware=FAKE_HARDWARE["v100"]), min_batch_size=16, max_batch_size=1024)
    statuses = {trial.batch_size: trial.status for trial in search.trials}
    assert statuses[128] == "out_of_memory"
    assert 256 not in statuses  # no size above one that ran out is tried
    assert statuses[96] == "ok"  # refinement between the best (64) and the failure
    assert search.best_batch_size == 96  # throughput grows with the batch here (0.2 power)
    assert search.memory_kind == "GPU memory" and search.memory_budget_bytes == int(0.9 * 16 * 2**30)
    assert search.best.peak_memory_bytes == 96 * 64 * MIB


def test_rebatch_keeps_every_example_in_order():
    data = tf.data.Dataset.range(10).map(lambda i: (i, -i)).batch(3)
    batches = list(rebatch(data, 4).as_numpy_iterator())
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate([x for x, _ in batches]), np.arange(10))
    dropped = tf.data.Dataset.range(10).batch(3, drop_remainder=True)
    assert [len(x) for x in rebatch(dropped, 4)] == [4, 4]  # 9 examples; drop_remainder kept


def test_recipe_with_given_size_rebatches_and_scales_learning_rate():
    plan = conv_plan()
    result = BatchSize(batch_size=64, scale_learning_rate="linear")(plan)
    assert result.batch_size == 64 and result.sample_inputs.shape[0] == 64
    assert [int(x.shape[0]) for x, _ in result.dataset] == [64] * 4
    assert result.compile_config["optimizer"]["config"]["learning_rate"] == pytest.approx(0.04)
    assert "batch 16 -> 64: requested; learning rate 0.01 -> 0.04 (x4" in result.applied[-1].detail
    assert plan.batch_size == 16 and plan.compile_config["optimizer"]["config"]["learning_rate"] == pytest.approx(0.01)


def test_a_dataset_of_dicts_only_is_rebatched_with_its_inputs_read_as_fit_reads_them(cpu_hardware):
    from tests import keras_examples

    model, data = keras_examples.loss_layer_model()  # keras-io captcha OCR: the label is an Input
    result = BatchSize(batch_size=16)(make_plan(model, data, hardware=cpu_hardware))
    assert result.batch_size == 16 and sorted(result.sample_inputs) == sorted(data.element_spec)
    assert all(tensor.shape[0] == 16 for tensor in result.sample_inputs.values())


@pytest.mark.parametrize("size", [16, "auto"])
def test_padded_batches_of_varying_lengths_keep_their_size_and_say_why(size, cpu_hardware):
    """Plain fit trains on a padded_batch; batches padded each to its own longest element cannot be merged."""
    lengths = np.random.default_rng(0).integers(2, 12, size=24)
    sequences = tf.ragged.constant([[1] * int(length) for length in lengths])
    rows = tf.data.Dataset.from_tensor_slices((sequences, np.zeros(24, "int32"))).map(lambda row, label: (row, label))
    data = rows.padded_batch(8)
    pooled = [keras.layers.Embedding(2, 2), keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)]
    model = keras.Sequential([keras.Input((None,), dtype="int32"), *pooled])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    result = tfopt.apply(
        model, data, [{"batch_size": {"batch_size": size}}], hardware=cpu_hardware, measure_speed=False
    )
    step = next(step for step in result.plan.applied if step.recipe == "batch_size")
    assert step.skipped and "declared shape [None, None] is open beyond the batch dimension" in step.detail
    assert "batches of two shapes may meet, which cannot be merged" in step.detail
    assert [batch[0].shape for batch in result.dataset] == [batch[0].shape for batch in data]


def fixed_batch_model():
    """A stateful LSTM under an Input(batch_size=8): plain fit trains it at 8 and fails at any other size."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4, 1), batch_size=8, name="series")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(4, stateful=True)(inputs)))
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((32, 4, 1), "float32"), np.ones((32, 1), "float32"))).batch(8)
    return model, data


def test_a_search_stops_at_a_size_the_model_cannot_take_and_keeps_the_batch_it_trains_with(cpu_hardware):
    """The search ends at a size the model cannot take, as at one out of memory, instead of failing the apply."""
    model, data = fixed_batch_model()
    plan = make_plan(model, data, hardware=cpu_hardware)
    result = BatchSize(min_batch_size=8, max_batch_size=32, trial_steps=2).measured(plan)(plan)
    step = result.applied[-1]
    assert step.skipped and result.batch_size == 8 and result.dataset is data
    assert "kept batch 8: fastest of 3 trials" in step.detail and "16: failed, 12: failed" in step.detail
    at_a_fixed_other_size = make_plan(model, data.rebatch(16), hardware=cpu_hardware)
    with pytest.raises(MeasurementError, match="Incompatible shapes"):  # the user's own size fails as in fit
        BatchSize(min_batch_size=8, max_batch_size=32, trial_steps=2).measured(at_a_fixed_other_size)


def test_a_size_given_that_the_model_cannot_take_is_refused_naming_its_input(cpu_hardware):
    model, data = fixed_batch_model()
    with pytest.raises(RecipeConfigError, match=r"batch_size: the stateful layer 'lstm\w*' keeps its states for"):
        tfopt.apply(model, data, [{"batch_size": {"batch_size": 16}}], hardware=cpu_hardware, measure_speed=False)
    # An input batch fixed without a stateful layer: plain fit trains at any batch, and so does the copy.
    inputs = keras.Input((4, 1), batch_size=8)
    plain = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(inputs)))
    plain.compile(optimizer="sgd", loss="mse")
    result = tfopt.apply(plain, data, [{"batch_size": {"batch_size": 16}}], hardware=cpu_hardware, measure_speed=False)
    assert result.plan.batch_size == 16 and result.model.fit(result.dataset, verbose=0).history["loss"]


def test_a_search_over_data_smaller_than_its_first_size_keeps_the_batch_and_says_why():
    plan = make_plan(make_cnn(), make_images(count=6, batch_size=2), hardware=Hardware())
    result = BatchSize().measured(plan)(plan)
    assert result.batch_size == 2 and result.applied[-1].skipped
    assert result.applied[-1].detail == (
        "left out: the data holds 6 examples, fewer than min_batch_size=8: no size to try (lower min_batch_size to "
        "search below it)"
    )


def test_a_scaled_rate_of_an_optimizer_a_gans_own_train_step_never_applies_is_said_so(cpu_hardware):
    from tests import keras_examples

    gan, data = keras_examples.conditional_gan()
    recipes = [{"batch_size": {"batch_size": 16, "scale_learning_rate": "linear"}}]
    result = tfopt.apply(gan, data, recipes, hardware=cpu_hardware, measure_speed=False)
    step = next(step for step in result.plan.applied if step.recipe == "batch_size")
    assert "learning rate 0.001 -> 0.002" in step.detail
    assert "ConditionalGAN's own train_step does not apply: d_optimizer, g_optimizer keep their rates" in step.detail
    assert float(result.model.d_optimizer.learning_rate) == pytest.approx(float(gan.d_optimizer.learning_rate))


def test_recipe_keeps_the_batch_it_already_has():
    plan = conv_plan()
    result = BatchSize(batch_size=16)(plan)
    assert result.dataset is plan.dataset and result.applied[-1].skipped


def test_auto_recipe_records_the_trials():
    plan = make_plan(make_cnn(), make_images(count=32, batch_size=8), hardware=Hardware())
    result = BatchSize(min_batch_size=8, max_batch_size=16, trial_steps=2).measured(plan)(plan)
    detail = result.applied[-1].detail
    kind = "GPU memory" if tf.config.list_logical_devices("GPU") else "host RSS"  # where the model trains
    assert f"trials within the {kind} bound (8: " in detail and "16: " in detail
    assert result.batch_size in (8, 12, 16)  # 12: the refinement at 3/4 of 16


def test_the_auto_recipe_call_runs_no_trial_and_apply_runs_them(monkeypatch):
    fake_trials(monkeypatch)
    plan = conv_plan()
    builds = []
    counting = plan.replace(model_fn=lambda: builds.append(1) or plan.model_fn())
    recipe = BatchSize(min_batch_size=16, max_batch_size=32, trial_steps=2)
    with pytest.raises(RecipeConfigError, match=r"measured\(plan\)"):
        recipe(counting)
    assert builds == []  # a recipe call is pure: it builds nothing
    searched = recipe.measured(counting)
    assert builds == [1] and searched.get_config() == recipe.get_config()  # one trial model for every trial
    assert searched(counting).batch_size == 32 and builds == [1]
    result = tfopt.apply(
        make_cnn(), make_images(count=64, batch_size=8), recipes=[recipe], hardware=Hardware(), measure_speed=False
    )
    assert result.plan.batch_size == 32 and "fastest of" in result.plan.applied[-1].detail


@pytest.mark.parametrize(
    "settings, words, setting",
    [
        ({"batch_size": 0}, "Expected 'auto' or a positive integer", "batch_size"),
        ({"batch_size": "max"}, "batch_size='max'", "batch_size"),
        # The bounds' message names both; the error names the one to change.
        ({"min_batch_size": 64, "max_batch_size": 32}, "1 <= min_batch_size <= max_batch_size", "max_batch_size"),
        ({"min_batch_size": 0, "max_batch_size": 32}, "1 <= min_batch_size <= max_batch_size", "min_batch_size"),
        ({"trial_steps": 1}, "trial_steps >= 2", "trial_steps"),
        ({"memory_budget_bytes": -1}, "memory_budget_bytes=-1", "memory_budget_bytes"),
        ({"scale_learning_rate": "log"}, "Expected one of 'none', 'linear', 'sqrt'", "scale_learning_rate"),
    ],
)
def test_bad_settings(settings, words, setting):
    with pytest.raises(RecipeConfigError, match=words) as error:
        BatchSize(**settings)
    assert error.value.setting == setting


def fake_trials(monkeypatch, seen=None, memory_per_example=64 * MIB, out_of_memory_from=None):
    """Trials that take no time: throughput grows with the batch; GPU peaks come from a faked allocator.

    `seen` collects the (compute dtype, jit_compile) of the model each trial trains; from the batch
    `out_of_memory_from` up, a trial fails as a GPU out of memory does.
    """
    requested = []

    def fake_time_trial(model, plan, batch_size, steps, warmup_steps):
        requested.append(batch_size)
        if seen is not None:
            seen.append((model.layers[1].compute_dtype, model.jit_compile))
        if out_of_memory_from and batch_size >= out_of_memory_from:
            error = tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")
            raise MeasurementError("Training failed while timing steps") from error
        from tfopt.profiling.timing import StepTimes

        return StepTimes(seconds=(0.001 * batch_size**0.8,) * 3, batch_size=batch_size)

    monkeypatch.setattr(batch_size_module, "_time_trial", fake_time_trial)
    monkeypatch.setattr(tf.config.experimental, "reset_memory_stats", lambda device: None)
    monkeypatch.setattr(
        tf.config.experimental,
        "get_memory_info",
        lambda device: {"current": 0, "peak": requested[-1] * memory_per_example if requested else 0},
    )


def test_search_times_the_step_mixed_precision_and_xla_made(monkeypatch):
    # batch_size was ordered first (stage DATA), so the search timed a float32 model without XLA.
    from tfopt.recipes import MixedPrecision, Xla, chain

    seen = []
    fake_trials(monkeypatch, seen)
    recipe = chain(
        BatchSize(min_batch_size=16, max_batch_size=32, trial_steps=2),
        Xla(jit_compile=True),
        MixedPrecision(policy="mixed_bfloat16"),
    )
    assert [r.name for r in recipe.recipes] == ["mixed_precision", "xla", "batch_size"]
    plan = recipe.measured(conv_plan())(conv_plan())
    assert seen and set(seen) == {("bfloat16", True)}
    assert plan.batch_size == 32 and plan.jit_compile and plan.dtype_policy == "mixed_bfloat16"


def test_gpu_budget_is_the_limit_given_to_the_allocator(monkeypatch):
    # An 80 GiB H100 whose process may use 4 GiB (gpu_memory's limit_bytes): 90% of 80 GiB would let
    # trials far past what the allocator can give.
    fake_trials(monkeypatch, memory_per_example=64 * MIB)
    physical = ["/physical_device:GPU:0"]
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: physical if kind == "GPU" else [])
    monkeypatch.setattr(
        tf.config,
        "get_logical_device_configuration",
        lambda device: [tf.config.LogicalDeviceConfiguration(memory_limit=4096)],
    )
    search = find_batch_size(conv_plan(hardware=FAKE_HARDWARE["h100"]), min_batch_size=16, max_batch_size=1024)
    assert search.memory_kind == "GPU memory" and search.memory_budget_bytes == int(0.9 * 4 * 2**30)
    statuses = {trial.batch_size: trial.status for trial in search.trials}
    assert statuses[32] == "ok" and search.best_batch_size == 48  # 48 x 64 MiB = 3 GiB fits; 64 (4 GiB) does not
    assert statuses[64] in ("over_budget", "skipped")


def test_a_model_on_a_gpu_is_bounded_by_gpu_memory_even_when_the_plan_says_cpu(monkeypatch):
    # On the H100 a test plan with Hardware() trained on the GPU and was bounded by host RSS.
    fake_trials(monkeypatch)
    monkeypatch.setattr(batch_size_module, "_lives_on_gpu", lambda model: True)
    search = find_batch_size(
        conv_plan(hardware=Hardware()), min_batch_size=16, max_batch_size=64, memory_budget_bytes=3 * 2**30
    )
    assert search.memory_kind == "GPU memory"
    assert [trial.peak_memory_bytes for trial in search.trials if trial.status == "ok"][:2] == [2**30, 2 * 2**30]


@pytest.mark.gpu
def test_gpu_search_reads_the_allocator():
    if not tf.config.list_logical_devices("GPU"):
        pytest.skip("needs a GPU: on CPU the bound is host RSS (test_finder_picks_the_fastest_trial_within_...)")
    search = find_batch_size(conv_plan(hardware=detect()), min_batch_size=8, max_batch_size=32, trial_steps=2)
    assert search.memory_kind == "GPU memory"
    peaks = [trial.peak_memory_bytes for trial in search.trials if trial.status == "ok"]
    assert peaks and all(peak > 8 * 64 * 64 * 3 * 4 for peak in peaks)  # at least one input batch on the device
