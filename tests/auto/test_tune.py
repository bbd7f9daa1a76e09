"""Auto mode for real, on a tiny model: trials share weights and batches, and apply(recipes="auto") works."""

import json

import numpy as np
import pytest

import tfopt
from tests.conftest import make_cnn, make_images
from tfopt.auto import tune
from tfopt.auto.trials import TrialRunner, _per_step_losses, _Recorder
from tfopt.errors import RecipeConfigError
from tfopt.optimize import resolve_recipes
from tfopt.plan import make_plan
from tfopt.recipes import DataPipeline, DataService, FusedLayers, MixedPrecision, Xla

FAST = dict(steps=3, warmup_steps=1, numerics_steps=3)


def test_per_step_losses_undo_the_running_mean():
    # Steps of 8, 8 and 4 examples with losses 3, 1, 2: Keras reports the batch-size-weighted running mean.
    means = [3.0, 2.0, (24 + 8 + 8) / 20]
    assert _per_step_losses(means, [8, 8, 4]) == pytest.approx((3.0, 1.0, 2.0))


@pytest.mark.parametrize(
    "logs, compared",
    [
        ({"loss": 0.5, "d_loss": 0.9}, "loss"),
        ({"d_loss": 0.9, "g_loss": 0.1}, "d_loss"),  # a GAN's
        ({"loss": 0.0, "student_loss": 0.9, "distillation_loss": 0.1}, "student_loss"),  # a distiller's
    ],
)
def test_the_numerics_are_compared_on_a_loss_the_model_computes(logs, compared):
    recorder = _Recorder(deadline=float("inf"), clock=lambda: 0.0)
    recorder.on_train_begin()
    for step in range(3):
        recorder.on_train_batch_end(step, {name: value * (step + 1) for name, value in logs.items()})
    assert recorder.running_means == [logs[compared] * (step + 1) for step in range(3)]


def test_trials_share_weights_batches_and_the_compiled_model(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(count=48), hardware=cpu_hardware)
    recipes = {"data_pipeline": DataPipeline(), "mixed_bfloat16": MixedPrecision(policy="mixed_bfloat16")}
    runner = TrialRunner(plan, recipes, **FAST)
    first, again = runner((), 1e12), runner((), 1e12)
    data = runner(("data_pipeline",), 1e12)
    bf16 = runner(("mixed_bfloat16",), 1e12)
    assert first.measured and len(first.step_times.seconds) == 3 and first.step_times.batch_size == 8
    assert first.compile_seconds is not None and again.compile_seconds is None  # compiled once, then shared
    assert data.compile_seconds is None and data.losses == first.losses  # same model: same numerics
    assert first.losses == again.losses  # every trial starts from the same weights on the same batches
    assert len(runner._models) == 2
    assert all(np.isfinite(bf16.losses)) and bf16.losses != first.losses
    assert np.allclose(bf16.losses, first.losses, rtol=0.02)  # bf16 rounding, not broken numerics
    model = runner.baseline(1e12).model
    assert int(model.optimizer.iterations) == 0  # state restored after every trial


def test_a_baseline_apply_built_already_is_the_trials_baseline(cpu_hardware):
    from tfopt.builder import build

    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    built = build(plan)
    builds = []
    counting = plan.replace(model_fn=lambda: builds.append(1) or plan.model_fn())
    runner = TrialRunner(counting, {}, built=built, **FAST)
    assert runner.baseline(1e12) is built and runner((), 1e12).measured
    assert builds == []  # the baseline configuration is built once, by apply


@pytest.mark.parametrize("example", ["loss_layer_model", "conditional_gan"])
def test_trials_read_a_dict_only_dataset_and_a_gans_own_losses(example, cpu_hardware):
    """keras-io's captcha OCR feeds dicts only (its label is an Input); a GAN logs d_loss and g_loss, no "loss"."""
    from tests import keras_examples

    model, data = getattr(keras_examples, example)()
    runner = TrialRunner(make_plan(model, data, hardware=cpu_hardware), {}, **FAST)
    baseline = runner((), 1e12)
    assert baseline.measured and len(baseline.losses) == 3 and all(np.isfinite(baseline.losses))
    assert baseline.step_times.batch_size == 8


