"""The errors tfopt raises on purpose.

Every error tfopt raises about the user's input is a `TfoptError`, so the CLI can print its message as
one paragraph (no traceback) and notebooks can catch one class. Each message says what was received,
what was expected and how to fix it. The subclasses that stand for a bad value also derive from
`ValueError`/`TypeError` so plain Python code catching those keeps working.
"""

from __future__ import annotations

import errno
import gc
import os
import re
import shutil


class TfoptError(Exception):
    """Base class of every error tfopt raises about its input or environment.

    Attributes:
        setting: The constructor argument (the YAML key) the error is about, e.g. "policy" for
            `MixedPrecision(policy="fp16")`, or None where it is about no single one. A recipe file
            points its error at that key's line from this attribute, never by reading the message.

    Example:
        >>> error = RecipeConfigError("xla: jit_compile='yes' is not valid.", setting="jit_compile")
        >>> error.setting, str(error)
        ('jit_compile', "xla: jit_compile='yes' is not valid.")
    """

    def __init__(self, *args: object, setting: str | None = None):
        super().__init__(*args)
        self.setting = setting

    def __reduce__(self) -> tuple:
        # Exception pickles as `cls(*args)` and then sets `__dict__`, which fails for subclasses whose
        # constructor takes required keywords (RecipeClashError's recipes, NonFiniteLossError's step).
        return _unpickle, (type(self), self.args, self.__dict__)


def _unpickle(cls: type[TfoptError], args: tuple, state: dict) -> TfoptError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class RecipeConfigError(TfoptError, ValueError):
    """A recipe or process setting was given a value it cannot take, or an unknown recipe name was used."""


class RecipeClashError(TfoptError, ValueError):
    """Two recipes in one chain contradict each other (two strategies, fp16 and bf16, a duplicate).

    Attributes:
        recipes: The names of the two recipes that clash, in the order the chain was given them (the
            same name twice for a duplicate).
    """

    def __init__(self, message: str, *, recipes: tuple[str, ...]):
        super().__init__(message)
        self.recipes = tuple(recipes)


class IncompatibleModelError(TfoptError, TypeError):
    """The model cannot be rebuilt by tfopt as given (not a Keras model, subclassed without model_fn)."""


class DataError(TfoptError, ValueError):
    """The dataset is missing, empty, malformed or not a tf.data.Dataset, or a data source got a bad value."""


class RecipeFileError(TfoptError, ValueError):
    """A YAML recipe file is malformed; the message names the file, the line and the key path."""


class MeasurementError(TfoptError, RuntimeError):
    """A timing or profiling run could not produce a measurement (it failed, or there was nothing to time)."""


class EnvironmentVariableError(TfoptError, ValueError):
    """An environment variable tfopt reads holds a value it cannot use (`tfopt.environment_variables`).

    Attributes:
        variable: The variable's name, e.g. "TFOPT_DATA_DIR".
    """

    def __init__(self, *args: object, variable: str):
        super().__init__(*args)
        self.variable = variable


class CheckpointWriteError(TfoptError, RuntimeError):
    """A checkpoint could not be written (a full disk, a quota); the newest complete one is kept."""


class StorageError(TfoptError, OSError):
    """A file could not be written: the disk is full or over its quota, read-only, forbidden, or the file would
    exceed the size limit. The message names the file and what was kept."""


# The machine's refusals to store a file, in words: not a fault of tfopt's nor of the user's model.
STORAGE_ERRNOS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EFBIG: "the file size limit (ulimit -f) is exceeded",
    errno.EACCES: "permission denied",
}


