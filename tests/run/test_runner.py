"""Tests of tfopt.run.runner: a run directory holds everything, a failed run touches nothing earlier."""

from __future__ import annotations

import json
import pathlib
import statistics
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from tfopt.errors import NonFiniteLossError, TfoptError
from tfopt.hardware import detect
from tfopt.profiling.metrics import CPU_NOTE, Metrics, compared
from tfopt.recipe_file import load_recipe
from tfopt.run import runner
from tfopt.run import training as run_training
from tfopt.run.model import compile_as_recipe, create_model

RECIPE = """\
model: {name: small_cnn, filters: [4]}
data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], num_classes: 3, batch_size: 4}
train: {epochs: 2, steps_per_epoch: 2}
recipes: [data_pipeline]
profile: {steps: 2, warmup_steps: 1}
report: {price_per_hour: 3.6}
"""


def write(directory: pathlib.Path, text: str = RECIPE) -> pathlib.Path:
    path = directory / "tiny.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_prepare_takes_model_arguments_from_the_data_unless_the_file_gives_them(tmp_path):
    prepared = runner.prepare(load_recipe(write(tmp_path)))
    assert prepared.model.kwargs["input_shape"] == [8, 8, 3]
    assert prepared.model.kwargs["classes"] == 3
    explicit = runner.prepare(load_recipe(write(tmp_path), overrides=["model.classes=7"]))
    assert explicit.model.kwargs["classes"] == 7


def test_prepare_fills_sequence_length_and_vocabulary_of_a_text_model(tmp_path):
    recipe = load_recipe(
        write(
            tmp_path,
            """\
        model: {name: text_transformer, embed_dim: 8, ff_dim: 8, num_layers: 1}
        data: {source: synthetic, kind: tokens, examples: 8, sequence_length: 12, vocab_size: 50}
    """,
        )
    )
    kwargs = runner.prepare(recipe).model.kwargs
    assert (kwargs["sequence_length"], kwargs["vocab_size"], kwargs["classes"]) == (12, 50, 5)


def test_a_model_its_function_returns_uncompiled_is_compiled_with_the_train_section_leaving_xla_to_the_recipe(
    tmp_path,
):
    from tfopt.plan import chosen_jit_compile

    recipe = runner.prepare(load_recipe(write(tmp_path), overrides=["train.learning_rate=0.01"]))
    model = create_model(recipe)
    assert compile_as_recipe(model, recipe) is None
    assert chosen_jit_compile(model, None) == "auto"  # no choice of the user's: the baseline runs without XLA
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01)


def test_a_run_builds_its_model_once_per_configuration_with_one_set_of_initial_weights(tmp_path, monkeypatch):
    created = []
    create = runner.create_model
    monkeypatch.setattr(runner, "create_model", lambda recipe: created.append(create(recipe)) or created[-1])
    outcome = runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=0"]), runs_root=tmp_path / "runs")
    assert len(created) == 2 and outcome.report is not None  # the baseline and the optimized setup, no third
    baseline, optimized = created
    assert all(np.array_equal(a, b) for a, b in zip(baseline.get_weights(), optimized.get_weights()))


