"""Public names that load their module on first use (PEP 562), shared by tfopt's packages.

`import tfopt` (and with it `tfopt-recipe --help`) must not import TensorFlow, so a package lists its
public names with the module each lives in and gets a module `__getattr__` and `__dir__` from here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of a package whose public names load on first use.

    Args:
        package: The package's name, for error messages and `dir()`.
        exports: Public name -> the module that defines it.

    Returns:
        `(__getattr__, __dir__)`, to assign at the package's top level.

    Example:
        >>> getattr_, dir_ = lazy_exports("demo", {"sqrt": "math"})
        >>> getattr_("sqrt")(9.0)
        3.0
        >>> getattr_("cbrt")
        Traceback (most recent call last):
        ...
        AttributeError: module 'demo' has no attribute 'cbrt'; public names are ['sqrt']
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}; public names are {sorted(exports)}")
        return getattr(importlib.import_module(exports[name]), name)

    def __dir__() -> list[str]:
        module = sys.modules.get(package)
        return sorted(set(exports) | set(vars(module) if module else ()))

    return __getattr__, __dir__
