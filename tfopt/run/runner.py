"""Runs a resolved recipe file: builds the model and data, measures, applies the recipes, trains, reports.

Every run writes into a directory of its own (`runs/<name>-<timestamp>` by default): the resolved
recipe (recipe.yaml), the profiler traces and training scalars (tensorboard/), the checkpoints, the
report (report.html, report.md, report.json, rendered by `tfopt.profiling.report` from one set of
numbers) and training.json. A new run never writes into a directory that holds files, so a failed run
never touches an earlier one; one that fails before its first output (the model cannot be built) removes
the directory it made. The model is built by `tfopt.apply`, once per configuration (the baseline, the
optimized setup), from the recipe file's model function.

The report is written right after the measurements, before training, so a run killed while training
keeps it; `run(..., resume=True)` then skips measuring and continues training from the newest
checkpoint (see `tfopt.run.directory` for what a resumed run may change).

This module never prints: progress goes through a `Progress` object (the CLI passes one that draws
tqdm bars) and the `tfopt` logger.

Example:
    >>> from tfopt.recipe_file import load_recipe
    >>> outcome = run(load_recipe("recipes/small_cnn.yaml"))      # doctest: +SKIP
    >>> print(outcome.summary())                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tfopt._atomic import write_atomic
from tfopt.errors import DataError, RecipeFileError, RunInterrupted, TfoptError
from tfopt.profiling.metrics import Metrics, compared, describe_rounds
from tfopt.recipe_file import RecipeFile, save_resolved
from tfopt.recipe_file.schema import REPORT_SUFFIXES
from tfopt.run.directory import RESOLVED_RECIPE_NAME, discard_unused, new_run_dir, resumed_run_dir, run_dir_lock
from tfopt.run.model import compile_arguments, compile_as_recipe, create_model, prepare

if TYPE_CHECKING:
    import keras

    from tfopt.auto.search import ProgressEvent
    from tfopt.builder import Built
    from tfopt.optimize import ApplyResult
    from tfopt.profiling.capture import Profile
    from tfopt.profiling.report import Report

_log = logging.getLogger("tfopt")


class Progress:
    """What a run reports while it works. This base class reports nothing (library code is quiet)."""

    def phase(self, description: str) -> None:
        """A new phase of the run begins (reading data, measuring, training, ...)."""

    def run_directory(self, path: pathlib.Path) -> None:
        """The run's outputs go to `path` from now on (what an interruption's message points at)."""

    def training_callbacks(self, *, epochs: int, steps_per_epoch: int | None) -> list[keras.callbacks.Callback]:
        """Keras callbacks that show training progress; none by default."""
        return []

    def tuning(self, event: ProgressEvent) -> None:
        """A `tfopt.auto.ProgressEvent` of `recipes: auto` (a trial started or finished)."""


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What a finished run produced.

    Attributes:
        run_dir: The run's directory.
        recipe: The resolved recipe, as saved in `run_dir`.
        report: The report's numbers (`Report.to_dict()`, as in report.json), or None where nothing
            was measured (a worker of a multi-worker run, or `measure=False`).
        report_paths: Report format ("html", "markdown", "json") -> file.
        training: What training did (as in training.json), or None with `train.epochs: 0`.
        applied: What each recipe did and why (`Plan.applied` as dicts).
    """

    run_dir: pathlib.Path
    recipe: RecipeFile
    report: dict[str, Any] | None
    report_paths: dict[str, pathlib.Path]
    training: dict[str, Any] | None
    applied: tuple[dict[str, Any], ...] = ()

    def summary(self) -> str:
        """One line for the terminal: examples/s before and after on the hardware measured, accelerator busy %,
        MFU, input wait and input efficiency, training, the report's path."""
        trained = ""
        if self.training is not None:
            workers = f" on {self.training['replicas']} replicas" if self.training.get("replicas") else ""
            trained = f"; trained to step {self.training['global_step']}{workers}"
        if self.report is None or len(self.report["runs"]) < 2:
            return f"{self.recipe.name}: not measured{trained}; outputs in {self.run_dir}"
        before, after = self.report["runs"]["before"], self.report["runs"]["after"]
        path = next(
            (self.report_paths[name] for name in ("html", "markdown", "json") if name in self.report_paths),
            self.run_dir,
        )
        rounds = describe_rounds(self.report["speedup_rounds"]) if self.report.get("speedup_rounds") else ""
        return (
            f"{self.recipe.name}: {before['examples_per_second']:.1f} -> {after['examples_per_second']:.1f} examples/s "
            f"({self.report['speedup']:.2f}x{rounds}) on {self.report['hardware']}; "
            f"{compared(Metrics.from_dict(before), Metrics.from_dict(after))}"
            f"{trained}; report: {path}"
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe record: run directory, resolved recipe, report numbers, training, report paths."""
        return {
            "run_dir": os.fspath(self.run_dir),
            "recipe": self.recipe.to_dict(),
            "applied": list(self.applied),
            "report": self.report,
            "training": self.training,
            "summary": self.summary(),
            "reports": {name: os.fspath(path) for name, path in self.report_paths.items()},
        }


def run(
    recipe: RecipeFile,
    *,
    out_dir: str | os.PathLike | None = None,
    runs_root: str | os.PathLike = "runs",
    progress: Progress | None = None,
    resume: bool = False,
    train: bool = True,
) -> RunOutcome:
    """Runs a recipe: measures before and after its recipes, writes the report, trains.

    Args:
        recipe: A recipe from `load_recipe`.
        out_dir: The run directory; new or empty, or with `resume` an earlier run's. Default
            `<runs_root>/<name>-<timestamp>`.
        runs_root: Where default run directories are made.
        progress: Receives phase changes and supplies training progress callbacks.
        resume: Continue the run in `out_dir`: keep its report if it was written, and train from its
            newest checkpoint.
        train: Train after measuring (False: measure and report only, as the launcher of workers does).
            In a worker of a multi-worker cluster nothing is measured (the process that launched the
            workers did) and only the chief writes.

    Returns:
        The run's outcome; `outcome.summary()` is the line to show.

    Raises:
        RecipeFileError: The model rejects its arguments.
        NonFiniteLossError: The loss went NaN/Inf while training; the message names the last good checkpoint.
        TfoptError: `out_dir` holds files already (or no run to resume), or data, measurement or training
            failed; the message says why and where the partial outputs are.
    """
    import keras

    from tfopt.distribute.environment import detect_environment
    from tfopt.training.stopping import stops_at_step_ends

    progress = progress or Progress()
    cluster = detect_environment()
    keras.utils.set_random_seed(recipe.train.seed)
    progress.phase("reading data")
    recipe = prepare(recipe)
    made = False  # whether this call made the run directory (then a run that wrote nothing leaves none)
    if resume:
        run_dir = resumed_run_dir(out_dir, recipe.to_dict())
    elif cluster.is_chief:
        made = out_dir is None or not pathlib.Path(out_dir).exists()
        run_dir = new_run_dir(recipe.name, out_dir, runs_root)
    else:  # the chief makes the directory; a worker only needs its name (for temporary checkpoint copies)
        run_dir = pathlib.Path(out_dir or ".")
    progress.run_directory(run_dir)
    with run_dir_lock(run_dir) if cluster.is_chief else contextlib.nullcontext():
        if cluster.is_chief and not resume:
            save_resolved(recipe, run_dir / RESOLVED_RECIPE_NAME)
        try:
            # A signal never raises inside TensorFlow's work (training/stopping.py). Where workers train (a
            # worker of a cluster, or `run --workers`' launcher measuring before it starts them) it is
            # taken as before, at once: the launcher's stop of its workers relies on it.
            alone = cluster.num_workers == 1 and train
            with stops_at_step_ends() if alone else contextlib.nullcontext():
                report, report_paths, built, training = _run_in(
                    run_dir, recipe, progress, cluster, resume=resume, train=train
                )
        except BaseException as error:
            said = _in_recipe_terms(recipe, error)
            if made and discard_unused(run_dir):  # failed before its first output (the model could not be built)
                if said is not None:
                    raise said from error
                raise
            if isinstance(error, KeyboardInterrupt):
                raise RunInterrupted(getattr(error, "signal_name", "SIGINT"), os.fspath(run_dir)) from error
            where = f" The partial outputs of this run are in {run_dir}."
            if said is not None:
                said.args = (f"{said}{where}",)
                raise said from error
            if isinstance(error, TfoptError):
                error.args = (f"{' '.join(str(error).split())}{where}",)
            raise
    return RunOutcome(
        run_dir=run_dir,
        recipe=recipe,
        report=report,
        report_paths=report_paths,
        training=training,
        applied=tuple(dataclasses.asdict(step) for step in built.plan.applied),
    )


def _in_recipe_terms(recipe: RecipeFile, error: BaseException) -> TfoptError | None:
    """The error said in the recipe's terms where that says more: a damaged data file named (TensorFlow names
    none), or data that does not fit the model pointed at the `model:` setting the file wrote, else None."""
    if not isinstance(error, Exception):
        return None
    damage = recipe.data.source_object.explain_failure(error)
    if damage:
        return DataError(damage)
    setting = getattr(error, "setting", None)
    if isinstance(error, DataError) and setting in ("input_shape", "classes") and setting in recipe.model.given:
        return RecipeFileError(
            f"{' '.join(str(error).split())} Fix model.{setting} "
            f"({recipe.where('model', setting)}), or leave it out: it follows the data."
        )
    return None


def _run_in(
    run_dir: pathlib.Path, recipe: RecipeFile, progress: Progress, cluster: Any, *, resume: bool, train: bool
) -> tuple[dict[str, Any] | None, dict[str, pathlib.Path], Any, dict[str, Any] | None]:
    """`run`'s work inside its directory: the report (measured now or kept from the first attempt), the
    built model, and training."""
    report = _earlier_report(run_dir) if resume else None
    report_paths = {
        name: run_dir / f"report{REPORT_SUFFIXES[name]}"
        for name in recipe.report.formats
        if report is not None and (run_dir / f"report{REPORT_SUFFIXES[name]}").exists()
    }
    written = None  # the Report object this process wrote, re-rendered with the training's windows
    if report is None and cluster.num_workers == 1:
        if resume:
            _discard_dead_captures(recipe, run_dir)
        progress.phase("measuring the baseline, applying recipes, measuring again (TF Profiler)")
        built, written, report_paths = _measure(recipe, run_dir, progress)
        report = written.to_dict()
    else:
        progress.phase("applying recipes" + (" (measurements kept from the first attempt)" if report else ""))
        built = _build(recipe, progress)
    training = None
    try:
        if train and recipe.train.epochs:
            from tfopt.run.training import train_model

            progress.phase(f"training {recipe.train.epochs} epoch(s)")
            train = recipe.train
            # Only the chief shows progress (a bar is drawn as its callback is made).
            shown = (
                progress.training_callbacks(epochs=train.epochs, steps_per_epoch=train.steps_per_epoch)
                if cluster.is_chief
                else []
            )
            training = train_model(
                built,
                recipe,
                run_dir,
                shown,
                tensorboard_dir=logdir(recipe, run_dir),
                chief=cluster.is_chief,
            )
            if cluster.is_chief and training.get("monitor") and report_paths:
                report = _with_training(written, training["monitor"], report_paths) or report
    finally:
        built.close()  # the tf.data service workers that fed training, if any
    if resume and cluster.is_chief:  # it may have raised train.epochs: saved once those epochs trained
        save_resolved(recipe, run_dir / RESOLVED_RECIPE_NAME)
    return report, report_paths, built, training


def describe(recipe: RecipeFile, *, out_dir: str | os.PathLike | None = None, workers: int | None = None) -> list[str]:
    """What `run` would do with this recipe, step by step, for `tfopt-recipe run --dry-run`: nothing is
    built, measured or written. Kept beside `run` so the two change together.

    Example:
        >>> from tfopt.recipe_file import load_recipe
        >>> describe(load_recipe("recipes/small_cnn.yaml"))[1]
        'apply recipes in build order: data_pipeline, mixed_precision, xla, distribution'
    """
    from tfopt.optimize import resolve_recipes

    if recipe.recipes == "auto":
        order = (
            f"auto: time the candidate recipes on this machine for up to {recipe.profile.tune_budget_seconds:g} "
            "s, keep only those that help"
        )
    else:
        chosen = resolve_recipes(_recipes_argument(recipe))
        order = ", ".join(item.name for item in chosen.recipes) or "(none)"
    steps = f"{recipe.train.steps_per_epoch} steps" if recipe.train.steps_per_epoch else "the whole dataset"
    return [
        f"profile the baseline: {recipe.profile.warmup_steps} warm-up + {recipe.profile.steps} timed steps, "
        "real input and on-device compute-only ceiling, a TF Profiler trace",
        f"apply recipes in build order: {order}",
        "profile the optimized setup the same way, write "
        + ", ".join(f"report{REPORT_SUFFIXES[name]}" for name in recipe.report.formats),
        f"train {recipe.train.epochs} epoch(s) of {steps}, batch {recipe.data.batch_size}, checkpoints every "
        f"{recipe.train.checkpoint_every_steps} steps, under tfopt.Monitor"
        + (f", on {workers} local workers" if workers else ""),
        f"write {out_dir or f'runs/{recipe.name}-<timestamp>'}/: {RESOLVED_RECIPE_NAME}, tensorboard/, "
        f"checkpoints/, training.json and the report",
    ]


def _measure(recipe: RecipeFile, run_dir: pathlib.Path, progress: Progress) -> tuple[Any, Any, dict]:
    """Profiles before and after with `tfopt.apply(..., profile=True)` and writes the report at once, so a
    run that fails while training keeps its measurements."""
    result = _apply(
        recipe,
        progress,
        steps=recipe.profile.steps,
        warmup_steps=recipe.profile.warmup_steps,
        profile=True,
        logdir=os.fspath(logdir(recipe, run_dir)),
    )
    with _closed_on_failure(result):
        progress.phase("writing the report")
        report = result.report(
            price_per_hour=recipe.report.price_per_hour, steps_per_epoch=recipe.train.steps_per_epoch
        )
        paths = {name: run_dir / f"report{REPORT_SUFFIXES[name]}" for name in recipe.report.formats}
        _save(report, paths.values())
    return _built(result), report, paths


@contextlib.contextmanager
def _closed_on_failure(built: Built) -> Iterator[None]:
    """Stops what `built` started for its dataset (tf.data service workers) where the block fails; a block
    that succeeds hands it on still running."""
    try:
        yield
    except BaseException:
        built.close()
        raise


def _with_training(report: Report, windows: list[dict[str, Any]], paths: dict[str, pathlib.Path]) -> dict | None:
    """Writes the report again with the training's Monitor windows (its Training section and chart) and
    returns its numbers; None, with a warning, where it cannot be rendered (the measured report stays).

    `report` is the `Report` this process measured, or None for a resumed run, whose measurements the
    first attempt saved: the section then goes into the saved files (`report.add_training`).
    """
    from tfopt.profiling.report import add_training

    try:
        if report is None:
            return add_training(list(paths.values()), windows)
        report = dataclasses.replace(report, training=tuple(windows))
        _save(report, paths.values())
    except Exception as error:  # noqa: BLE001 - a plotting failure must not fail a run that trained
        _log.warning(
            "The report keeps its measurements without the training section: rendering it failed (%s: %s).",
            type(error).__name__,
            error,
        )
        return None
    return report.to_dict()


def _save(report: Report, paths: dict[str, pathlib.Path]) -> None:
    """Writes the report in every format, each rendered before any file is replaced, so that a rendering error
    replaces none of them. Each file is replaced whole; a run killed between two of them leaves the first ones
    new and the others as they were, until `--resume` writes them all again."""
    rendered = {path: report.render(path) for path in paths}
    for path, text in rendered.items():
        write_atomic(path, text)


def _build(recipe: RecipeFile, progress: Progress) -> Built:
    """Applies the recipes and builds, measuring nothing (in a worker, under the cluster it joined)."""
    return _built(_apply(recipe, progress, measure_speed=False))


def _apply(recipe: RecipeFile, progress: Progress, **measuring: Any) -> ApplyResult:
    """`tfopt.apply` with the recipe file's model, data, recipes and tuning budget. The model is created by
    `tfopt.apply`'s build, once per configuration it measures or returns."""
    import tfopt

    return tfopt.apply(
        None,
        recipe.data.source_object,
        recipes=_recipes_argument(recipe),
        model_fn=_model_fn(recipe),
        # A function of the user's may compile its model (a GAN its own way): then its compile is theirs.
        compile=None if recipe.model.is_import_path else compile_arguments(recipe),
        batch_size=recipe.data.batch_size,
        tune_budget_seconds=recipe.profile.tune_budget_seconds,
        on_tune_progress=progress.tuning,
        **measuring,
    )


