"""Copies of Keras models made in process: the same classes, the same state, new variables.

Rebuilding a model from its config (`clone_model`, `from_config`) loses what public Keras code keeps
outside the config: custom layers without `get_config` or unregistered, functions in a layer's config
(`TextVectorization(standardize=fn)`), the vocabulary of adapted lookups, and the user's class with its
`train_step`, `test_step`, `compute_loss`, `compile` and `metrics`. And Keras' own `deepcopy` of a layer,
model, metric, loss or optimizer pickles through the `.keras` format: that same round trip. So tfopt
copies the object graph with Python's copy protocol (`copy.deepcopy`, one memo for the whole model), and
steps in only where that protocol would go wrong:

- **Keras objects become shells**: an instance of a class with a Keras class in its ancestry (layers,
  models, metrics, losses, optimizers, learning-rate schedules, seed generators, the functional graph's
  nodes, Keras' tracked containers; user subclasses of any of them) is made as an empty instance of its
  own class and given copies of its attributes. Keras' `Layer.__new__` gives every instance closures
  bound to it (`build`, `quantize`): the shell keeps its own. Keras' tracked lists are filled without
  their tracking hooks, which the copied tracker has already recorded.
- **Variables are new variables** with the same value, created in the current scope (a tf.distribute
  strategy's scope mirrors them); a built optimizer's slot variables follow the model's, re-indexed.
- **TensorFlow objects other than variables are shared**: tensors are immutable, and the tables of adapted
  lookups are not written by training. A `MutableHashTable`, which training may write, is a new table with
  the same contents. A model's own traced functions (`train_function` and friends)
  belong to the model they traced: the copy's are made again on first use.
- **Functions, bound methods and tf.functions from which a copied object can be reached are made again**:
  a method bound to a layer is bound to the layer's copy, a closure that holds a layer (a `Lambda` wrapping
  `lambda x: dense(x)`), or a list of layers, gets cells holding the copies, and a `tf.function` tracing
  such a method wraps the new one with the same settings. Module globals are the module's: a function
  reading a global layer still reads that layer.
- **Everything else follows its own copy protocol**: enums and other atoms stay themselves, classes that
  define `__deepcopy__` or `__reduce_ex__` are honoured (a helper that returns itself from `__deepcopy__`
  stays shared, and what it holds is not copied), `__slots__` are copied. An object the protocol cannot
  copy (a lock, an open file) is an `IncompatibleModelError` naming its attribute path from the model.
- **What Keras keys by identity is keyed by the copies**: a functional model's nodes, the trackers' stored
  ids, a built optimizer's slots.

The copy keeps what `compile()` made (the optimizer or optimizers with their state, loss and metric
objects, the compile config), so a model whose own `compile` takes other arguments (a GAN's
`compile(d_optimizer, g_optimizer, loss_fn)`) is never compiled again by tfopt with arguments it does not
take.
"""

from __future__ import annotations

import collections
import copy
import enum
import types
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tfopt.errors import IncompatibleModelError

if TYPE_CHECKING:
    import keras

# Functions a model compiled with tf.function for itself: traced for the original, made again on first use.
_TRACED_FUNCTIONS = ("train_function", "test_function", "predict_function")
# Objects `copy.deepcopy` returns as they are, and that hold nothing to walk.
_ATOMS = (
    type(None),
    int,
    float,
    complex,
    bool,
    str,
    bytes,
    type,
    range,
    enum.Enum,
    types.BuiltinFunctionType,
    types.CodeType,
    types.GetSetDescriptorType,
    property,
    weakref.ref,
)


def copy_model(model: keras.Model) -> keras.Model:
    """A model of the same class with the same layers, state, compiled objects and weight values.

    Args:
        model: A Keras model, built or not, compiled or not. Never modified.

    Returns:
        The copy; its variables are new (created in the current strategy scope, if any), and its training,
        evaluation and prediction functions are traced again for it on first use.

    Raises:
        IncompatibleModelError: An attribute of the model cannot be copied; the message names its path.

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="adam", loss="mse")
        >>> twin = copy_model(model)
        >>> type(twin) is type(model), twin.layers[0] is model.layers[0], twin.optimizer is model.optimizer
        (True, False, False)
        >>> all(np.array_equal(a, b) for a, b in zip(model.get_weights(), twin.get_weights()))
        True
    """
    return copy_keras_object(model, path=f"model {model.name!r}")


