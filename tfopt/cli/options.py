"""The command line's options as the library takes them: `--set`/`--steps`/`--tune-budget` as recipe
overrides, durations, and what a worker process started by `run --workers N` repeats and shows.
"""

from __future__ import annotations

import argparse
import re
import sys

from tfopt.cli.quiet_start import min_log_level, startup_noise, wants_tensorflow_logs


def overrides(args: argparse.Namespace) -> list[str]:
    """The `--set` options, with `--steps` and `--tune-budget` as the overrides they stand for."""
    return (
        list(args.overrides)
        + ([f"profile.steps={args.steps}"] if args.steps is not None else [])
        + ([f"profile.tune_budget_seconds={args.tune_budget}"] if args.tune_budget is not None else [])
    )


def seconds(text: str) -> float:
    """`120`, `120s`, `2m` or `1h` as seconds (argparse type)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    number, unit = (text[:-1], text[-1]) if text[-1:].lower() in units else (text, "s")
    try:
        seconds = float(number) * units[unit.lower()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration; expected e.g. 120s, 2m or 120") from None
    if not 0 < seconds < float("inf"):  # also refuses nan, which passes a plain `<= 0` test
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite duration above 0, e.g. 120s")
    return seconds


def port(text: str) -> int:
    """A TCP port number, 0 (a free one) to 65535 (argparse type)."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number; expected 0 to 65535") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535")
    return number


def worker_line(line: str) -> None:
    """Shows a worker's output line, except TensorFlow's INFO and WARNING lines (each worker leaves out its
    own start-up noise; these are the lines a worker's libraries log later, below tfopt's default level)."""
    text = re.sub(r"^\[worker \d+\] ", "", line)
    if wants_tensorflow_logs() or not startup_noise([text], min_log_level())[0]:
        print(line, file=sys.stderr, flush=True)


def worker_arguments(args: argparse.Namespace) -> list[str]:
    """The options of this command that every worker repeats (all but --out, --resume, --workers)."""
    arguments = [argument for override in args.overrides for argument in ("--set", override)]
    if args.steps is not None:
        arguments += ["--steps", str(args.steps)]
    if args.tune_budget is not None:
        arguments += ["--tune-budget", f"{args.tune_budget}s"]
    return arguments + (["--traceback"] if args.traceback else [])