def _model_fn(recipe: RecipeFile) -> Callable[[], keras.Model]:
    """The recipe's model, compiled (`compile_as_recipe`), made anew at each call; a model that comes compiled
    by its function is said so once."""
    told = []

    def model_fn() -> keras.Model:
        model = create_model(recipe)
        note = compile_as_recipe(model, recipe)
        if note is not None and not told:
            _log.warning("%s", note)
            told.append(note)
        return model

    return model_fn


def _built(result: Any) -> Built:
    from tfopt.builder import Built

    return Built(
        model=result.model, dataset=result.dataset, strategy=result.strategy, plan=result.plan, service=result.service
    )


def _recipes_argument(recipe: RecipeFile) -> Any:
    return recipe.recipes if isinstance(recipe.recipes, str) else list(recipe.recipes)


def _earlier_report(run_dir: pathlib.Path) -> dict[str, Any] | None:
    """The numbers of an earlier attempt's report.json, or None (then the resumed run measures again)."""
    try:
        return json.loads((run_dir / "report.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _discard_dead_captures(recipe: RecipeFile, run_dir: pathlib.Path) -> None:
    """Removes the captures of an attempt killed before its report was written, which the new measurement would
    sit beside (two runs in TensorBoard, and `diagnose --trace` refusing to pick one). Only the run directory's
    own: a `profile.logdir` elsewhere is the user's, left as it is."""
    import shutil

    traces = logdir(recipe, run_dir)
    if traces.resolve().is_relative_to(run_dir.resolve()):
        for side in ("before", "after"):
            shutil.rmtree(traces / side, ignore_errors=True)


def logdir(recipe: RecipeFile, run_dir: pathlib.Path) -> pathlib.Path:
    """The TensorBoard directory: `profile.logdir`, or `<run_dir>/tensorboard`."""
    return pathlib.Path(recipe.profile.logdir) if recipe.profile.logdir else run_dir / "tensorboard"


def diagnose(recipe: RecipeFile, *, progress: Progress | None = None) -> Profile:
    """Profiles the recipe's baseline (no recipe applied) and diagnoses it, writing nothing.

    Returns:
        The baseline's `tfopt.profiling.capture.Profile`: `.diagnosis.findings` name each bottleneck,
        the recipe that fixes it and why; `.measurement` holds the real and compute-only step times.
    """
    import keras

    import tfopt
    from tfopt.plan import chosen_jit_compile
    from tfopt.training.stopping import stops_at_step_ends

    progress = progress or Progress()
    keras.utils.set_random_seed(recipe.train.seed)
    progress.phase("reading data")
    recipe = prepare(recipe)
    progress.phase("building the model")
    with stops_at_step_ends():  # a signal never raises inside TensorFlow's work (training/stopping.py)
        model = _model_fn(recipe)()
        if chosen_jit_compile(model, None) == "auto":  # "before" never silently includes XLA (as in a run's)
            model.jit_compile = False
        progress.phase("profiling the baseline (TF Profiler)")
        dataset = recipe.data.source_object.pipeline(batch_size=recipe.data.batch_size, optimized=False)
        return tfopt.profile(model, dataset, steps=recipe.profile.steps, warmup_steps=recipe.profile.warmup_steps)