def copy_keras_object(obj: Any, *, path: str | None = None) -> Any:
    """A copy of a Keras object (a layer, model, metric, loss or optimizer) with new variables.

    Args:
        obj: The object to copy. Never modified.
        path: How error messages name `obj` (its attribute paths start there); its class name by default.

    Raises:
        IncompatibleModelError: Something `obj` holds cannot be copied; the message names its attribute path.

    Example:
        >>> import keras
        >>> metric = keras.metrics.Mean()
        >>> metric.update_state([4.0])
        >>> twin = copy_keras_object(metric)
        >>> float(twin.result()), twin.variables[0] is metric.variables[0]
        (4.0, False)
    """
    from keras.src.utils.tracking import Tracker

    walk = _Walk(obj, path or type(obj).__name__)
    # Trackers first: TensorFlow's tracking wrappers (the lists and dicts a layer's attributes are tracked in)
    # copy themselves by tracking each element again, which sets an attribute on the element's shell, which
    # Keras' __setattr__ hands to that shell's tracker. A tracker holds only Keras' containers, filled without
    # hooks, so filling every one first leaves no tracker empty when a wrapper reaches it.
    for original, shell in sorted(walk.shells, key=lambda pair: not isinstance(pair[0], Tracker)):
        _fill(shell, original, walk)
    for original, new in walk.functions:
        for old_cell, new_cell in zip(original.__closure__, new.__closure__):
            try:
                contents = old_cell.cell_contents
            except ValueError:  # a cell not assigned yet (a name the function defines later)
                continue
            new_cell.cell_contents = _copied(contents, walk, f"{walk.paths[id(original)]}.<closure>")
    shells = [shell for _, shell in walk.shells]
    _rekey_by_identity(shells, walk.memo, walk.variables)
    _record_current_strategy(shells)
    return walk.memo[id(obj)]


