"""Copies of Keras models and compile objects made in process: the same classes, the same state, new variables.

Rebuilding a model from its config (`clone_model`, `from_config`) loses what public Keras code keeps
outside the config: custom layers without `get_config` or unregistered, functions in a layer's config,
the vocabulary of adapted lookups, and the user's class with its `train_step`, `test_step`,
`compute_loss` and `metrics`. So tfopt copies the object graph itself: every Keras object (layers, the
model, metrics, seed generators, the functional graph's nodes) becomes a new instance of its own class
with its attributes copied, and every variable a new variable with the same value, created in the
current scope (a tf.distribute strategy's scope mirrors it). TensorFlow objects other than variables
(tensors, lookup-table resources, functions) are shared: tensors are immutable, and the tables of
adapted lookups are not written by training. Keras' own `deepcopy` would pickle through the `.keras`
format, which is exactly the round trip that fails.
"""

from __future__ import annotations

import copy
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras

# What `compile()` creates on a model: dropped from a copy, which is compiled afresh.
_TRAINER_STATE = (
    "optimizer",
    "train_function",
    "test_function",
    "predict_function",
    "_compile_loss",
    "_compile_metrics",
    "_loss_tracker",
    "_compile_config",
    "_compiled_trainable_state",
)
_ATOMIC = (types.FunctionType, types.MethodType, types.ModuleType, types.BuiltinFunctionType, type)


def copy_model(model: keras.Model) -> keras.Model:
    """A model of the same class with the same layers, state and weight values, not compiled.

    Args:
        model: A Keras model, built or not, compiled or not. Never modified.

    Returns:
        The copy, uncompiled; its variables are new (created in the current strategy scope, if any).

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> twin = copy_model(model)
        >>> type(twin) is type(model), twin.layers[0] is model.layers[0]
        (True, False)
        >>> all(np.array_equal(a, b) for a, b in zip(model.get_weights(), twin.get_weights()))
        True
    """
    dropped = {name: model.__dict__[name] for name in _TRAINER_STATE if name in model.__dict__}
    twin = copy_keras_object(model, leave_out=dropped)
    twin.__dict__.update(dict.fromkeys(dropped))
    if "compiled" in model.__dict__:
        twin.__dict__["compiled"] = False
    return twin


def copy_keras_object(obj: Any, *, leave_out: dict[str, Any] | None = None) -> Any:
    """A copy of a Keras object (a layer, model, metric, loss or optimizer) with new variables.

    Args:
        obj: The object to copy. Never modified.
        leave_out: Attributes of `obj` itself not to copy (name -> value); what only they reach is not
            copied either.

    Example:
        >>> import keras
        >>> metric = keras.metrics.Mean()
        >>> metric.update_state([4.0])
        >>> twin = copy_keras_object(metric)
        >>> float(twin.result()), twin.variables[0] is metric.variables[0]
        (4.0, False)
    """
    memo: dict[int, Any] = {}
    leave_out = leave_out or {}
    for value in leave_out.values():
        memo[id(value)] = None
    shells = _shells(obj, memo)
    for original, shell in shells:
        state = original.__dict__
        if original is obj and leave_out:
            state = {name: value for name, value in state.items() if name not in leave_out}
        # Keras' Layer.__new__ puts closures on the instance (`build` wrapped to name-scope and lock it) that
        # refer to the instance they were made for: the shell keeps its own. Keras objects override
        # __setattr__ to track attributes, so the rest goes in as it was, untracked again.
        own = {name for name, value in shell.__dict__.items() if isinstance(value, types.FunctionType)}
        shell.__dict__.update(copy.deepcopy({name: value for name, value in state.items() if name not in own}, memo))
        if isinstance(original, list):
            list.extend(shell, copy.deepcopy(list(original), memo))
        elif isinstance(original, dict):
            dict.update(shell, copy.deepcopy(dict(original), memo))
        elif isinstance(original, set):
            set.update(shell, copy.deepcopy(set(original), memo))
    _record_current_strategy(shell for _, shell in shells)
    return memo[id(obj)]


def _record_current_strategy(copies: Any) -> None:
    """Keras' models and optimizers record the strategy they were made under and use it later (to colocate
    slot variables, to distribute data): a copy records the scope it is made in, as a new object would."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    for new in copies:
        if "_distribution_strategy" in new.__dict__:  # optimizers
            new.__dict__["_distribution_strategy"] = strategy
        if "_distribute_strategy" in new.__dict__:  # models: None outside any strategy's scope
            new.__dict__["_distribute_strategy"] = strategy if tf.distribute.has_strategy() else None


def _shells(root: Any, memo: dict[int, Any]) -> list[tuple[Any, Any]]:
    """Walks the object graph from `root`, putting into `memo` what every object becomes: an empty instance
    of its class for Keras objects (returned with their originals, to be filled), a new variable for each
    variable, and the object itself for what is shared. `copy.deepcopy` then copies the rest around them."""
    import keras
    import tensorflow as tf

    shells = []
    stack = [root]
    while stack:
        obj = stack.pop()
        key = id(obj)
        if key in memo:
            continue
        if isinstance(obj, keras.Variable):
            memo[key] = _copy_variable(obj)
            continue
        if isinstance(obj, tf.Variable):
            memo[key] = tf.Variable(obj.read_value(), trainable=obj.trainable, name=obj.name.split(":")[0])
            continue
        if isinstance(obj, _ATOMIC):
            memo[key] = obj
            continue
        module = type(obj).__module__ or ""
        if isinstance(obj, (list, tuple, dict, set, frozenset)) and not module.startswith("keras"):
            # Plain containers and TensorFlow's tracking wrappers copy themselves; what they hold is walked.
            stack.extend(obj.values() if isinstance(obj, dict) else obj)
            if isinstance(obj, dict):
                stack.extend(obj.keys())
            continue
        if module.startswith("tensorflow"):
            memo[key] = obj  # tensors, lookup-table resources, tf.functions: shared (see the module docstring)
            continue
        if not hasattr(obj, "__dict__") or module.startswith(("numpy", "builtins")):
            continue  # values deepcopy copies by itself
        shell = type(obj).__new__(type(obj))
        memo[key] = shell
        shells.append((obj, shell))
        stack.extend(obj.__dict__.values())
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            stack.extend(obj)
    return shells


def _copy_variable(variable: Any) -> Any:
    """A Keras variable with the same attributes and value, backed by a variable made in the current scope."""
    twin = object.__new__(type(variable))
    twin.__dict__.update(variable.__dict__)
    twin._value = None
    twin._initialize(variable._value.read_value())
    return twin
