"""The models a recipe file can name: tfopt's small built-ins, `keras.applications`, or an import path.

The built-ins exist so that a recipe runs end to end offline, in seconds to minutes on a laptop CPU,
and so the tests can train real models. They follow the `keras.applications` argument names
(`input_shape`, `classes`), so a recipe switches between `small_cnn` and `ResNet50` by changing one
line. Every built-in ends in a float32 softmax: under `mixed_float16` a float16 softmax overflows and
the loss turns into NaN.

Example:
    >>> from tfopt.models import resolve_model
    >>> model = resolve_model("small_cnn")(input_shape=(32, 32, 3), classes=5)
    >>> model.output.dtype
    'float32'
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
from keras import layers

from tfopt.suggest import did_you_mean

_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


def small_cnn(
    *,
    input_shape: Sequence[int] = (64, 64, 3),
    classes: int = 5,
    filters: Sequence[int] = (32, 64, 128),
    dropout: float = 0.2,
) -> keras.Model:
    """A small convolutional image classifier that trains in seconds on a CPU.

    Each block is conv-batchnorm-relu-maxpool; batch normalization right after the first convolution
    makes the model indifferent to whether the pipeline yields pixels in [0, 255] or [0, 1].

    Args:
        input_shape: Image height, width and channels.
        classes: Number of classes of the softmax output.
        filters: Filters of each convolution block; one block per entry, each halving the resolution.
        dropout: Dropout rate before the classifier, in [0, 1).

    Returns:
        An uncompiled functional `keras.Model` named "small_cnn".
    """
    check_arguments("small_cnn", input_shape=input_shape, filters=filters, classes=classes, dropout=dropout)
    inputs = keras.Input(tuple(int(size) for size in input_shape), name="image")
    x = inputs
    for index, count in enumerate(filters):
        x = layers.Conv2D(int(count), 3, padding="same", use_bias=False, name=f"conv{index}")(x)
        x = layers.BatchNormalization(name=f"bn{index}")(x)
        x = layers.ReLU(name=f"relu{index}")(x)
        x = layers.MaxPooling2D(name=f"pool{index}")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dropout(dropout, name="dropout")(x)
    return keras.Model(inputs, _softmax_head(x, classes), name="small_cnn")


@keras.saving.register_keras_serializable(package="tfopt")
class TokenAndPositionEmbedding(layers.Layer):
    """Token embedding plus a learned position embedding, the input of a Transformer encoder.

    A layer of its own (with `get_config`) rather than a Lambda, so the model can be saved and loaded by
    Keras.
    """

    def __init__(self, *, vocab_size: int, sequence_length: int, embed_dim: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.sequence_length = sequence_length
        self.embed_dim = embed_dim
        self.tokens = layers.Embedding(vocab_size, embed_dim, name="tokens")
        self.positions = layers.Embedding(sequence_length, embed_dim, name="positions")

    def build(self, input_shape: Any) -> None:
        self.tokens.build(input_shape)
        self.positions.build((self.sequence_length,))
        super().build(input_shape)

    def call(self, token_ids: Any) -> Any:
        length = keras.ops.shape(token_ids)[-1]
        return self.tokens(token_ids) + self.positions(keras.ops.arange(length))

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*input_shape, self.embed_dim)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "sequence_length": self.sequence_length,
            "embed_dim": self.embed_dim,
        }


def text_transformer(
    *,
    sequence_length: int = 64,
    vocab_size: int = 1000,
    classes: int = 2,
    embed_dim: int = 64,
    num_heads: int = 2,
    ff_dim: int = 128,
    num_layers: int = 2,
    dropout: float = 0.1,
) -> keras.Model:
    """A small Transformer encoder that classifies sequences of token ids.

    Args:
        sequence_length: Tokens per example; the position embedding has one row per position.
        vocab_size: Number of distinct token ids (ids must be in [0, vocab_size)).
        classes: Number of classes of the softmax output.
        embed_dim: Width of the embeddings and of every encoder layer; a multiple of `num_heads`.
        num_heads: Attention heads per encoder layer.
        ff_dim: Hidden units of each encoder layer's feed-forward block.
        num_layers: Number of encoder layers.
        dropout: Dropout rate after attention and feed-forward blocks, in [0, 1).

    Returns:
        An uncompiled functional `keras.Model` named "text_transformer".
    """
    check_arguments(
        "text_transformer",
        sequence_length=sequence_length,
        vocab_size=vocab_size,
        classes=classes,
        embed_dim=embed_dim,
        num_heads=num_heads,
        ff_dim=ff_dim,
        num_layers=num_layers,
        dropout=dropout,
    )
    if embed_dim % num_heads:
        raise ValueError(
            f"embed_dim={embed_dim} is not a multiple of num_heads={num_heads}: each head "
            f"gets embed_dim / num_heads dimensions. Use e.g. embed_dim={num_heads * 32}."
        )
    inputs = keras.Input((sequence_length,), dtype="int32", name="tokens")
    x = TokenAndPositionEmbedding(
        vocab_size=vocab_size, sequence_length=sequence_length, embed_dim=embed_dim, name="embedding"
    )(inputs)
    for index in range(num_layers):
        attention = layers.MultiHeadAttention(num_heads, embed_dim // num_heads, name=f"attention{index}")(x, x)
        attention = layers.Dropout(dropout, name=f"attention_dropout{index}")(attention)
        x = layers.LayerNormalization(epsilon=1e-6, name=f"attention_norm{index}")(x + attention)
        hidden = layers.Dense(ff_dim, activation="relu", name=f"ff_in{index}")(x)
        hidden = layers.Dense(embed_dim, name=f"ff_out{index}")(hidden)
        hidden = layers.Dropout(dropout, name=f"ff_dropout{index}")(hidden)
        x = layers.LayerNormalization(epsilon=1e-6, name=f"ff_norm{index}")(x + hidden)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    return keras.Model(inputs, _softmax_head(x, classes), name="text_transformer")


MODELS: dict[str, Callable[..., keras.Model]] = {"small_cnn": small_cnn, "text_transformer": text_transformer}


def resolve_model(
    name: str, *, search_paths: Sequence[str | os.PathLike] = (), import_code: bool = True
) -> Callable[..., Any] | None:
    """Finds the function that builds the model a recipe file names.

    Looked up in this order: an import path `package.module:function` (the only way a recipe file runs
    code of its own, and only the code it names), a tfopt built-in from `MODELS`, then a
    `keras.applications` function such as `ResNet50`. An import path runs its module's code when
    imported, as a script would: `import_code=False` (`tfopt-recipe validate`, `--dry-run`) only finds the
    module's file. Modules of Python's standard library and functions that are not Python functions or
    classes (`os:system`) are refused before anything is called: they build no model.

    Args:
        name: The model name as written in the recipe.
        search_paths: Directories tried first when importing an import path's module, typically the
            recipe file's directory and the working directory (a console script does not put the
            working directory on `sys.path`).
        import_code: Whether an import path's module may be imported.

    Returns:
        A callable that takes the model's keyword arguments and returns a `keras.Model`; None for an
        import path that was found but, with `import_code=False`, not imported.

    Raises:
        ValueError: The name is not a built-in, not a `keras.applications` model, or its import path
            cannot be found or imported, or does not name a model function. The message names the closest
            valid name.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"A model name must be a non-empty string; received {name!r}.")
    if ":" in name:
        return _import_callable(name, search_paths) if import_code else _find_module(name, search_paths)
    if name in MODELS:
        return MODELS[name]
    applications = _application_names()
    if name in applications:
        return getattr(keras.applications, name)
    known = [*MODELS, *applications]
    hint = did_you_mean(name, known, cutoff=0.5)
    raise ValueError(
        f"Unknown model {name!r}.{hint} Expected a tfopt built-in ({', '.join(MODELS)}), a "
        f"keras.applications model (e.g. ResNet50, MobileNetV2, EfficientNetB0; `tfopt-recipe list` "
        f"shows all), or an import path 'package.module:function'."
    )


