"""The closest known name to a mistyped one, for error messages ("Did you mean 'xla'?").

One place for the rule, so every error that lists valid names suggests the same way: difflib's ratio
with its usual cutoff, a case-insensitive second try (`resnet50` finds `ResNet50`), and abbreviations of
three letters or more (`jit` finds `jit_compile`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The known name closest to `word`, or None where nothing is close.

    Example:
        >>> closest("mixed_precison", ["mixed_precision", "xla"])
        'mixed_precision'
        >>> closest("resnet50", ["ResNet50", "MobileNet"])
        'ResNet50'
        >>> closest("jit", ["jit_compile", "fallback"])
        'jit_compile'
    """
    choices = list(choices)
    match = difflib.get_close_matches(word, choices, n=1, cutoff=cutoff)
    if match:
        return match[0]
    lowered = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=cutoff)
    if match:
        return lowered[match[0]]
    return next(
        (choice for choice in choices if len(word) >= 3 and (choice.startswith(word) or word.startswith(choice))), None
    )


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str:
    """ " Did you mean 'name'?" for the closest known name, or "" (to append to a message).

    Example:
        >>> did_you_mean("xal", ["xla", "batch_size"])
        " Did you mean 'xla'?"
    """
    match = closest(word, choices, cutoff=cutoff)
    return f" Did you mean {match!r}?" if match else ""