def test_deadline_stops_a_trial(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    runner = TrialRunner(plan, {}, **FAST)
    runner.baseline(1e12)
    result = runner((), deadline=0.0)  # already past: stops after the first timed-run step
    assert result.stopped_by_budget and not result.measured


@pytest.mark.slow
def test_an_offloaded_trial_runs_on_its_own_worker_and_stops_it(cpu_hardware, monkeypatch):
    """data_service: {workers: 1} as a candidate: the shared model trains from a worker process started for
    the trial, on the same numerics, and the worker is gone when the trial ends."""
    from tests.processes import wait_gone
    from tfopt.auto import trials

    started, serve_offload = [], trials.serve_offload

    def recorded(*args, **kwargs):
        served, cluster = serve_offload(*args, **kwargs)
        started.append(cluster.worker_pids)
        return served, cluster

    monkeypatch.setattr(trials, "serve_offload", recorded)
    plan = make_plan(make_cnn(), make_images(count=48), hardware=cpu_hardware)
    runner = TrialRunner(plan, {"data_service:1": DataService(workers=1)}, **FAST)
    baseline = runner((), 1e12)
    assert started == []
    offloaded = runner(("data_service:1",), 1e12)
    assert offloaded.measured and offloaded.losses == baseline.losses and len(runner._models) == 1
    assert offloaded.step_times.batch_size == 8 and len(offloaded.step_times.seconds) == 3
    assert len(started) == 1 and len(started[0]) == 1 and wait_gone(started[0], seconds=30) == []


def test_a_recipe_that_declines_is_reported(cpu_hardware):
    import keras

    inputs = keras.Input((4,), dtype="string")
    lookup = keras.layers.StringLookup(vocabulary=["a", "b"], output_mode="one_hot")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(keras.layers.Flatten()(lookup)))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices((tf.constant([["a", "b", "a", "b"]] * 16), tf.zeros(16, "int32")))
    plan = make_plan(model, data.batch(4), hardware=cpu_hardware)
    result = TrialRunner(plan, {"xla": Xla(jit_compile=True)}, **FAST)(("xla",), 1e12)
    assert result.skipped and "xla: skipped: " in result.skipped and not result.measured


def test_tune_end_to_end(cpu_hardware):
    events = []
    plan = make_plan(make_cnn(), make_images(count=48), hardware=cpu_hardware)
    tuning = tune(plan, budget_seconds=25, profile=False, on_progress=events.append, **FAST)
    table = tuning.table
    assert table.rows[0].configuration == "baseline" and table.rows[0].status == "baseline"
    labels = {row.configuration for row in table.rows}
    assert {"mixed_bfloat16", "xla"} <= labels
    assert {decision.candidate for decision in table.decisions} >= {"mixed_bfloat16", "xla"}
    assert "fused_layers" in labels  # the CNN has a BatchNormalization
    assert set(tuning.recipe.recipes) == {
        {
            "data_pipeline": DataPipeline(),
            "mixed_bfloat16": MixedPrecision(policy="mixed_bfloat16"),
            "xla": Xla(jit_compile=True),
            "fused_layers": FusedLayers(batch_norm=True, conv_bias=True),
        }[label]
        for label in table.chosen
    }
    auto_steps = [step for step in tuning.plan.applied if step.recipe == "auto"]
    assert len(auto_steps) == len(table.decisions)
    assert table.elapsed_seconds <= 25 * 1.1
    assert events[0].message == "diagnosing the baseline" and events[-1].message.startswith("chose ")
    json.dumps(tuning.to_dict())