def storage_error(error: BaseException, path: str | os.PathLike | None, kept: str) -> StorageError | None:
    """`error` said as a `StorageError` where it is the storage refusing a write (None where it is not): what
    refused, the file being written and its directory's free space, then `kept` (what stays usable and how
    to go on). TensorFlow's file systems lose the errno and say "<file>; <strerror>": that reads the same,
    the file taken from the text where `path` is None.

    Example:
        >>> full = OSError(errno.ENOSPC, "No space left on device")
        >>> print(storage_error(full, "/nonexistent/report.json", "The earlier one is kept."))  # doctest: +ELLIPSIS
        the disk is full writing /nonexistent/report.json (in /nonexistent; ... MiB free there): No space left ...
    """
    if isinstance(error, OSError):
        number, strerror = error.errno, error.strerror
    else:
        context, _, strerror = str(getattr(error, "message", error)).rpartition("; ")
        number = _STORAGE_STRERRORS.get(strerror.strip())
        path = path if path is not None else context.strip() or None
    if number not in STORAGE_ERRNOS:
        return None
    where = ""
    if path is not None:
        directory = os.path.dirname(os.path.abspath(os.fsdecode(path)))
        existing = directory
        while not os.path.exists(existing) and existing != os.path.dirname(existing):  # a directory taken back
            existing = os.path.dirname(existing)
        try:
            free = f"; {shutil.disk_usage(existing).free / 2**20:.1f} MiB free there"
        except OSError:
            free = ""
        where = f" writing {os.fsdecode(path)} (in {directory}{free})"
    return StorageError(f"{STORAGE_ERRNOS[number]}{where}: {strerror.strip()}. {kept}")


_STORAGE_STRERRORS = {os.strerror(number): number for number in STORAGE_ERRNOS}


class OutOfMemoryError(TfoptError, MemoryError):
    """A batch does not fit the device, and training it in micro-batches cannot give the same learning."""


class DistributionError(TfoptError, RuntimeError):
    """A distributed run could not start or lost a worker."""


class NonFiniteLossError(TfoptError, FloatingPointError):
    """Training produced a NaN or Inf loss (or weights), so it was stopped.

    Attributes:
        step: The global step (1-based) whose loss was not finite.
        last_good_checkpoint: The newest checkpoint written from finite weights, or None.
    """

    def __init__(self, message: str, *, step: int, last_good_checkpoint: str | None = None):
        super().__init__(message)
        self.step = step
        self.last_good_checkpoint = last_good_checkpoint

    def with_checkpoint(self, path: str | None) -> NonFiniteLossError:
        """The same error with the last good checkpoint named in the message."""
        where = (
            f" The last good checkpoint is {path}; it was written before the loss went bad, and "
            "train() resumes from it when started again with the same checkpoint_dir."
            if path
            else " No checkpoint had been written yet."
        )
        return NonFiniteLossError(f"{self}{where}", step=self.step, last_good_checkpoint=path)


class RunInterrupted(KeyboardInterrupt):
    """A run was stopped by a signal: Ctrl-C's SIGINT, or the SIGTERM or SIGHUP that `kill`, a closed
    terminal or a scheduler sends. A `KeyboardInterrupt`, so code that cleans up after Ctrl-C does so for
    all three.

    Attributes:
        signal_name: The signal, e.g. "SIGTERM".
        run_dir: The directory of the run that was stopped (continued with `--resume`), or None.
    """

    def __init__(self, signal_name: str = "SIGINT", run_dir: str | None = None):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.run_dir = run_dir


def describe_error(error: BaseException) -> str:
    """An error's type and its own words in one line: without terminal escape codes, Keras' "Exception
    encountered when calling ..." frame, or TensorFlow's '{{function_node ...}}' prefix, '[Op:...]' suffix and
    "Graph execution error" preamble. An exception the user's own Python code raised inside TensorFlow (a
    `from_generator` generator, a `py_function`) is said as that exception, with where in their code it was
    raised, for TensorFlow passes it on as text with its whole traceback through its own frames.

    Example:
        >>> describe_error(ValueError("{{function_node __wrapped__X}} Bad input [Op:X] name: "))
        'ValueError: Bad input'
        >>> keras_error = "Exception encountered when calling Sampling.call().\\n\\n\\x1b[1mBad dtype\\x1b[0m"
        >>> describe_error(TypeError(keras_error))
        'TypeError: Bad dtype'
        >>> traced = 'in user code:\\n\\n  File "m.py", line 3\\n        x * y\\n\\n    TypeError: Bad mul\\n'
        >>> describe_error(TypeError(traced))
        'TypeError: Bad mul'
    """
    message = re.sub(r"\x1b\[[0-9;]*m", "", getattr(error, "message", None) or str(error))
    users = _users_exception(message)
    if users:
        return users
    if message.lstrip().startswith("in user code:"):  # a tf.function's trace: its frames, then the error itself
        message = re.split(r"\n\s*\w+(?:Error|Exception): ", message)[-1]
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    own = [line for line in lines if not line.startswith(_NOT_THE_ERROR) and not _FRAME.match(line)]
    text = re.sub(r"^\{\{[^}]*\}\}\s*|\s*\[Op:.*$", "", (own or lines or [""])[0])
    text = re.sub(r"^Error in user-defined function passed to .*? transformation with iterator: \S+: ", "", text)
    return f"{type(error).__name__}: {text[:300] or 'no message'}"


