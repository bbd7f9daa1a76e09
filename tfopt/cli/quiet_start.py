"""TensorFlow's start-up lines, kept out of the command line's output.

Loading TensorFlow's libraries and finding its devices writes C++ log lines straight to file descriptor 2
before absl logging is initialised, so `TF_CPP_MIN_LOG_LEVEL` does not reach them: "oneDNN custom
operations are on", "Could not find cuda drivers", and on every machine without a GPU driver an `E` line,
"failed call to cuInit", that reads as an error of the run. A command therefore imports TensorFlow and
lists its devices once with descriptor 2 pointed at a temporary file, and writes back what is not start-up
noise: everything at `E` and `F` level except the two known harmless errors (no driver, so no cuInit; a
GPU library's factory registered twice), and everything that is not one of TensorFlow's log lines.

A user who asks for TensorFlow's logs (`TF_CPP_MIN_LOG_LEVEL=0` or `1`) gets all of them, as TensorFlow
writes them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

# absl's prefix: severity letter, date (0000 before initialisation), time, thread id, file:line]
_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [\w.-]+:\d+\] ")
_BEFORE_ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_DRIVER = "Could not find cuda drivers"
# cuDNN/cuFFT/cuBLAS factories registered by two of TensorFlow's libraries: harmless on every GPU machine.
_REGISTERED_TWICE = "Unable to register cu"
# Python's own lines end a record's continuation: a warning, a traceback.
_PYTHON_LINE = re.compile(r"^(Traceback |Fatal Python error|\S+:\d+: \w+Warning: )")


def wants_tensorflow_logs() -> bool:
    """Whether the user lowered TensorFlow's log level below tfopt's default (2: errors only)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2").strip() in ("0", "1")


def startup_noise(lines: Iterable[str]) -> list[bool]:
    """For each of TensorFlow's start-up output lines, whether it is noise to drop.

    A line that does not begin a log record (the second line of a multi-line message) goes with the
    record before it. A failed cuInit is noise only where TensorFlow also said it found no driver.

    Example:
        >>> startup_noise([
        ...     "I0000 00:00:1795.0  5046 port.cc:153] oneDNN custom operations are on.",
        ...     "To enable the following instructions: AVX2",
        ...     "E0000 00:00:1795.9  5046 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
        ...     "E0000 00:00:1795.9  5046 some_kernel.cc:1] a real error",
        ...     "Traceback (most recent call last):",
        ... ])
        [True, True, False, False, False]
    """
    lines = list(lines)
    no_driver = any(_NO_DRIVER in line for line in lines)
    noise, dropping = [], False
    for line in lines:
        record = _LOG_LINE.match(line)
        if record:
            harmless = _REGISTERED_TWICE in line or (no_driver and "failed call to cuInit" in line)
            dropping = record.group(1) in "IW" or (record.group(1) == "E" and harmless)
        elif line.startswith(_BEFORE_ABSL):
            dropping = True
        elif _PYTHON_LINE.match(line):
            dropping = False
        noise.append(dropping)
    return noise


@contextlib.contextmanager
def tensorflow_started_quietly() -> Iterator[None]:
    """For the block: wherever TensorFlow is first imported, its start-up noise is left out of stderr.

    The import is where the noise starts, and it happens deep in whatever a command calls first (loading a
    recipe imports TensorFlow only once the file is valid, so a bad file still fails at once). So the block
    puts a finder first on `sys.meta_path` that wraps TensorFlow's own loader: the real import runs with
    descriptor 2 captured, lists the devices (where cuInit is called), and writes back what is not noise.
    Nothing happens where TensorFlow is imported already or the user asked for its logs.
    """
    finder = _QuietTensorFlowFinder()
    if "tensorflow" not in sys.modules and not wants_tensorflow_logs():
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)  # once: the real finders find the real spec
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        lines: list[str] = []
        try:
            with _stderr_captured() as captured:
                try:
                    self._loader.exec_module(module)
                    module.config.list_physical_devices()  # loads the GPU platform: where cuInit is called
                finally:
                    captured.seek(0)
                    lines = captured.read().decode(errors="replace").splitlines()
        finally:  # a failed import shows all it said but the noise, after its traceback's cause
            kept = [line for line, drop in zip(lines, startup_noise(lines)) if not drop]
            if kept:
                print("\n".join(kept), file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stderr_captured() -> Iterator[tempfile._TemporaryFileWrapper]:
    """Points descriptor 2 at a temporary file for the block (C++ writes there, past Python's sys.stderr)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