def test_apply_auto(cpu_hardware):
    user_model = make_cnn()
    result = tfopt.apply(
        user_model,
        make_images(count=48),
        recipes="auto",
        hardware=cpu_hardware,
        tune_budget_seconds=20,
        steps=3,
        warmup_steps=1,
    )
    assert any(step.recipe == "auto" for step in result.plan.applied)
    assert result.after.real.examples_per_second > 0
    assert len(result.tuning.table.decisions) == sum(step.recipe == "auto" for step in result.plan.applied)
    assert result.to_dict()["tuning"]["trials"] == result.tuning.table.to_dict()


def test_auto_has_no_fixed_recipe_list_and_a_bad_budget_is_rejected(cpu_hardware):
    with pytest.raises(RecipeConfigError, match="recipes='auto' is decided by timing trials"):
        resolve_recipes("auto")
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    with pytest.raises(RecipeConfigError, match=r"tune budget -5 is not valid.*--tune-budget 120s"):
        tune(plan, budget_seconds=-5)


def test_several_steps_per_call_is_refused_with_the_fix(cpu_hardware):
    model = make_cnn()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", steps_per_execution=4)
    with pytest.raises(RecipeConfigError, match="steps_per_execution=1 for tuning"):
        tune(make_plan(model, make_images(), hardware=cpu_hardware), budget_seconds=20)


def test_trial_models_build_their_optimizer_in_the_plans_strategy(cpu_hardware):
    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware).replace(
        strategy="one_device", strategy_options={"device": "/cpu:0"}
    )
    compiled = TrialRunner(plan, {}, **FAST)._compiled(plan)
    model = compiled.built.model
    assert model.distribute_strategy is compiled.built.strategy
    assert len(model.optimizer.variables) == 2 + 2 * len(model.trainable_variables)  # Adam: 2 slots each


def test_what_the_build_changes_is_part_of_the_trial_model_key(cpu_hardware):
    from tfopt.auto.trials import _model_key

    plan = make_plan(make_cnn(), make_images(), hardware=cpu_hardware)
    assert _model_key(plan) != _model_key(plan.replace(tf32=not plan.tf32))
    for built_otherwise in ({"layer_rewrites": ("batch_norm",)}, {"float32_layers": ("dense",)}, {"micro_batches": 2}):
        assert _model_key(plan) != _model_key(plan.replace(**built_otherwise)), built_otherwise
    assert _model_key(plan) == _model_key(plan.replace(dataset=make_images(count=16)))  # data alone: shared


def test_every_trial_runs_under_its_plans_tf32_and_leaves_the_baselines(
    cpu_hardware, monkeypatch, tf32_as_tensorflow_starts
):
    """TensorFlow's TF32 switch is process-wide: a cached model runs under its own plan's setting again, and
    after a trial the process is as the baseline has it (for the next trial and apply's "before")."""
    import tensorflow as tf

    from tfopt.auto import trials

    seen = []
    timed = trials._timed
    monkeypatch.setattr(
        trials,
        "_timed",
        lambda *args, **kwargs: (
            seen.append(bool(tf.config.experimental.tensor_float_32_execution_enabled())) or timed(*args, **kwargs)
        ),
    )
    plan = make_plan(make_cnn(), make_images(count=48), hardware=cpu_hardware)
    assert plan.tf32 is True
    ieee = MixedPrecision(policy="mixed_bfloat16", tf32=False)
    runner = TrialRunner(plan, {"ieee": ieee, "data_pipeline": DataPipeline()}, **FAST)
    for configuration in [(), ("ieee",), ("data_pipeline", "ieee"), ()]:
        assert runner(configuration, 1e12).measured
        assert tf.config.experimental.tensor_float_32_execution_enabled()  # the baseline's, after each trial
    assert seen == [True, False, False, True] and len(runner._models) == 2
    # Two plans that differ only in TF32 get a model each, each used under its own setting.
    first = runner._compiled(plan.replace(tf32=False))
    assert not tf.config.experimental.tensor_float_32_execution_enabled()
    assert runner._compiled(plan) is not first and tf.config.experimental.tensor_float_32_execution_enabled()