class _Walk:
    """The object graph under a root, walked the way `copy.deepcopy` would traverse it, breadth first (so each
    object's path from the root is a shortest one). It leaves in `memo` what every object the copy must make
    itself becomes: a shell per Keras object (`shells`, filled later), a new variable per variable, a new
    function per function that reaches a copied object (`functions`, cells filled later), a rebound method,
    and the object itself for what is shared. `copy.deepcopy` then copies the rest around them."""

    def __init__(self, root: Any, name: str):
        self.memo: dict[int, Any] = {}
        self.paths: dict[int, str] = {id(root): name}
        self.shells: list[tuple[Any, Any]] = []
        self.functions: list[tuple[types.FunctionType, types.FunctionType]] = []
        self.variables: list[tuple[Any, Any]] = []  # each Keras variable and its copy
        self._callables: list[Any] = []
        self._made: set[int] = set()  # ids of what the copy makes anew: shells and variables
        self._parents: dict[int, list[int]] = collections.defaultdict(list)
        # Every walked object stays referenced until the copy is done, so no id is reused meanwhile.
        self._walked: list[Any] = []
        queue = collections.deque([root])
        while queue:
            obj = queue.popleft()
            for label, child in self._visit(obj):
                if isinstance(child, _ATOMS):
                    continue
                self._parents[id(child)].append(id(obj))
                if id(child) not in self.paths:
                    self.paths[id(child)] = f"{self.paths[id(obj)]}{label}"
                    queue.append(child)
        self._make_callables_again()

    def _visit(self, obj: Any) -> Iterator[tuple[str, Any]]:
        """Decides what `obj` becomes and yields its children, each with its path from `obj`."""
        import keras
        import tensorflow as tf

        self._walked.append(obj)
        key = id(obj)
        if isinstance(obj, types.ModuleType):
            self.memo[key] = obj  # a module a layer keeps at hand (Keras' backend): the one module
        elif isinstance(obj, keras.Variable):
            twin = _copy_variable(obj)
            self.memo[key], self.memo[id(obj._value)] = twin, twin._value  # the TF variable behind it too
            self._made.add(key)
            self.variables.append((obj, twin))
        elif isinstance(obj, tf.Variable):
            self.memo[key] = tf.Variable(
                obj.read_value(),
                trainable=obj.trainable,
                name=obj.name.split(":")[0],
                aggregation=obj.aggregation,
                synchronization=obj.synchronization,
                shape=obj.shape,
            )
            self._made.add(key)
        elif isinstance(obj, (types.FunctionType, types.MethodType, tf.types.experimental.PolymorphicFunction)):
            self._callables.append(obj)
            if isinstance(obj, types.MethodType):
                yield ".__self__", obj.__self__
                yield ".__func__", obj.__func__
            elif isinstance(obj, types.FunctionType):
                for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
                    try:
                        yield f".<closure {name}>", cell.cell_contents
                    except ValueError:
                        continue
            else:  # a tf.function: what it traces
                yield ".python_function", obj.python_function
        elif _is_keras_object(obj):
            shell = type(obj).__new__(type(obj))
            self.memo[key] = shell
            self._made.add(key)
            self.shells.append((obj, shell))
            yield from _contents(obj)
            yield from ((f".{name}", value) for name, value in vars(obj).items())
        elif isinstance(obj, (list, tuple, dict, set, frozenset)):
            # Plain containers, named tuples and TensorFlow's tracking wrappers copy themselves; what they hold
            # is walked. (Before the TensorFlow test below: tracking wrappers live in tensorflow's modules.)
            yield from _contents(obj)
            yield from ((f".{name}", value) for name, value in getattr(obj, "__dict__", {}).items())
        elif isinstance(obj, tf.lookup.experimental.MutableHashTable):
            self.memo[key] = _copy_table(obj)  # written by training (a count of the ids seen): the copy's own
            self._made.add(key)
        elif (type(obj).__module__ or "").startswith(("tensorflow", "numpy")):
            if not type(obj).__module__.startswith("numpy"):
                self.memo[key] = obj  # tensors, static lookup tables: shared
        else:
            yield from _protocol_parts(obj)

    def _make_callables_again(self) -> None:
        """Every function and tf.function from which a copied object can be reached (a closure over a layer, or
        over a list of layers; a tf.function tracing a method of a layer) made again for the copy; the others
        are shared."""
        import tensorflow as tf

        reaching, stack = set(), list(self._made)
        while stack:
            for parent in self._parents.get(stack.pop(), ()):
                if parent not in reaching:
                    reaching.add(parent)
                    stack.append(parent)
        # Functions first: a tf.function may be made of one. A bound method needs nothing here: deepcopy binds
        # its function to the copy of its object (the shell, for a Keras object).
        for original in self._callables:
            if isinstance(original, types.FunctionType) and id(original) in reaching:
                self.memo[id(original)] = self._function_again(original)
        for original in self._callables:
            if isinstance(original, tf.types.experimental.PolymorphicFunction):
                traced = self.memo.get(id(original.python_function))
                if isinstance(original.python_function, types.MethodType):  # tf.function(self.step): the copy's
                    method = original.python_function
                    owner = self.memo.get(id(method.__self__))
                    traced = types.MethodType(method.__func__, owner) if owner is not None else None
                self.memo[id(original)] = (
                    original
                    if traced is None
                    else tf.function(
                        traced,
                        input_signature=original.input_signature,
                        jit_compile=getattr(original, "_jit_compile", None),
                        reduce_retracing=getattr(original, "_reduce_retracing", False),
                    )
                )

    def _function_again(self, original: types.FunctionType) -> types.FunctionType:
        """A function like `original` with empty cells of its own, filled once the objects they hold are copied."""
        new = types.FunctionType(
            original.__code__,
            original.__globals__,
            original.__name__,
            original.__defaults__,
            tuple(types.CellType() for _ in original.__closure__),
        )
        new.__kwdefaults__ = original.__kwdefaults__
        new.__qualname__ = original.__qualname__
        new.__doc__ = original.__doc__
        new.__module__ = original.__module__
        new.__dict__.update(original.__dict__)
        self.functions.append((original, new))
        return new


