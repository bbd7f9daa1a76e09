"""What `tfopt-recipe` shows while it works: phase lines, log lines and one tqdm bar per epoch, on stderr.

Kept apart from the command line's parsing so the library stays quiet (it reports through
`tfopt.run.runner.Progress` and the `tfopt` logger) and the CLI module stays about arguments and results.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

PROGRAM = "tfopt-recipe"


class terminal_progress:  # noqa: N801 - used like a function in `with`
    """tqdm bars and log lines on stderr, or nothing with --quiet."""

    def __init__(self, args: argparse.Namespace):
        self.enabled = not args.quiet
        self._handler: logging.Handler | None = None

    def __enter__(self) -> Any:
        from tfopt.run import runner

        enabled = self.enabled

        class TerminalProgress(runner.Progress):
            def phase(self, description: str) -> None:
                if enabled:
                    _write(f"{PROGRAM}: {description}")

            def training_callbacks(self, *, epochs: int, steps_per_epoch: int | None) -> list[Any]:
                return [_tqdm_callback(epochs)] if enabled else []

        if enabled:
            self._handler = _TqdmLogHandler()
            logging.getLogger("tfopt").addHandler(self._handler)
            logging.getLogger("tfopt").setLevel(logging.INFO)
        return TerminalProgress()

    def __exit__(self, *exc_info: Any) -> None:
        if self._handler is not None:
            logging.getLogger("tfopt").removeHandler(self._handler)


class _TqdmLogHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        _write(f"  {self.format(record)}")


def _write(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line, file=sys.stderr)


def _tqdm_callback(epochs: int) -> Any:
    import keras
    from tqdm import tqdm

    class TqdmCallback(keras.callbacks.Callback):
        """One tqdm bar per epoch, with the loss as it goes."""

        def __init__(self) -> None:
            super().__init__()
            self.bar: Any = None

        def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
            self.bar = tqdm(total=self.params.get("steps"), desc=f"epoch {epoch + 1}/{epochs}", unit="step",
                            file=sys.stderr, leave=True, dynamic_ncols=True)

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self.bar.update(1)
            if logs and "loss" in logs:
                self.bar.set_postfix(loss=f"{float(logs['loss']):.4f}", refresh=False)

        def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
            self.bar.close()

        def on_train_end(self, logs: dict | None = None) -> None:
            if self.bar is not None:
                self.bar.close()

    return TqdmCallback()