def application_names() -> list[str]:
    """The `keras.applications` model functions, sorted (ResNet50, MobileNetV2, ...)."""
    return _application_names()


def _application_names() -> list[str]:
    return sorted(
        name for name in dir(keras.applications) if name[:1].isupper() and callable(getattr(keras.applications, name))
    )


def _checked_module_name(path: str) -> str:
    """The module of an import path, refused where it is malformed or Python's standard library."""
    if not _IMPORT_PATH.match(path):
        raise ValueError(
            f"{path!r} is not an import path: expected 'package.module:function' (dotted "
            "Python names, one colon), e.g. 'my_project.models:build_model'."
        )
    module_name = path.split(":")[0]
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise ValueError(
            f"Model {path!r} names Python's standard library module {module_name!r}, which builds no "
            "model; name the function of your own module that returns a keras.Model."
        )
    return module_name


def _find_module(path: str, search_paths: Sequence[str | os.PathLike]) -> None:
    """Checks that an import path's module can be found, without importing it (or its packages)."""
    module_name = _checked_module_name(path)
    locations: list[str] | None = [os.fspath(location) for location in search_paths] + sys.path
    for depth, part in enumerate(module_name.split(".")):
        spec = importlib.machinery.PathFinder.find_spec(part, locations)
        if spec is None and depth == 0:
            spec = importlib.util.find_spec(part)  # a top-level name: found without importing anything
        if spec is None:
            raise ValueError(
                f"Cannot find module {module_name!r} of model {path!r}. The module must be installed, or live "
                "next to the recipe file or in the working directory."
            )
        locations = list(spec.submodule_search_locations or [])
    return


