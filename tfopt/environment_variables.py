"""The environment variables tfopt reads, each read through here and held to what it must be.

An environment variable is input like a recipe file's key, but set far from where it is used (a shell
profile, a job script, a launcher), so its error must name it: Python's `int("four")` or a `KeyError` deep in
TensorFlow says neither which variable nor what it should hold. Every reader here raises
`EnvironmentVariableError` with the variable, its value (cut short) and what is expected; an empty variable
counts as unset, as shells write `VAR=` to unset one.

Example:
    >>> integer("SLURM_NTASKS", default=1, at_least=1, environ={"SLURM_NTASKS": "4"})
    4
    >>> try:  # doctest: +NORMALIZE_WHITESPACE
    ...     integer("SLURM_NTASKS", default=1, at_least=1, environ={"SLURM_NTASKS": "four"})
    ... except EnvironmentVariableError as error:
    ...     print(error)
    The environment variable SLURM_NTASKS='four' is not an integer: expected an integer >= 1. Set it so, or unset it
    (unset SLURM_NTASKS).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Mapping

from tfopt.errors import EnvironmentVariableError

# More than a path or a cluster description ever needs: a value past this is a mistake, not a setting.
MOST_CHARACTERS = 64 * 1024


def text(name: str, *, environ: Mapping[str, str] | None = None, empty_is_unset: bool = True) -> str | None:
    """The variable's value, or None where it is unset (or empty, unless an empty value means something of
    its own: `CUDA_VISIBLE_DEVICES=` hides every GPU).

    Raises:
        EnvironmentVariableError: It holds more than `MOST_CHARACTERS` characters.
    """
    value = (os.environ if environ is None else environ).get(name)
    if empty_is_unset and not value:
        return None
    if value is not None and len(value) > MOST_CHARACTERS:
        raise EnvironmentVariableError(
            f"The environment variable {name} holds {len(value):,} characters, more than the {MOST_CHARACTERS:,} "
            f"tfopt reads of any variable. Check what sets it (echo ${name} | head -c 200).",
            variable=name,
        )
    return value


def integer(name: str, *, default: int, at_least: int = 0, environ: Mapping[str, str] | None = None) -> int:
    """The variable as an integer >= `at_least`, or `default` where it is unset.

    Raises:
        EnvironmentVariableError: It is not an integer, or it is below `at_least`.
    """
    value = text(name, environ=environ)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise _invalid(name, value, "is not an integer", f"an integer >= {at_least}") from None
    if number < at_least:
        raise _invalid(name, value, f"is below {at_least}", f"an integer >= {at_least}")
    return number


def directory(name: str, *, purpose: str, environ: Mapping[str, str] | None = None) -> pathlib.Path | None:
    """The variable as a directory tfopt may write into (made where it does not exist), or None where unset.

    Args:
        name: The variable.
        purpose: What tfopt keeps there, for the message ("tfopt's generated datasets").
        environ: The environment to read; the process's own when None.

    Raises:
        EnvironmentVariableError: The path is a file, a link to nothing, cannot be encoded for the file
            system, or cannot be made or written to.
    """
    value = text(name, environ=environ)
    if value is None:
        return None
    path = pathlib.Path(value).expanduser()
    expected = f"a directory tfopt can write {purpose} into"
    try:
        os.fsencode(path)
    except UnicodeError:
        raise _invalid(name, value, "cannot be encoded for the file system", expected) from None
    if path.is_symlink() and not path.exists():
        raise _invalid(name, value, f"is a link to {os.readlink(path)!r}, which does not exist", expected)
    if path.exists() and not path.is_dir():
        raise _invalid(name, value, "is a file", expected)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _invalid(name, value, f"cannot be made ({error.strerror})", expected) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise _invalid(name, value, "is not writable by this user", expected)
    return path


def _invalid(name: str, value: str, problem: str, expected: str) -> EnvironmentVariableError:
    shown = value if len(value) <= 200 else f"{value[:200]}..."
    return EnvironmentVariableError(
        f"The environment variable {name}={shown!r} {problem}: expected {expected}. Set it so, or unset it "
        f"(unset {name}).",
        variable=name,
    )