# Lines of Keras' and TensorFlow's messages that frame the error rather than say it.
_NOT_THE_ERROR = (
    "Exception encountered",
    "Arguments received",
    "\u2022",
    "Graph execution error",
    "Detected at node",
    "<stack traces unavailable>",
)
_FRAME = re.compile(r'File "[^"]+", line \d+')
_TRACEBACK = "Traceback (most recent call last):"
_LIBRARIES = ("tensorflow", "keras", "tf_keras", "tensorflow_datasets", "absl")


def _users_exception(message: str) -> str | None:
    """The Python exception a TensorFlow error carries as text (a py_function's or a generator's), with the
    innermost frame of the user's code, or None where the message carries none."""
    if _TRACEBACK not in message:
        return None
    block = message.rsplit(_TRACEBACK, 1)[1].split("\t [[", 1)[0]
    lines = block.splitlines()
    raised = next((line.strip() for line in reversed(lines) if line.strip() and not line[0].isspace()), None)
    if raised is None:
        return None
    frames = [
        (match.group(1), match.group(2), match.group(3), lines[index + 1].strip() if index + 1 < len(lines) else "")
        for index, line in enumerate(lines)
        if (match := re.match(r'\s*File "([^"]+)", line (\d+), in (.+)', line))
    ]
    users = [frame for frame in frames if not _library_file(frame[0])]
    if not users:
        return raised[:300]
    path, line, function, code = users[-1]
    return f"{raised[:300]} (raised by your code in {function}, {path}, line {line}: {code[:120]})"


def _library_file(path: str) -> bool:
    """Whether a traceback's file is TensorFlow's, Keras' or tfopt's own rather than the user's."""
    parts = re.split(r"[\\/]", path)
    installed = any(
        parts[index - 1] in ("site-packages", "dist-packages")
        for index, part in enumerate(parts)
        if index and part in _LIBRARIES
    )
    return installed or path.startswith(os.path.dirname(os.path.abspath(__file__)) + os.sep)


def released(error: BaseException) -> BaseException:
    """`error`, to raise a tfopt error from, once what its failed work held is let go.

    A failed `fit` leaves its tf.data iterator in the local variables of its frames, and in a reference cycle
    of Keras' (its epoch iterator and that iterator's suspended generator). A tfopt error raised from it would
    keep them until some garbage collection, and the iterator's threads go on running the pipeline meanwhile:
    where that runs the user's Python code (a `py_function`, a generator) and the collection comes during
    interpreter shutdown, the process never exits. So the finished frames are cleared of their local
    variables (those of the traceback and the callers above them: Keras filters its own frames out of the
    traceback), and the cycles collected now, on this failure path only; the traceback still says where the
    error came from.
    """
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        entry = cause.__traceback__
        while entry is not None:
            frame = entry.tb_frame
            while frame is not None:
                try:
                    frame.clear()
                except RuntimeError:  # still running: it and its callers are the code handling the error
                    break
                frame = frame.f_back
            entry = entry.tb_next
        cause = cause.__cause__ or cause.__context__
    gc.collect()
    return error


def chained_messages(error: BaseException | None) -> list[str]:
    """The messages of an error and of the errors it was raised from or while handling, outermost first
    (a tfopt error that wraps TensorFlow's keeps it as its cause).

    Example:
        >>> try:
        ...     try:
        ...         raise OSError("disk")
        ...     except OSError as cause:
        ...         raise TfoptError("Training failed") from cause
        ... except TfoptError as error:
        ...     chained_messages(error)
        ['Training failed', 'disk']
    """
    found: list[str] = []
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found.append(str(error))
        error = error.__cause__ or error.__context__
    return found
