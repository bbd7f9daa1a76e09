"""`tfopt-recipe`: run, check and inspect YAML recipe files from the command line.

Thin by design: it parses arguments, hands off to `tfopt.recipe_file` and `tfopt.run.runner`, and decides
what the user sees (progress on stderr, the result on stdout). Only the standard library and tfopt's
light modules are imported at start, so `--help` and `--version` answer at once; TensorFlow is imported
by the commands that need it.

Exit codes: 0 success; 2 a bad recipe file or command line; 1 the run failed; 128 + the signal's number
when stopped by SIGINT (130, Ctrl-C), SIGTERM (143) or SIGHUP (129), which all stop a run the same clean
way (workers stopped, outputs so far kept, `--resume` continues). A tfopt error is printed as one
paragraph, never as a traceback (`--traceback` shows it for bug reports).

Example:
    $ tfopt-recipe run recipes/resnet.yaml
    $ tfopt-recipe run recipes/small_cnn.yaml --set train.epochs=1 --steps 5 --out runs/try
    $ tfopt-recipe run recipes/small_cnn.yaml --out runs/try --resume      # continue a killed run
    $ tfopt-recipe run recipes/small_cnn.yaml --workers 2                  # 2 local workers
    $ tfopt-recipe diagnose recipes/small_cnn.yaml                         # what holds training back
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import shlex
import signal
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tfopt._version import __version__
from tfopt.cli import options
from tfopt.cli.interrupt import signals_interrupt
from tfopt.cli.progress import PROGRAM, terminal_progress
from tfopt.cli.quiet_start import library_records_quieted, tensorflow_started_quietly
from tfopt.errors import (
    EnvironmentVariableError,
    RecipeFileError,
    RunInterrupted,
    TfoptError,
    describe_error,
    storage_error,
)

if TYPE_CHECKING:
    from tfopt.profiling.diagnose import Diagnosis
    from tfopt.recipe_file.loader import RecipeFile


class _UsageError(Exception):
    """A command-line mistake found after parsing (exit code 2, like argparse's own)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line and returns the exit code (the console script exits with it).

    Args:
        argv: The arguments, without the program name; `sys.argv[1:]` when None.

    Returns:
        0 on success, 2 for a bad recipe file or command line, 1 when the run failed, 130 on Ctrl-C.

    Example:
        >>> main(["run", "recipes/small_cnn.yaml", "--steps", "5"])  # doctest: +SKIP
        0
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.handler is None:
        parser.print_help(sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        farewell = functools.partial(_report_signal, args=args)
        with signals_interrupt(farewell), tensorflow_started_quietly(), library_records_quieted():
            return args.handler(args)
    except (RecipeFileError, EnvironmentVariableError, _UsageError) as error:
        return _report_error(error, 2, args)
    except TfoptError as error:
        return _report_error(error, 1, args)
    except KeyboardInterrupt as interrupt:
        return _report_interrupt(interrupt, args)
    except BrokenPipeError:  # the reader of the output left (`| head`): nothing to say, as any Unix tool
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail too
        return 128 + signal.SIGPIPE
    except OSError as error:  # the machine's refusal, not a bug: it names its path or address
        kept = "Free space, or choose a writable --out, then run again (--resume continues a run)."
        storage = storage_error(error, error.filename, kept)
        if storage is not None:
            storage.__cause__ = error  # for --traceback
        return _report_error(storage or error, 1, args, hint="" if storage else _TRACEBACK_HINT)
    except Exception as error:  # noqa: BLE001 - the last line of defence: one paragraph, not a traceback
        # TensorFlow's errors come from the data, the model or the machine it runs on; others are tfopt's bugs.
        tensorflows = type(error).__module__.startswith("tensorflow")
        return _report_error(error, 1, args, hint=_TRACEBACK_HINT if tensorflows else _BUG_HINT)


_TRACEBACK_HINT = " Rerun with --traceback to see where it happened."
_BUG_HINT = " This may be a bug in tfopt or in your model code: rerun with --traceback to see where it happened."


def _report_signal(name: str, *, args: argparse.Namespace) -> int:
    """An interruption the command could not wait for, in the words of one it handled: its workers, if any,
    are not stopped by it but by the kernel, which signals them as it exits (`PR_SET_PDEATHSIG`)."""
    interrupt = RunInterrupted(name, getattr(args, "run_dir", None))
    return _report_interrupt(interrupt, args, workers_ended="get SIGTERM as it exits")


def _report_interrupt(
    interrupt: KeyboardInterrupt, args: argparse.Namespace, workers_ended: str = "were stopped"
) -> int:
    name = getattr(interrupt, "signal_name", "SIGINT")
    run_dir = getattr(interrupt, "run_dir", None)  # set by `run` once it has a run directory
    workers = getattr(args, "workers", None)
    said = f" Its {workers} workers {workers_ended}." if workers and run_dir else ""
    if run_dir:
        command = shlex.join(  # pasted into a shell as it is: paths and --set values with spaces stay whole
            [
                PROGRAM,
                "run",
                args.file,
                *options.worker_arguments(args),
                "--out",
                os.fspath(run_dir),
                "--resume",
                *(["--workers", str(workers)] if workers else []),
            ]
        )
        said += f" The outputs so far are in {run_dir}; `{command}` continues the run."
    _close_progress_bars()
    print(f"{PROGRAM}: interrupted ({name}).{said}", file=sys.stderr)
    return 128 + signal.Signals[name].value


def _close_progress_bars() -> None:
    """Closes the bars an interrupted fit left open (Keras ends no callback when `fit` raises), so that the
    message goes below them and they are not drawn again over it when the process exits."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        for bar in list(getattr(tqdm.tqdm, "_instances", ())):  # tqdm's own registry of open bars
            bar.close()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `tfopt-recipe` (importing it imports no TensorFlow).

    Example:
        >>> build_parser().parse_args(["validate", "recipes/small_cnn.yaml"]).file
        'recipes/small_cnn.yaml'
    """
    parser = argparse.ArgumentParser(
        prog=PROGRAM,
        description="Run YAML recipes that make TensorFlow/Keras training use its hardware "
        "well, and prove the gain with before/after measurements.",
        epilog="Exit codes: 0 success, 2 bad recipe file or arguments, 1 run failure. "
        "Example: tfopt-recipe run recipes/resnet.yaml",
    )
    parser.add_argument("--version", action="version", version=f"{PROGRAM} {__version__}")
    parser.set_defaults(handler=None)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quiet", "-q", action="store_true", help="no progress bars or log lines")
    common.add_argument("--json", action="store_true", help="print the result as one JSON document")
    common.add_argument("--traceback", action="store_true", help="show Python tracebacks (for bug reports)")
    overrides = argparse.ArgumentParser(add_help=False, parents=[common])
    overrides.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a value of the file, parsed as YAML (repeatable): --set train.epochs=2 "
        "--set data.image_size=[32,32] --set recipes.0.xla.jit_compile=false",
    )
    overrides.add_argument(
        "--steps", type=int, metavar="N", help="timed steps of each measurement (same as --set profile.steps=N)"
    )
    overrides.add_argument(
        "--tune-budget",
        type=options.seconds,
        metavar="TIME",
        help="time `recipes: auto` may spend timing candidates, e.g. 120s or 2m "
        "(same as --set profile.tune_budget_seconds=120)",
    )
    recipe_options = argparse.ArgumentParser(add_help=False, parents=[overrides])
    recipe_options.add_argument("file", metavar="FILE", help="a YAML recipe file, e.g. recipes/resnet.yaml")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")

    run = commands.add_parser("run", parents=[recipe_options], help="apply a recipe, measure, train, report")
    run.add_argument("--out", metavar="DIR", help="run directory (new or empty); default runs/<name>-<timestamp>")
    run.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out DIR after a crash or kill: keep its report, train from its "
        "newest checkpoint (train.epochs may be raised to train longer)",
    )
    run.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="train with N local worker processes over 127.0.0.1 (MultiWorkerMirroredStrategy; "
        "the recipes need a distribution item); measured on one process first",
    )
    run.add_argument("--dry-run", action="store_true", help="print the resolved recipe and plan, run nothing")
    run.set_defaults(handler=_run)
    commands.add_parser(
        "validate",
        parents=[recipe_options],
        help="check a recipe file, run nothing",
        description="Check a recipe file without running or fetching anything it names. A recipe that names "
        "a model by import path (package.module:function) is code, like a script: `run` imports "
        "that module and calls the function; validate only finds the module's file, so it checks "
        "the model's arguments when it runs. Standard-library modules and functions that are not "
        "Python functions or classes are refused as models.",
    ).set_defaults(handler=_validate)
    diagnose = commands.add_parser(
        "diagnose", parents=[overrides], help="measure the baseline (or read an existing trace), change nothing"
    )
    diagnose.add_argument("file", metavar="FILE", nargs="?", help="a YAML recipe file, e.g. recipes/resnet.yaml")
    diagnose.add_argument(
        "--trace",
        metavar="DIR",
        help="diagnose an existing TF Profiler capture instead (a TensorBoard logdir or "
        ".xplane.pb, e.g. from Keras' TensorBoard(profile_batch=...)); runs nothing",
    )
    diagnose.set_defaults(handler=_diagnose)
    convert = commands.add_parser("convert", parents=[recipe_options], help="write the recipe's data as TFRecord files")
    convert.add_argument("--out", metavar="DIR", required=True, help="directory for the TFRecord files")
    convert.add_argument(
        "--overwrite",
        action="store_true",
        help="write the conversion again even where DIR holds a complete one (of this data or "
        "other data); without it, a complete conversion of this data is verified and kept, "
        "and a damaged one written again",
    )
    convert.set_defaults(handler=_convert)
    commands.add_parser("list", parents=[common], help="list recipes, models and data sources").set_defaults(
        handler=_list
    )
    _add_data_service(commands, common)
    return parser