def test_run_writes_the_profiling_report_in_every_format_with_the_same_numbers(tmp_path):
    outcome = runner.run(load_recipe(write(tmp_path)), runs_root=tmp_path / "runs")
    run_dir = outcome.run_dir
    assert run_dir.parent == tmp_path / "runs" and run_dir.name.startswith("tiny-")
    assert load_recipe(run_dir / "recipe.yaml").to_dict() == outcome.recipe.to_dict()
    report = json.loads((run_dir / "report.json").read_text())
    assert report == outcome.report
    assert set(outcome.report_paths) == {"html", "markdown", "json"}
    before, after = report["runs"]["before"], report["runs"]["after"]
    assert report["speedup"] == pytest.approx(statistics.median(report["speedup_rounds"]), rel=1e-3)
    assert min(report["speedup_rounds"]) <= report["speedup"] <= max(report["speedup_rounds"])
    # On a GPU with TF32 (an A100, an H100) the plan first says what its float32 math is.
    stated = ["baseline"] if detect().has_tf32 else []
    assert [step["recipe"] for step in report["applied"]] == [*stated, "data_pipeline"]
    # price_per_hour 3.6 -> one hour costs 3.6, an epoch of 2 steps costs 2 / steps_per_second seconds of it.
    assert report["steps_per_epoch"] == 2
    assert before["cost_per_epoch"] == pytest.approx(3.6 * 2 / before["steps_per_second"] / 3600, rel=1e-2)
    markdown, html = (run_dir / "report.md").read_text(), (run_dir / "report.html").read_text()
    for run in (before, after):  # both renderings print the numbers of report.json, as rounded there
        shown = f"{run['steps_per_second']:g}"
        assert shown in markdown.split("## Step-time breakdown")[0] and f"<td>{shown}</td>" in html
    assert (run_dir / "tensorboard" / "before").is_dir() and (run_dir / "tensorboard" / "after").is_dir()
    training = json.loads((run_dir / "training.json").read_text())
    assert training == outcome.training
    assert (training["engine"], training["global_step"], training["resumed_from_step"]) == (
        "tfopt.training.train",
        4,
        0,
    )
    assert len(training["history"]["loss"]) == 2
    assert list((run_dir / "checkpoints").iterdir())
    events = list((run_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    tags = {
        value.tag
        for path in events
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
    }
    assert {"epoch_loss", "epoch_accuracy", "tfopt/steps_per_second", "tfopt/input_wait_percent"} <= tags
    # The training ran under tfopt.Monitor: its windows are in training.json, monitor.jsonl and the report.
    windows = training["monitor"]
    # 4 steps: one window of the 3 after the first (the Monitor's windows hold 3 steps at least).
    assert [(w["step"], w["steps"]) for w in windows] == [(4, 3)] and all(w["steps_per_second"] > 0 for w in windows)
    assert (run_dir / "tensorboard" / "train" / "monitor.jsonl").is_file()
    assert [w["step"] for w in report["training"]["windows"]] == [w["step"] for w in windows]
    assert "## Training (tfopt.Monitor)" in markdown and 'alt="training chart"' in html
    assert not list(run_dir.rglob("*.tmp"))
    summary = outcome.summary()
    assert summary.startswith(
        f"tiny: {before['examples_per_second']:.1f} -> {after['examples_per_second']:.1f} examples/s"
    )
    assert compared(Metrics.from_dict(before), Metrics.from_dict(after)) in summary
    assert "utilization" not in summary
    if before["accelerator"] == "cpu":  # the machine that ran it, as detected
        # More notes may follow this one in the parentheses (a measurement problem on a loaded machine).
        assert f"({CPU_NOTE}" in summary
    else:
        assert "accelerator busy " in summary and "CPU only" not in summary
    assert summary.endswith(f"trained to step 4; report: {run_dir / 'report.html'}")


def test_resume_keeps_the_measurements_and_trains_only_the_missing_steps(tmp_path):
    first = runner.run(load_recipe(write(tmp_path)), out_dir=tmp_path / "run")
    report_text = (tmp_path / "run" / "report.json").read_text()
    longer = runner.run(
        load_recipe(write(tmp_path), overrides=["train.epochs=3"]), out_dir=tmp_path / "run", resume=True
    )
    assert (longer.training["resumed_from_step"], longer.training["global_step"]) == (4, 6)
    # training.json keeps the whole run: the first attempt's two epochs, then the one trained now.
    assert longer.training["steps_run"] == 2 and len(longer.training["history"]["loss"]) == 3
    assert longer.training["history"]["loss"][:2] == first.training["history"]["loss"]
    assert (tmp_path / "run" / "report.json").read_text() == report_text and longer.report == first.report
    assert load_recipe(tmp_path / "run" / "recipe.yaml").train.epochs == 3


def test_a_resumed_run_whose_report_was_never_written_measures_again_beside_no_dead_capture(tmp_path):
    """Killed while it wrote the report: the resumed run measures again, and the first attempt's captures go, so
    that each side's trace directory holds the one capture the report points at."""
    runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=0"]), out_dir=tmp_path / "run")
    for report in (tmp_path / "run").glob("report.*"):
        report.unlink()
    runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=0"]), out_dir=tmp_path / "run", resume=True)
    for side in ("before", "after"):
        captures = list((tmp_path / "run" / "tensorboard" / side).rglob("*.xplane.pb"))
        assert len(captures) == 1, captures
    assert (tmp_path / "run" / "report.json").exists()


def test_resume_refuses_other_settings_and_directories_without_a_run(tmp_path):
    runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=0"]), out_dir=tmp_path / "run")
    with pytest.raises(TfoptError, match=r"made with train.learning_rate: 0.001, and this command asks for 0.01"):
        runner.run(
            load_recipe(write(tmp_path), overrides=["train.learning_rate=0.01"]), out_dir=tmp_path / "run", resume=True
        )
    (tmp_path / "empty").mkdir()
    with pytest.raises(TfoptError, match="holds no run to continue"):
        runner.run(load_recipe(write(tmp_path)), out_dir=tmp_path / "empty", resume=True)


def test_a_diverging_run_stops_with_the_step_and_keeps_its_report(tmp_path):
    recipe = load_recipe(write(tmp_path), overrides=["train.optimizer=sgd", "train.learning_rate=1e30"])
    with pytest.raises(NonFiniteLossError) as error:
        runner.run(recipe, out_dir=tmp_path / "run")
    message = str(error.value)
    # The loss goes non-finite first, or the weights do (a checkpoint is never written from them).
    assert message.startswith(
        (
            f"Training stopped at step {error.value.step}: the loss is ",
            f"Training stopped at step {error.value.step}: the model's weights hold NaN or Inf",
        )
    )
    assert f"The partial outputs of this run are in {tmp_path / 'run'}." in message
    assert (tmp_path / "run" / "report.json").exists() and not (tmp_path / "run" / "training.json").exists()


def test_a_failed_run_leaves_earlier_runs_untouched_and_says_where_its_outputs_are(tmp_path, monkeypatch):
    earlier = tmp_path / "runs" / "tiny-earlier"
    earlier.mkdir(parents=True)
    (earlier / "report.md").write_text("earlier\n")

    def failing_train(*args, **kwargs):
        raise TfoptError("Training failed: ResourceExhaustedError: out of memory")

    monkeypatch.setattr(run_training, "train_model", failing_train)
    with pytest.raises(TfoptError) as error:
        runner.run(load_recipe(write(tmp_path)), runs_root=tmp_path / "runs")
    assert "out of memory" in str(error.value) and "partial outputs of this run are in" in str(error.value)
    assert (earlier / "report.md").read_text() == "earlier\n"
    failed = [path for path in (tmp_path / "runs").iterdir() if path != earlier]
    # The report is written before training, so a run that fails while training keeps its measurements.
    assert sorted(item.name for item in failed[0].iterdir()) == [
        "recipe.yaml",
        "report.html",
        "report.json",
        "report.md",
        "tensorboard",
    ]


def test_run_refuses_an_out_directory_that_holds_files(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep\n")
    with pytest.raises(TfoptError, match="already holds files"):
        runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=0"]), out_dir=out)
    assert [item.name for item in out.iterdir()] == ["keep.txt"]


def test_diagnose_profiles_the_baseline_without_writing_anything(tmp_path):
    profile = runner.diagnose(load_recipe(write(tmp_path)))
    assert len(profile.measurement.real.seconds) == 2 and len(profile.measurement.ceiling.seconds) == 2
    assert profile.measurement.ceiling_ratio > 0
    assert len(profile.breakdown.step_seconds) == 2
    assert sorted(item.name for item in tmp_path.iterdir()) == ["tiny.yaml"]


def test_a_failed_resume_keeps_the_saved_recipe_so_the_run_can_be_resumed_as_it_was(tmp_path, monkeypatch):
    runner.run(load_recipe(write(tmp_path)), out_dir=tmp_path / "run")
    saved = (tmp_path / "run" / "recipe.yaml").read_text()

    def disk_full(*args, **kwargs):
        raise TfoptError("No space left on device.")

    monkeypatch.setattr(run_training, "train_model", disk_full)
    with pytest.raises(TfoptError, match="No space left on device"):
        runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=3"]), out_dir=tmp_path / "run", resume=True)
    assert (tmp_path / "run" / "recipe.yaml").read_text() == saved  # still 2 epochs: resuming with 2 works


def test_a_run_interrupted_before_its_first_output_leaves_no_directory(tmp_path, monkeypatch):
    def interrupted(recipe):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "create_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run(load_recipe(write(tmp_path)), out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_resume_that_would_shrink_the_run_is_refused_and_changes_nothing(tmp_path):
    runner.run(load_recipe(write(tmp_path)), out_dir=tmp_path / "run")
    saved = (tmp_path / "run" / "recipe.yaml").read_text()
    with pytest.raises(TfoptError, match=r"only train.epochs may grow"):
        runner.run(load_recipe(write(tmp_path), overrides=["train.epochs=1"]), out_dir=tmp_path / "run", resume=True)
    assert (tmp_path / "run" / "recipe.yaml").read_text() == saved