def _import_callable(path: str, search_paths: Sequence[str | os.PathLike]) -> Callable[..., Any]:
    module_name = _checked_module_name(path)
    attribute_path = path.split(":")[1]
    with _prepended_to_sys_path(search_paths):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not (module_name == error.name or module_name.startswith(error.name + ".")):
                # The module exists but itself imports something missing: say so, not "cannot import".
                raise ValueError(
                    f"Importing module {module_name!r} of model {path!r} raised ModuleNotFoundError: {error}"
                ) from error
            raise ValueError(
                f"Cannot import module {module_name!r} of model {path!r}: {error}. The module must be "
                "installed, or live next to the recipe file or in the working directory."
            ) from error
        except Exception as error:
            raise ValueError(
                f"Importing module {module_name!r} of model {path!r} raised {type(error).__name__}: {error}"
            ) from error
    target: Any = module
    for part in attribute_path.split("."):
        if not hasattr(target, part):
            public = [attribute for attribute in dir(target) if not attribute.startswith("_")]
            hint = did_you_mean(part, public)
            raise ValueError(
                f"{getattr(target, '__name__', module_name)!r} has no attribute {part!r} (model {path!r}).{hint}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(
            f"Model {path!r} names a {type(target).__name__}, not a function: expected a "
            "function (or class) that returns a keras.Model."
        )
    defined_in = str(getattr(target, "__module__", None) or "")
    if inspect.isbuiltin(target) or defined_in.split(".")[0] in sys.stdlib_module_names:
        raise ValueError(
            f"Model {path!r} is {defined_in or 'a built-in'}.{getattr(target, '__name__', part)}, "
            "which builds no model; name the function of your own module that returns a keras.Model."
        )
    return target


@contextlib.contextmanager
def _prepended_to_sys_path(paths: Sequence[str | os.PathLike]) -> Iterator[None]:
    added = [os.fspath(path) for path in paths if os.fspath(path) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for path in added:
            sys.path.remove(path)


def _softmax_head(x: Any, classes: int) -> Any:
    logits = layers.Dense(int(classes), name="logits")(x)
    # float32 whatever the dtype policy: a float16 softmax overflows and the loss goes NaN.
    return layers.Activation("softmax", dtype="float32", name="probabilities")(logits)


def check_arguments(model: str, **arguments: Any) -> None:
    """Checks the values of arguments of one of tfopt's own models without building it (`tfopt-recipe validate`
    does, as the model does first).

    Raises:
        ValueError: A value the model rejects, named by its argument first ("dropout: expected ...").

    Example:
        >>> check_arguments("small_cnn", dropout=7)
        Traceback (most recent call last):
        ...
        ValueError: dropout: expected a rate in [0, 1); received 7.
    """
    rules = _ARGUMENT_RULES.get(model, {})
    for name, value in arguments.items():
        if name in rules:
            rules[name](name, value)


def _check_positive_ints(name: str, value: Any, *, length: int | None = None, sequence: bool = False) -> None:
    values = list(value) if sequence and isinstance(value, (list, tuple)) else [value]
    valid = (
        (not sequence or isinstance(value, (list, tuple)))
        and values
        and all(isinstance(item, int) and not isinstance(item, bool) and item >= 1 for item in values)
    )
    if not valid or (length is not None and len(values) != length):
        expected = f"a list of {length or 'one or more'} positive integers" if sequence else "a positive integer"
        raise ValueError(f"{name}: expected {expected}; received {value!r}.")


def _check_rate(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{name}: expected a rate in [0, 1); received {value!r}.")


_ARGUMENT_RULES: dict[str, dict[str, Callable[[str, Any], None]]] = {
    "small_cnn": {
        "input_shape": functools.partial(_check_positive_ints, length=3, sequence=True),
        "filters": functools.partial(_check_positive_ints, sequence=True),
        "classes": _check_positive_ints,
        "dropout": _check_rate,
    },
    "text_transformer": {
        **dict.fromkeys(
            ("sequence_length", "vocab_size", "classes", "embed_dim", "num_heads", "ff_dim", "num_layers"),
            _check_positive_ints,
        ),
        "dropout": _check_rate,
    },
}