def _add_data_service(commands: Any, common: argparse.ArgumentParser) -> None:
    service = commands.add_parser(
        "data-service",
        help="run a tf.data service dispatcher or worker (for the data_service recipe)",
        description="TensorFlow's tf.data service servers, one per command, in the foreground until SIGTERM or "
        "Ctrl-C (docs/data-service.md has Kubernetes and Slurm examples). A recipe reaches them with "
        "`- data_service: {dispatcher: grpc://HOST:PORT}`.",
    )
    service.set_defaults(handler=lambda args: (service.print_help(sys.stderr), 2)[1])
    servers = service.add_subparsers(title="servers", metavar="SERVER")
    dispatcher = servers.add_parser("dispatcher", parents=[common], help="coordinate the workers")
    dispatcher.add_argument("--port", type=options.port, required=True, metavar="P", help="the port to serve on")
    dispatcher.add_argument(
        "--work-dir",
        metavar="DIR",
        help="keep a journal there, so that a restarted dispatcher keeps its datasets and jobs",
    )
    dispatcher.add_argument(
        "--worker-timeout",
        type=options.seconds,
        default=30.0,
        metavar="TIME",
        help="drop a worker whose heartbeats stopped this long ago (default 30s)",
    )
    dispatcher.set_defaults(handler=_data_service, server="dispatcher")
    worker = servers.add_parser("worker", parents=[common], help="run pipelines for a dispatcher")
    worker.add_argument("--dispatcher", required=True, metavar="HOST:PORT", help="the dispatcher's address")
    worker.add_argument(
        "--port", type=options.port, default=0, metavar="Q", help="the port to serve on (default: a free one)"
    )
    worker.add_argument(
        "--address",
        metavar="HOST:PORT",
        help="the address clients reach this worker at (default: this host's name and the port)",
    )
    worker.add_argument(
        "--dispatcher-timeout",
        type=options.seconds,
        default=10.0,
        metavar="TIME",
        help="fail where the dispatcher has not answered within TIME (default 10s, as long as a training run waits)",
    )
    worker.set_defaults(handler=_data_service, server="worker")
    for server in (dispatcher, worker):
        server.add_argument(
            "--report-every",
            type=options.seconds,
            default=30.0,
            metavar="TIME",
            help="how often to say what the server holds and sends (default 30s)",
        )


