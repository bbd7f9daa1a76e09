"""What `tfopt-recipe` shows while it works: phase lines, log lines and tqdm's own Keras bars, on stderr.

Kept apart from the command line's parsing so the library stays quiet (it reports through
`tfopt.run.runner.Progress` and the `tfopt` logger) and the command module stays about arguments and
results. The bars are `tqdm.keras.TqdmCallback`; `tqdm.contrib.logging.logging_redirect_tqdm` writes the
`tfopt` logger's lines above them instead of through them.
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

        def training_callbacks(self, *, epochs: int, steps_per_epoch: int | None) -> list[Any]:
            if not enabled:
                return []
            from tqdm.keras import TqdmCallback

            # verbose=2: one bar per epoch that stays on screen, under a bar of the epochs.
            return [TqdmCallback(epochs=epochs, verbose=2, file=sys.stderr, dynamic_ncols=True)]

    if not enabled:
        yield TerminalProgress()
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    logger = logging.getLogger("tfopt")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("  %(message)s"))  # logging_redirect_tqdm keeps this format
    previous_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with logging_redirect_tqdm(loggers=[logger]):
            yield TerminalProgress()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)


def _write(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)
