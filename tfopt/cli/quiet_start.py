"""TensorFlow's start-up lines, kept out of the command line's output.

Loading TensorFlow's libraries and finding its devices writes C++ log lines straight to file descriptor 2
before absl logging is initialised, so `TF_CPP_MIN_LOG_LEVEL` does not reach them: "oneDNN custom
operations are on", "Could not find cuda drivers", and on every machine without a GPU driver an `E` line,
"failed call to cuInit", that reads as an error of the run. So while a command first imports TensorFlow
(and lists its devices, where cuInit is called), descriptor 2 goes through a filter that leaves out what
`TF_CPP_MIN_LOG_LEVEL` would have (tfopt's default 2: INFO and WARNING) and the two known harmless errors
(no driver, so no cuInit; a GPU library's factory registered twice), and passes everything else on as it
comes.

The filter is a small process of its own (this file run as a script), not a thread: when TensorFlow aborts
while it starts (a failed CUDA check), the filter still reads the last lines to the end and shows them.

A user who asks for TensorFlow's logs (`TF_CPP_MIN_LOG_LEVEL=0` or `1`) gets all of them, as TensorFlow
writes them.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

# absl's prefix: severity letter, date (0000 before initialisation), time, thread id, file:line]
_LOG_LINE = re.compile(r"^([IWEF])\d{4} [\d:.]+\s+\d+ [\w.-]+:\d+\] ")
_LEVELS = "IWEF"  # TF_CPP_MIN_LOG_LEVEL 0..3 keeps these from that index on
_BEFORE_ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_NO_DRIVER = "Could not find cuda drivers"
# cuDNN/cuFFT/cuBLAS factories registered by two of TensorFlow's libraries: harmless on every GPU machine.
_REGISTERED_TWICE = "Unable to register cu"
# Lines of Python's own (a traceback, a warning, a logging record) end the continuation of a C++ record.
_PYTHON_LINE = re.compile(r"^(Traceback |Fatal Python error|\S+:\d+: \w+Warning: |[A-Z]+:[\w.]+:)")


@contextlib.contextmanager
def library_records_quieted() -> Iterator[None]:
    """absl's and TensorFlow's Python log records below ERROR kept out, as `TF_CPP_MIN_LOG_LEVEL` keeps
    TensorFlow's C++ ones: TensorFlow Datasets warns through absl ("WARNING:absl:Variant folder
    .../mnist/3.0.1 has no dataset_info.json") about what tfopt's own note says better, and TensorFlow
    through its own logger ("WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly ..." on every
    worker). A user who asks for TensorFlow's logs gets these too."""
    loggers = [logging.getLogger(name) for name in ("absl", "tensorflow")]
    previous = [logger.level for logger in loggers]
    if not wants_tensorflow_logs():
        for logger in loggers:
            logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, previous):
            logger.setLevel(level)


def min_log_level() -> int:
    """TensorFlow's log level as the user set it (`TF_CPP_MIN_LOG_LEVEL`), else tfopt's default, 2."""
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2").strip()
    return int(value) if value in ("0", "1", "2", "3") else 2


def wants_tensorflow_logs() -> bool:
    """Whether the user lowered TensorFlow's log level below tfopt's default (2: errors only)."""
    return min_log_level() < 2


class StartupNoise:
    """Tells TensorFlow's start-up noise line by line, as the lines come (a record's later lines go with it).

    A failed cuInit is noise only where TensorFlow said before that it found no driver.
    """

    def __init__(self, min_level: int = 2):
        self.min_level = min_level
        self.no_driver = False
        self._dropping = False

    def is_noise(self, line: str) -> bool:
        record = _LOG_LINE.match(line)
        if record:
            self.no_driver = self.no_driver or _NO_DRIVER in line
            harmless = _REGISTERED_TWICE in line or (self.no_driver and "failed call to cuInit" in line)
            level = record.group(1)
            self._dropping = _LEVELS.index(level) < self.min_level or (level == "E" and harmless)
        elif line.startswith(_BEFORE_ABSL):
            self._dropping = True
        elif _PYTHON_LINE.match(line):
            self._dropping = False
        return self._dropping


def startup_noise(lines: Iterable[str], min_level: int = 2) -> list[bool]:
    """For each of TensorFlow's start-up output lines, whether it is noise to drop.

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
    noise = StartupNoise(min_level)
    return [noise.is_noise(line) for line in lines]


def forward_without_noise(source: IO[str], sink: IO[str], min_level: int) -> None:
    """Copies `source` to `sink` line by line as the lines come, leaving out the start-up noise."""
    noise = StartupNoise(min_level)
    for line in source:
        if not noise.is_noise(line):
            sink.write(line)
            sink.flush()


@contextlib.contextmanager
def tensorflow_started_quietly(module: str = "tensorflow") -> Iterator[None]:
    """For the block: wherever TensorFlow is first imported, its start-up noise is left out of stderr.

    The import is where the noise starts, and it happens deep in whatever a command calls first (loading a
    recipe imports TensorFlow only once the file is valid, so a bad file still fails at once). So the block
    puts a finder first on `sys.meta_path` whose loader runs TensorFlow's own with descriptor 2 through the
    filter. Nothing happens where TensorFlow is imported already or the user asked for its logs.
    (`module` names another module for the tests: one that writes like TensorFlow and has its `config`.)
    """
    finder = _QuietTensorFlowFinder(module)
    if module not in sys.modules and not wants_tensorflow_logs():
        sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        finder.remove()


class _QuietTensorFlowFinder(importlib.abc.MetaPathFinder):
    def __init__(self, module: str) -> None:
        self.module = module

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader, self)
        return spec

    def remove(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)


class _QuietLoader(importlib.abc.Loader):
    """TensorFlow's own loader, run with descriptor 2 filtered; it puts itself back out of the module after."""

    def __init__(self, loader: importlib.abc.Loader, finder: _QuietTensorFlowFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._finder.remove()  # once: TensorFlow starts once per process
        try:
            with _stderr_filtered():
                self._loader.exec_module(module)
                # Where cuInit is called. A failure here is the command's to meet, and report, later.
                with contextlib.suppress(Exception):
                    module.config.list_physical_devices()
        finally:  # importlib.resources and friends ask the module's loader for its files
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader


@contextlib.contextmanager
def _stderr_filtered() -> Iterator[None]:
    """Points descriptor 2 at a filter process for the block (C++ writes there, past Python's sys.stderr)."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    try:
        # -I: the filter needs nothing but the standard library, and no user site or PYTHON* setting.
        stripper = subprocess.Popen(
            [sys.executable, "-I", __file__, str(min_log_level())], stdin=read_end, stdout=saved
        )
    except OSError:  # no process to filter with: TensorFlow's lines stay as they are
        for descriptor in (read_end, write_end, saved):
            os.close(descriptor)
        yield
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer is gone: the filter reads to its end and exits
        os.close(saved)
        try:
            stripper.wait(timeout=30)
        except subprocess.TimeoutExpired:  # a process started during the import still holds the pipe
            stripper.kill()
            stripper.wait()


if __name__ == "__main__":  # the filter process: stdin is TensorFlow's stderr, stdout the command's
    import signal

    # Ctrl-C reaches the whole process group: the command says it was interrupted, and this filter ends with the
    # pipe when the command lets go of it (a traceback of its own would be said in the middle).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.stdin.reconfigure(errors="replace")
    forward_without_noise(sys.stdin, sys.stdout, int(sys.argv[1]))