def _load(args: argparse.Namespace, *, start: bool = False, dry: bool = False) -> RecipeFile:
    """Loads the recipe; with `start`, first applies what must precede TensorFlow's device setup (GPU
    memory settings, joining a multi-worker cluster); with `dry`, runs and fetches nothing the file names
    (`load_recipe(..., dry=True)`)."""
    from tfopt.recipe_file import load_recipe, read_recipe

    document = read_recipe(args.file, options.overrides(args))  # parsed once for the whole run
    if start:
        from tfopt.run.process import start_process

        start_process(document)
    return load_recipe(document, dry=dry)


def _run(args: argparse.Namespace) -> int:
    from tfopt.run.directory import check_out_dir

    try:  # before anything is loaded, so a mistyped --out costs nothing
        check_out_dir(args.out, resume=args.resume)
    except TfoptError as error:
        raise _UsageError(str(error)) from error
    if args.workers is not None:
        return _run_workers(args)
    if args.dry_run:
        return _dry_run(_load(args, dry=True), args)
    from tfopt.run import runner

    with terminal_progress(args) as progress:  # first, so that joining a cluster says whom it waits for
        recipe = _load(args, start=True)
        outcome = runner.run(recipe, out_dir=args.out, progress=progress, resume=args.resume)
    _print_outcome(outcome, args)
    return 0


