"""What `tfopt-recipe` shows while it works: phase lines, log lines and, in a terminal, tqdm's own Keras bars,
on stderr.

Kept apart from the command line's parsing so the library stays quiet (it reports through
`tfopt.run.runner.Progress` and the `tfopt` logger) and the command module stays about arguments and
results. The bars are `tqdm.keras.TqdmCallback`; `tqdm.contrib.logging.logging_redirect_tqdm` writes the
`tfopt` logger's lines above them instead of through them. Outside a terminal (a file, a pipe: a Kubernetes
pod's log, a Slurm job, CI, `nohup`) a bar redraws itself with escape codes line after line, so training
writes what Keras' `fit` writes there: one plain line per epoch (`epoch_lines`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

PROGRAM = "tfopt-recipe"


@contextlib.contextmanager
def terminal_progress(args: argparse.Namespace) -> Iterator[Any]:
    """A `runner.Progress` drawing tqdm bars and log lines on stderr, or showing nothing with --quiet."""
    from tfopt.run import runner

    enabled = not args.quiet

    class TerminalProgress(runner.Progress):
        def phase(self, description: str) -> None:
            if enabled:
                _write(f"{PROGRAM}: {description}")

        def run_directory(self, path: Any) -> None:
            args.run_dir = str(path)  # for the message of an interruption the command cannot wait for

        def training_callbacks(self, *, epochs: int, steps_per_epoch: int | None) -> list[Any]:
            if not enabled:
                return []
            if not sys.stderr.isatty():
                return [epoch_lines(epochs)]
            from tqdm.keras import TqdmCallback

            # verbose=2: one bar per epoch that stays on screen, under a bar of the epochs.
            return [TqdmCallback(epochs=epochs, verbose=2, file=sys.stderr, dynamic_ncols=True)]

    from tqdm.contrib.logging import logging_redirect_tqdm

    logger = logging.getLogger("tfopt")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s"))  # logging_redirect_tqdm keeps this format
    previous_level, previous_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if enabled else logging.ERROR)  # --quiet: the command's error alone
    # Its lines are said here alone: absl gives the root logger a handler of its own once TensorFlow logs
    # through it (an asynchronous checkpoint's first write does), which would say each line again.
    logger.propagate = False
    try:
        with logging_redirect_tqdm(loggers=[logger]) if enabled else contextlib.nullcontext():
            yield TerminalProgress()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        logger.propagate = previous_propagate


def epoch_lines(epochs: int) -> Any:
    """A Keras callback writing one plain line per epoch to stderr, as `fit(verbose=2)` does outside a terminal
    (its class made here, on first use: the command line imports Keras only when it trains):
    `Epoch 2/3: 19 steps, 15.9 s, accuracy: 0.2, loss: 2.99`."""
    import time

    import keras

    class _EpochLines(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            self._started, self._steps = time.perf_counter(), 0

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            self._steps = batch + 1

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            seconds = time.perf_counter() - self._started
            values = "".join(f", {name}: {_number(value)}" for name, value in (logs or {}).items())
            _write(f"Epoch {epoch + 1}/{epochs}: {self._steps} steps, {seconds:.1f} s{values}")

    return _EpochLines()


def _number(value: Any) -> str:
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return str(value)


def _write(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