def _is_keras_object(obj: Any) -> bool:
    """Whether `obj` must be copied as a shell: its class descends from a Keras class, it has attributes to
    copy, and it does not copy itself (an enum, a named tuple, a class of the user's with `__deepcopy__`)."""
    kind = type(obj)
    if isinstance(obj, (enum.Enum, tuple)) or not hasattr(obj, "__dict__") or hasattr(kind, "__deepcopy__"):
        return False
    return any((base.__module__ or "").startswith("keras") for base in kind.__mro__[:-1])


def _contents(obj: Any) -> Iterator[tuple[str, Any]]:
    """What a container holds (keys too), with its place in it."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
            yield f".<key {key!r}>", key
    elif isinstance(obj, (list, tuple)):
        yield from ((f"[{index}]", value) for index, value in enumerate(obj))
    elif isinstance(obj, (set, frozenset)):
        yield from (("<item>", value) for value in obj)


def _protocol_parts(obj: Any) -> Iterator[tuple[str, Any]]:
    """What `copy.deepcopy` copies of an object that is not Keras', TensorFlow's or a container: the
    arguments and state of its `__reduce_ex__`; nothing of one with its own `__deepcopy__`."""
    if hasattr(type(obj), "__deepcopy__"):  # it copies itself (a helper returning itself stays shared)
        return
    try:
        reduced = obj.__reduce_ex__(4)
    except Exception:  # noqa: BLE001 - what cannot be reduced cannot be copied either: the copy names it
        return
    if isinstance(reduced, str):  # a global, copied as itself
        return
    args, state, items, pairs = (list(reduced) + [None] * 5)[1:5]
    yield from ((".<argument>", value) for value in args or ())
    if isinstance(state, tuple) and len(state) == 2:  # (__dict__, slots)
        state = {**(state[0] or {}), **(state[1] or {})}
    if isinstance(state, dict):
        yield from ((f".{name}", value) for name, value in state.items())
    elif state is not None:
        yield ".<state>", state
    yield from (("[]", value) for value in items or ())
    for key, value in pairs or ():
        yield f"[{key!r}]", value


def _fill(shell: Any, original: Any, walk: _Walk) -> None:
    """Gives a shell copies of its original's attributes (and contents, for Keras' tracked containers)."""
    # Keras' Layer.__new__ puts closures on the instance (`build` wrapped to name-scope and lock it) that
    # refer to the instance they were made for: the shell keeps its own. Keras objects override __setattr__
    # to track attributes, so the rest goes in as it was, untracked again.
    own = {name for name, value in shell.__dict__.items() if isinstance(value, types.FunctionType)}
    where = walk.paths[id(original)]
    shell.__dict__.update(
        {name: _copied(value, walk, f"{where}.{name}") for name, value in original.__dict__.items() if name not in own}
    )
    if isinstance(original, list):
        list.extend(shell, _copied(list(original), walk, where))
    elif isinstance(original, dict):
        dict.update(shell, _copied(dict(original), walk, where))
    elif isinstance(original, set):
        set.update(shell, _copied(set(original), walk, where))


def _copied(value: Any, walk: _Walk, path: str) -> Any:
    """`value` deep-copied around what the walk made, or an error naming the path of what cannot be copied."""
    try:
        return copy.deepcopy(value, walk.memo)
    except IncompatibleModelError:
        raise
    except Exception as error:
        culprit, reason, part = _culprit(value, path, walk.memo, error)
        what = f"{culprit} ({type(value).__name__ if culprit == path else 'in it'}) cannot be copied ({reason})"
        if (type(part).__module__ or "").startswith(("keras", "tensorflow.python.trackable")):  # Keras' own
            raise IncompatibleModelError(
                f"tfopt could not copy your model: {what}. That is Keras' or TensorFlow's own "
                f"{type(part).__name__}, which tfopt should copy: a bug in tfopt (please report it with this "
                "message). Meanwhile pass model_fn=a function that creates the model."
            ) from error
        raise IncompatibleModelError(
            f"tfopt could not copy your model: {what}. tfopt copies a model in process with Python's copy "
            "protocol: give that object's class a __deepcopy__ (one that returns self shares it between your model "
            "and tfopt's copy), keep it off the model, or pass model_fn=a function that creates the model."
        ) from error


def _culprit(value: Any, path: str, memo: dict[int, Any], error: Exception) -> tuple[str, str, Any]:
    """The innermost part of `value` that cannot be copied: its attribute path, why, and the part itself. Each
    probe copies into a throwaway memo, so nothing of the real copy is made twice."""
    for label, child in (*_contents(value), *((f".{n}", v) for n, v in getattr(value, "__dict__", {}).items())):
        if isinstance(child, _ATOMS):
            continue
        try:
            copy.deepcopy(child, dict(memo))
        except Exception as inner:  # noqa: BLE001 - any failure there is the one to name
            return _culprit(child, f"{path}{label}", memo, inner)
    return path, f"{type(error).__name__}: {error}", value


def _rekey_by_identity(copies: list[Any], memo: dict[int, Any], variables: list[tuple[Any, Any]]) -> None:
    """What Keras keys by object identity, keyed by the copies: a functional model's nodes (`make_node_key`,
    read when it is saved), a tracker's stored ids (read when an attribute is assigned or deleted), a built
    optimizer's slots (found by the identity of their variable), the variables an optimizer excludes from
    weight decay (`exclude_from_weight_decay(var_list=...)`, kept as their keys: the originals' would leave the
    copy's decaying). The traced functions of a model belong to the original: made again on first use."""
    import keras
    from keras.src.ops.function import Function, make_node_key
    from keras.src.utils.tracking import Tracker

    for new in copies:
        if isinstance(new, Function) and isinstance(new.__dict__.get("_nodes"), set):
            keys = set()
            for key in new.__dict__["_nodes"]:
                operation, _, index = key.partition("_ib-")
                copied = memo.get(int(operation))
                keys.add(make_node_key(copied, int(index)) if copied is not None else key)
            new.__dict__["_nodes"] = keys
        if isinstance(new, Tracker):
            new.__dict__["stored_ids"] = {
                name: {id(value) for value in store} for name, (_, store) in new.config.items()
            }
        if isinstance(new, keras.optimizers.Optimizer) and new.built:
            indices = {new._var_key(variable): index for index, variable in enumerate(new._trainable_variables)}
            new.__dict__["_trainable_variables_indices"] = indices
        if isinstance(new, keras.optimizers.Optimizer) and new.__dict__.get("_exclude_from_weight_decay"):
            keys = {new._var_key(original): new._var_key(twin) for original, twin in variables}
            new.__dict__["_exclude_from_weight_decay"] = {keys.get(key, key) for key in new._exclude_from_weight_decay}
            new.__dict__["_exclude_from_weight_decay_cache"] = {}
        if isinstance(new, keras.Model):
            for name in _TRACED_FUNCTIONS:
                if name in new.__dict__:
                    new.__dict__[name] = None


def _record_current_strategy(copies: list[Any]) -> None:
    """Keras' models and optimizers record the strategy they were made under and use it later (to colocate
    slot variables, to distribute data): a copy records the scope it is made in, as a new object would."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    for new in copies:
        if "_distribution_strategy" in new.__dict__:  # optimizers
            new.__dict__["_distribution_strategy"] = strategy
        if "_distribute_strategy" in new.__dict__:  # models: None outside any strategy's scope
            new.__dict__["_distribute_strategy"] = strategy if tf.distribute.has_strategy() else None


def _copy_table(table: Any) -> Any:
    """A new `MutableHashTable` of the same types, default and contents."""
    import tensorflow as tf

    twin = tf.lookup.experimental.MutableHashTable(table.key_dtype, table.value_dtype, table._default_value)
    twin.insert(*table.export())
    return twin


def _copy_variable(variable: Any) -> Any:
    """A Keras variable with the same attributes and value, backed by a variable made in the current scope.

    The backing `tf.Variable` is made as trainable as the original's, not as the Keras flag now says: freezing a
    layer (`base.trainable = False`) flips the flag only, and a gradient tape never watches a `tf.Variable` made
    untrainable, so a copy of a frozen base would learn nothing once the user unfreezes it to fine-tune."""
    twin = object.__new__(type(variable))
    twin.__dict__.update(variable.__dict__)
    twin._value = None
    twin._trainable = variable._value.trainable
    try:
        twin._initialize(variable._value.read_value())
    finally:
        twin._trainable = variable._trainable
    return twin