def _run_workers(args: argparse.Namespace) -> int:
    """Measures and reports in this process, then trains with N workers that continue its run directory.

    Measuring happens here, on one process with the machine to itself: under MultiWorkerMirroredStrategy
    Keras' `fit`, which the profiler's timed steps use, fails (keras-team/keras#20585). The workers are
    `python -m tfopt.cli run FILE --out RUN --resume`, so they take up the run this process started, and
    only the chief (worker 0) writes checkpoints and training.json.
    """
    if args.workers < 2:
        raise _UsageError(
            f"--workers {args.workers}: expected 2 or more worker processes; for one process, run without --workers."
        )
    # Its runtime: settings hold here too (workers share the GPUs).
    recipe = _load(args, start=not args.dry_run, dry=args.dry_run)
    if isinstance(recipe.recipes, str) or "distribution" not in {item.name for item in recipe.recipes}:
        raise _UsageError(
            f"--workers {args.workers} needs a distribution recipe in the recipe list, or every worker "
            "would train a model of its own. Add `- distribution: {strategy: auto}` under recipes: "
            f"({recipe.where('recipes')})."
        )
    if args.dry_run:
        return _dry_run(recipe, args)
    from tfopt.distribute import launch_local_workers
    from tfopt.run import runner
    from tfopt.run.directory import LOCK_HELD_ENV, run_dir_lock, training_record

    with terminal_progress(args) as progress:
        measured = runner.run(recipe, out_dir=args.out, progress=progress, resume=args.resume, train=False)
        progress.phase(f"training with {args.workers} workers on 127.0.0.1")
        # The workers inherit the run directory's lock: it stays held while any of them lives.
        with run_dir_lock(measured.run_dir) as lock:
            try:
                # The workers print little (--quiet): their error paragraphs and summary lines, as they come.
                launch_local_workers(
                    [
                        sys.executable,
                        "-m",
                        "tfopt.cli",
                        "run",
                        args.file,
                        *options.worker_arguments(args),
                        "--out",
                        os.fspath(measured.run_dir),
                        "--resume",
                        "--quiet",
                    ],
                    args.workers,
                    env={**os.environ, LOCK_HELD_ENV: os.path.realpath(measured.run_dir)},
                    pass_fds=(lock,),
                    output=options.worker_line,
                )
            except KeyboardInterrupt as interrupt:  # the launcher stopped the workers before this line
                raise RunInterrupted(
                    getattr(interrupt, "signal_name", "SIGINT"), os.fspath(measured.run_dir)
                ) from interrupt
    _print_outcome(dataclasses.replace(measured, training=training_record(measured.run_dir)), args)
    return 0


def _print_outcome(outcome: Any, args: argparse.Namespace) -> None:
    if args.json:
        _print_json(outcome.to_dict())
    else:
        print(outcome.summary())


def _dry_run(recipe: RecipeFile, args: argparse.Namespace) -> int:
    from tfopt.run import runner

    if recipe.model.builder is not None and recipe.data.source_object is not None:
        recipe = runner.prepare(recipe)  # the arguments the data decides; else decided when the run starts
    plan = runner.describe(recipe, out_dir=args.out, workers=getattr(args, "workers", None))
    if args.json:
        _print_json({"resolved": recipe.to_dict(), "plan": plan})
        return 0
    import yaml

    print(
        f"# Resolved recipe (dry run: nothing is built, measured or written)\n"
        f"{yaml.safe_dump(recipe.to_dict(), sort_keys=False, default_flow_style=None)}"
    )
    print("# Plan")
    print("\n".join(f"{index}. {line}" for index, line in enumerate(plan, 1)))
    return 0


