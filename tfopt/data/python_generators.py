"""The random generators Python code run by TensorFlow draws from, put back as they were after tfopt has read.

A pipeline's own Python code (a `tf.numpy_function` augmentation, a `from_generator` generator) draws from
random generators each time tfopt reads it (its first batch, its measurements), and no copy of the pipeline
(`tfopt.data.read_copy`) has generators of its own for them: without putting them back, the user's training
draws what plain Keras' would draw later. keras.io's 3D CT classifier draws from Python's `random`; NumPy
recommends a `default_rng()` of one's own, held in a closure, a module global or an augmentation object.

The generators are found from every Python function TensorFlow holds to call (its registry of
`numpy_function`s, `py_function`s and generators: the pipeline's, and a model's), through their closures,
defaults, the globals they name and the attributes of what they hold, within a few hops: a closure over a model
is not walked whole. Other state the Python code keeps (a counter, a generator's position) moves on as tfopt
reads, and `random.SystemRandom` has no state to put back.
"""

from __future__ import annotations

import contextlib
import logging
import random
import types
from collections.abc import Iterator
from typing import Any

import numpy as np

_log = logging.getLogger("tfopt")

# How many references away from a registered function, and through how many objects, generators are looked for.
_MOST_HOPS, _MOST_OBJECTS = 6, 20_000


@contextlib.contextmanager
def python_generators_kept() -> Iterator[None]:
    """Puts Python's and NumPy's global generators, and those the Python functions TensorFlow calls hold, back as
    they were before the block (an `apply`)."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    states = [(generator, _state(generator)) for generator in _generators_held()]
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        for generator, state in states:
            _put_back(generator, state)


def _generators_held() -> list[Any]:
    """The NumPy and Python random generators reachable from the Python functions TensorFlow holds to call."""
    from tensorflow.python.ops import script_ops

    registry = getattr(script_ops, "_py_funcs", None)
    with getattr(registry, "_lock", contextlib.nullcontext()):
        frontier = list(getattr(registry, "_funcs", {}).values())
    found: list[Any] = []
    seen: set[int] = set()
    for _ in range(_MOST_HOPS):
        following = []
        for obj in frontier:
            if id(obj) in seen:
                continue
            if len(seen) >= _MOST_OBJECTS:
                _log.debug("random generators looked for in %d objects only", _MOST_OBJECTS)
                return found
            seen.add(id(obj))
            if isinstance(obj, random.SystemRandom):
                continue  # the system's entropy: no state
            if isinstance(obj, (np.random.Generator, np.random.RandomState, random.Random)):
                found.append(obj)
                continue
            try:
                following.extend(_parts(obj))
            except Exception:  # noqa: BLE001 - an object of the user's whose attributes cannot be listed
                continue
        frontier = following
    return found


def _parts(obj: Any) -> list[Any]:
    """What a Python object holds that its code may draw from."""
    if isinstance(obj, types.MethodType):
        return [obj.__self__, obj.__func__]
    if isinstance(obj, types.FunctionType):
        cells = []
        for cell in obj.__closure__ or ():
            with contextlib.suppress(ValueError):  # a cell not assigned yet
                cells.append(cell.cell_contents)
        named = [obj.__globals__[name] for name in _names(obj.__code__) if name in obj.__globals__]
        return [*cells, *(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values(), *named]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, dict):
        return list(obj.values())
    if isinstance(obj, (types.ModuleType, type)):
        return []
    attributes = getattr(obj, "__dict__", None)
    return list(attributes.values()) if isinstance(attributes, dict) else []


def _names(code: types.CodeType) -> set[str]:
    """The global names a function's code (and the functions it defines) refers to."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _state(generator: Any) -> Any:
    """A generator's state, as its own API gives it (a copy)."""
    if isinstance(generator, np.random.Generator):
        return generator.bit_generator.state
    if isinstance(generator, random.Random):
        return generator.getstate()
    return generator.get_state()


def _put_back(generator: Any, state: Any) -> None:
    """Sets a generator's state in place: the objects drawing from it hold it, not a name."""
    if isinstance(generator, np.random.Generator):
        generator.bit_generator.state = state
    elif isinstance(generator, random.Random):
        generator.setstate(state)
    else:
        generator.set_state(state)