def _validate(args: argparse.Namespace) -> int:
    recipe = _load(args, dry=True)
    notes = _unchecked(recipe)
    if args.json:
        _print_json({"valid": True, "resolved": recipe.to_dict(), "checked_when_run": notes})
        return 0
    recipes = recipe.recipes if isinstance(recipe.recipes, str) else ", ".join(r.name for r in recipe.recipes)
    print(
        f"{args.file}: valid. model {recipe.model.name}, data {recipe.data.source} (batch "
        f"{recipe.data.batch_size}), recipes: {recipes or '(none)'}."
    )
    for note in notes:
        print(f"  note: {note}")
    return 0


def _unchecked(recipe: RecipeFile) -> list[str]:
    """What a dry load leaves for `run` to check, in words."""
    notes = []
    if recipe.model.builder is None:
        notes.append(
            f"model {recipe.model.name}: the module was found, not imported (validate runs none of the "
            "recipe's code); `run` imports it, running its code as a script would, and checks the "
            "model's arguments then."
        )
    if recipe.data.source_object is None:
        notes.append(
            f"data: the {recipe.data.source} dataset is not prepared yet; `run` downloads it "
            "(download: true), validate does not."
        )
    return notes


def _diagnose(args: argparse.Namespace) -> int:
    if args.trace:
        return _diagnose_trace(args)
    if not args.file:
        raise _UsageError("diagnose needs a recipe FILE to measure, or --trace DIR to read an existing capture.")
    given = pathlib.Path(args.file)
    if given.is_dir() or given.name.endswith(".pb"):
        what = "a directory" if given.is_dir() else "a profiler capture file"
        raise _UsageError(
            f"{args.file} is {what}, not a recipe FILE to measure: to read an existing capture, give it as "
            f"`{PROGRAM} diagnose --trace {args.file}`."
        )
    recipe = _load(args, start=True)
    from tfopt.run import runner

    with terminal_progress(args) as progress:
        profile = runner.diagnose(recipe, progress=progress)
    real, ceiling = profile.measurement.real, profile.measurement.ceiling
    diagnosis = profile.diagnosis
    if args.json:
        _print_json(
            {
                "recipe": recipe.name,
                "hardware": profile.hardware.describe(),
                "measurement": profile.measurement.to_dict(),
                "breakdown": profile.breakdown.to_dict(),
                "metrics": profile.metrics.to_dict(),
                "diagnosis": diagnosis.to_dict(),
                "logdir": os.fspath(profile.logdir),
            }
        )
        return 0
    print(f"{recipe.name} on {profile.hardware.describe()}")
    print(
        f"baseline: {real.steps_per_second:.2f} steps/s ({real.examples_per_second:.1f} examples/s); on-device "
        f"compute-only ceiling {ceiling.steps_per_second:.2f} steps/s; {profile.metrics.headline()}."
    )
    _print_diagnosis(diagnosis)
    print(
        f"Nothing was changed. Trace: tensorboard --logdir {profile.logdir}. "
        f"`{PROGRAM} run {args.file}` applies the recipes and measures the gain."
    )
    return 0


def _diagnose_trace(args: argparse.Namespace) -> int:
    if args.file or options.overrides(args):
        raise _UsageError(
            "diagnose --trace reads an existing capture and runs nothing: give it no recipe FILE, "
            "--set, --steps or --tune-budget."
        )
    from tfopt.profiling.diagnose import diagnose_capture
    from tfopt.profiling.metrics import Metrics

    breakdown, hardware, diagnosis = diagnose_capture(args.trace)
    metrics = Metrics.of(hardware, None, breakdown)
    if args.json:
        _print_json(
            {
                "trace": args.trace,
                "gpus": [gpu.name for gpu in hardware.gpus],
                "breakdown": breakdown.to_dict(),
                "metrics": metrics.to_dict(),
                "diagnosis": diagnosis.to_dict(),
            }
        )
        return 0
    devices = ", ".join(gpu.name for gpu in hardware.gpus) or "no accelerator (a CPU-only capture)"
    print(
        f"{args.trace} ({devices}): {len(breakdown.step_seconds)} wall steps of "
        f"{breakdown.step_seconds_mean * 1e3:.2f} ms; {metrics.headline()}."
    )
    _print_diagnosis(diagnosis)
    return 0


def _print_diagnosis(diagnosis: Diagnosis) -> None:
    """The findings, then where the time goes inside the step (the slowest input stage, the heaviest layer)."""
    if not diagnosis.findings:
        print(diagnosis.summary)
    for finding in diagnosis.findings:
        print(
            f"- {finding.bottleneck} ({finding.severity}, {finding.percent:.1f}%) -> {finding.recipe}: {finding.reason}"
        )
    for line in diagnosis.hotspots.top_lines() if diagnosis.hotspots is not None else ():
        print(f"- {line}")
    for note in diagnosis.notes:
        print(f"  note: {note}")


def _data_service(args: argparse.Namespace) -> int:
    from tfopt.data.service_servers import serve_dispatcher, serve_worker

    def say(line: str) -> None:
        if not args.quiet:
            print(f"{PROGRAM} data-service: {line}", flush=True)

    try:
        if args.server == "dispatcher":
            if args.work_dir is not None and "://" not in args.work_dir:  # TF's own word for a bad one: RuntimeError
                from tfopt.run.directory import check_writable

                try:
                    check_writable(pathlib.Path(args.work_dir), "--work-dir")
                except TfoptError as error:
                    raise _UsageError(str(error)) from error
            serve_dispatcher(
                args.port,
                work_dir=args.work_dir,
                worker_timeout_seconds=args.worker_timeout,
                report_seconds=args.report_every,
                say=say,
            )
        else:
            serve_worker(
                args.dispatcher,
                port=args.port,
                address=args.address,
                answer_timeout_seconds=args.dispatcher_timeout,
                report_seconds=args.report_every,
                say=say,
            )
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: the server stopped and said so
        pass
    return 0


def _convert(args: argparse.Namespace) -> int:
    from tfopt.data import to_tfrecord
    from tfopt.run.directory import check_writable

    try:
        check_writable(pathlib.Path(args.out), "--out")
    except TfoptError as error:
        raise _UsageError(str(error)) from error
    recipe = _load(args)
    with terminal_progress(args) as progress:
        progress.phase(f"writing {recipe.data.source} data as TFRecord files to {args.out}")
        written = to_tfrecord(recipe.data.source_object, args.out, overwrite=args.overwrite)
    if args.json:
        _print_json({"out": os.fspath(args.out), "written": os.fspath(written) if written else None})
    else:
        print(f"wrote TFRecord files to {args.out}; use them with: data: {{source: tfrecord, path: {args.out}}}")
    return 0


def _list(args: argparse.Namespace) -> int:
    import tfopt.data
    from tfopt import models, registry

    listing = {
        "recipes": {name: _summary(registry.get(name)) for name in registry.names()},
        "models": {
            **{name: _summary(function) for name, function in models.MODELS.items()},
            **dict.fromkeys(models.application_names(), "keras.applications model"),
        },
        "data_sources": {name: _summary(source) for name, source in sorted(tfopt.data.SOURCES.items())},
    }
    if args.json:
        _print_json(listing)
        return 0
    for title, entries in (("Recipes", listing["recipes"]), ("Data sources", listing["data_sources"])):
        print(f"{title}:")
        print("\n".join(f"  {name:<18} {summary}" for name, summary in entries.items()))
    print("Models:")
    print("\n".join(f"  {name:<18} {models.MODELS[name].__doc__.strip().splitlines()[0]}" for name in models.MODELS))
    print(
        f"  keras.applications: {', '.join(models.application_names())} (weights: null unless you write "
        "weights: imagenet)"
    )
    print("  or any import path package.module:function returning a keras.Model")
    return 0


def _summary(obj: Any) -> str:
    doc = (obj.__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _report_error(error: BaseException, code: int, args: argparse.Namespace, hint: str = "") -> int:
    if args.traceback:
        traceback.print_exception(error)
    said = " ".join(str(error).split()) if isinstance(error, (TfoptError, _UsageError)) else describe_error(error)
    print(f"{PROGRAM}: error: {said}{hint}", file=sys.stderr)
    return code
