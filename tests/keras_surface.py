"""Keras' public surface as cases for tfopt: every class in `keras.layers`, `keras.metrics`, `keras.losses`,
`keras.optimizers` and `keras.optimizers.schedules`, found by listing the modules (not picked by hand), each
made with its defaults or the arguments in `ARGUMENTS`, and placed in a tiny compiled model the way users
place it: a layer in a model's graph, a metric or a loss object (and by its string name) in `compile`, an
optimizer in `compile` with a learning-rate schedule where it takes one.

A class that cannot be placed in a model Keras trains with `fit` on this machine is in `NOT_TAKEN`, with why.
That list is what tfopt does not take; everything else must apply, copy and train as plain Keras does.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf
from keras import layers

COUNT, BATCH = 16, 8

# Classes that no tiny model trained by `fit` can hold here, and why. Each reason is a fact of Keras or of this
# machine, not of tfopt: the test checks that plain Keras fails on them too, or that they are abstract.
NOT_TAKEN = {
    "keras.layers.FlaxLayer": "wraps a Flax module: the JAX backend only",
    "keras.layers.JaxLayer": "wraps a JAX function: the JAX backend only",
    "keras.layers.TorchModuleWrapper": "wraps a torch module: the PyTorch backend only",
    "keras.layers.TFSMLayer": "reloads an exported SavedModel for inference: nothing to train",
    "keras.layers.InputLayer": "made by keras.Input, never placed by itself",
    "keras.layers.Wrapper": "an abstract base class (Bidirectional and TimeDistributed are tested)",
    "keras.layers.Layer": "the base class: no call() of its own (user layers are tested with the override shapes)",
    "keras.layers.STFTSpectrogram": "needs scipy to make its window, which Keras does not install",
    "keras.layers.MaxNumBoundingBoxes": "works on bounding-box dicts in a tf.data pipeline, not in a model",
    "keras.layers.RandomElasticTransform": "runs in tf.data only: its graph mode needs the image size statically",
    "keras.metrics.Metric": "the base class: no update_state of its own",
    "keras.metrics.MeanMetricWrapper": "the base class of every function metric (all tested)",
    "keras.losses.Loss": "the base class: no call() of its own",
    "keras.losses.CTC": "needs label and prediction sequences of its own layout (captcha-style models are tested)",
    "keras.optimizers.Optimizer": "the base class: no update rule of its own",
    "keras.optimizers.LossScaleOptimizer": "tfopt's mixed_float16 path wraps the optimizer itself (tested there)",
    "keras.optimizers.MultiOptimizer": "maps optimizers to layers of one named model (not in Keras 3.15's TF API)",
    "keras.optimizers.schedules.LearningRateSchedule": "the base class: no __call__ of its own",
}

# Constructor arguments of the classes that have no defaults for them.
ARGUMENTS: dict[str, Callable[[], dict]] = {
    "Activation": lambda: dict(activation="relu"),
    "AlphaDropout": lambda: dict(rate=0.1),
    "Bidirectional": lambda: dict(layer=layers.LSTM(2)),
    "CenterCrop": lambda: dict(height=4, width=4),
    "Dense": lambda: dict(units=2),
    "Dot": lambda: dict(axes=1),
    "Dropout": lambda: dict(rate=0.2),
    "EinsumDense": lambda: dict(equation="ab,bc->ac", output_shape=3),
    "GRU": lambda: dict(units=2),
    "GRUCell": lambda: dict(units=2),
    "LSTMCell": lambda: dict(units=2),
    "SimpleRNNCell": lambda: dict(units=2),
    "GaussianDropout": lambda: dict(rate=0.1),
    "GaussianNoise": lambda: dict(stddev=0.1),
    "GroupQueryAttention": lambda: dict(head_dim=2, num_query_heads=2, num_key_value_heads=1),
    "LSTM": lambda: dict(units=2),
    "Lambda": lambda: dict(function=lambda x: x * 2.0),
    "MultiHeadAttention": lambda: dict(num_heads=2, key_dim=2),
    "Permute": lambda: dict(dims=(2, 1)),
    "GroupNormalization": lambda: dict(groups=1),
    "MelSpectrogram": lambda: dict(
        fft_length=16, sequence_stride=4, sequence_length=16, num_mel_bins=4, sampling_rate=1000
    ),
    "Pipeline": lambda: dict(layers=[layers.Rescaling(0.5), layers.Rescaling(2.0)]),
    "RNN": lambda: dict(cell=layers.SimpleRNNCell(2)),
    "RandomBrightness": lambda: dict(factor=0.1),
    "RandomColorDegeneration": lambda: dict(factor=0.1),
    "RandomContrast": lambda: dict(factor=0.1),
    "RandomCrop": lambda: dict(height=4, width=4),
    "RandomHue": lambda: dict(factor=0.1),
    "RandomPosterization": lambda: dict(factor=(1, 8)),
    "RandomRotation": lambda: dict(factor=0.1),
    "RandomSaturation": lambda: dict(factor=0.1),
    "RandomSharpness": lambda: dict(factor=0.1),
    "RandomTranslation": lambda: dict(height_factor=0.1, width_factor=0.1),
    "RandomZoom": lambda: dict(height_factor=0.1),
    "RepeatVector": lambda: dict(n=2),
    "Rescaling": lambda: dict(scale=1 / 255),
    "Reshape": lambda: dict(target_shape=(-1,)),
    "Resizing": lambda: dict(height=4, width=4),
    "SimpleRNN": lambda: dict(units=2),
    "SpatialDropout1D": lambda: dict(rate=0.1),
    "SpatialDropout2D": lambda: dict(rate=0.1),
    "SpatialDropout3D": lambda: dict(rate=0.1),
    "SpectralNormalization": lambda: dict(layer=layers.Dense(2)),
    "StackedRNNCells": lambda: dict(cells=[layers.LSTMCell(2), layers.LSTMCell(2)]),
    "TimeDistributed": lambda: dict(layer=layers.Dense(2)),
    "IoU": lambda: dict(num_classes=3, target_class_ids=[0, 1]),
    "MeanIoU": lambda: dict(num_classes=3),
    "OneHotIoU": lambda: dict(num_classes=3, target_class_ids=[0, 1]),
    "OneHotMeanIoU": lambda: dict(num_classes=3),
    "PrecisionAtRecall": lambda: dict(recall=0.5),
    "RecallAtPrecision": lambda: dict(precision=0.5),
    "SensitivityAtSpecificity": lambda: dict(specificity=0.5),
    "SpecificityAtSensitivity": lambda: dict(sensitivity=0.5),
    "CosineDecay": lambda: dict(initial_learning_rate=0.01, decay_steps=10),
    "CosineDecayRestarts": lambda: dict(initial_learning_rate=0.01, first_decay_steps=10),
    "ExponentialDecay": lambda: dict(initial_learning_rate=0.01, decay_steps=10, decay_rate=0.9),
    "InverseTimeDecay": lambda: dict(initial_learning_rate=0.01, decay_steps=10, decay_rate=0.5),
    "PiecewiseConstantDecay": lambda: dict(boundaries=[2], values=[0.01, 0.001]),
    "PolynomialDecay": lambda: dict(initial_learning_rate=0.01, decay_steps=10),
}
for _rank in (1, 2, 3):
    ARGUMENTS[f"AdaptiveAveragePooling{_rank}D"] = ARGUMENTS[f"AdaptiveMaxPooling{_rank}D"] = lambda rank=_rank: dict(
        output_size=(2,) * rank
    )
    ARGUMENTS[f"AveragePooling{_rank}D"] = lambda: dict(pool_size=2)
    for _conv in (f"Conv{_rank}D", f"Conv{_rank}DTranspose", f"ConvLSTM{_rank}D", f"SeparableConv{_rank}D"):
        ARGUMENTS[_conv] = lambda: dict(filters=2, kernel_size=2)
    ARGUMENTS[f"DepthwiseConv{_rank}D"] = lambda: dict(kernel_size=2)

# Inputs a layer is tried on, in order: the first shape a model with it trains on is the one used.
# Images before sequences: image layers take a rank-3 batch for one image and fail in a graph on it.
SHAPES = {
    "vector": (6,),
    "image": (8, 8, 3),
    "sequence": (5, 4),
    "volume": (4, 4, 4, 2),
    "sequence_of_images": (3, 6, 6, 2),
    "sequence_of_volumes": (2, 4, 4, 4, 1),
    "audio": (64,),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One public class and how to make a compiled model that holds it, with its data."""

    name: str  # "keras.layers.Dense"
    make: Callable[[], tuple[keras.Model, tf.data.Dataset]]


def public_classes(module, base) -> dict[str, type]:
    """The classes `module` exports that derive from `base`, each once, by their public name."""
    found: dict[type, str] = {}
    for name in sorted(dir(module)):
        value = getattr(module, name)
        if isinstance(value, type) and issubclass(value, base):
            found.setdefault(value, name)
    return {f"{module.__name__}.{name}": kind for kind, name in found.items()}


def construct(name: str, kind: type):
    short = name.rsplit(".", 1)[1]
    return kind(**ARGUMENTS[short]()) if short in ARGUMENTS else kind()


def _rng():
    return np.random.default_rng(0)


def _dataset(inputs, targets):
    return tf.data.Dataset.from_tensor_slices((inputs, targets)).batch(BATCH)


def _head(x):
    """A float scalar per example from whatever a layer returns."""
    if isinstance(x, (list, tuple)):
        x = x[0]
    if x.dtype not in ("float16", "bfloat16", "float32", "float64"):
        x = layers.Embedding(64, 2)(x)
    if len(x.shape) > 2:  # pooled, not flattened: a random crop's output is smaller in training than not
        x = layers.GlobalAveragePooling1D()(layers.Reshape((-1, x.shape[-1]))(x))
    return layers.Dense(1)(x)


def _layer_model(name, kind, shape, call):
    inputs = keras.Input(shape)
    outputs = _head(call(construct(name, kind), inputs))
    model = keras.Model(inputs, outputs, name=name.rsplit(".", 1)[1].lower())
    model.compile(optimizer="adam", loss="mse")
    values = _rng().random((COUNT, *shape), dtype=np.float32)
    return model, _dataset(values, _rng().random((COUNT, 1), dtype=np.float32))


CALLS = {
    "one": lambda layer, x: layer(x),
    "pair": lambda layer, x: layer([x, x]),
    "query_value": lambda layer, x: layer(x, x),
    "in_rnn": lambda cell, x: layers.RNN(cell)(x),  # RNN cells
}


def _ids_model(layer_fn, *, strings=False, pair=False, name="ids"):
    """A layer reading ids or strings (lookups, hashing, embedding, encoding)."""
    vocabulary = [f"w{index}" for index in range(8)]
    dtype = "string" if strings else "int32"
    width = 1 if pair else 3  # crossing takes one feature per input
    inputs = [keras.Input((width,), dtype=dtype) for _ in range(2 if pair else 1)]
    outputs = _head(layer_fn(vocabulary)(inputs if pair else inputs[0]))
    model = keras.Model(inputs if pair else inputs[0], outputs, name=name)
    model.compile(optimizer="adam", loss="mse")
    rng = _rng()
    ids = rng.integers(0, 8, (COUNT, width)).astype("int32")
    values = np.array(vocabulary)[ids] if strings else ids
    features = (values, values) if pair else values
    return model, _dataset(features, rng.random((COUNT, 1), dtype=np.float32))


def _text_model(name="text"):
    texts = np.array([f"w{index % 5} w{index % 3} w{index % 7}" for index in range(COUNT)])[:, None]
    vectorize = layers.TextVectorization(max_tokens=16, output_sequence_length=4)
    vectorize.adapt(texts)
    inputs = keras.Input((1,), dtype="string")
    model = keras.Model(inputs, _head(vectorize(inputs)), name=name)
    model.compile(optimizer="adam", loss="mse")
    return model, _dataset(texts, _rng().random((COUNT, 1), dtype=np.float32))


# Layers that read ids or strings: made with what they need (a vocabulary, bins, the number of tokens).
ID_LAYERS = {
    "Embedding": lambda: _ids_model(lambda _: layers.Embedding(8, 2), name="embedding"),
    "ReversibleEmbedding": lambda: _ids_model(lambda _: layers.ReversibleEmbedding(8, 2), name="reversible_embedding"),
    "CategoryEncoding": lambda: _ids_model(
        lambda _: layers.CategoryEncoding(num_tokens=8, output_mode="multi_hot"), name="category_encoding"
    ),
    "Hashing": lambda: _ids_model(lambda _: layers.Hashing(num_bins=8), strings=True, name="hashing"),
    "HashedCrossing": lambda: _ids_model(
        lambda _: layers.HashedCrossing(num_bins=8), strings=True, pair=True, name="hashed_crossing"
    ),
    "IntegerLookup": lambda: _ids_model(lambda _: layers.IntegerLookup(vocabulary=list(range(1, 8))), name="lookup"),
    "StringLookup": lambda: _ids_model(
        lambda words: layers.StringLookup(vocabulary=words), strings=True, name="lookup"
    ),
    "TextVectorization": _text_model,
    "Discretization": lambda: _layer_model(
        "keras.layers.Discretization",
        lambda: layers.Discretization(bin_boundaries=[0.25, 0.5, 0.75]),
        (6,),
        CALLS["one"],
    ),
    "Normalization": lambda: _layer_model(
        "keras.layers.Normalization", lambda: layers.Normalization(mean=0.5, variance=0.1), (6,), CALLS["one"]
    ),
}


def layer_cases() -> list[Case]:
    cases = []
    for name, kind in public_classes(keras.layers, keras.layers.Layer).items():
        if name in NOT_TAKEN:
            continue
        short = name.rsplit(".", 1)[1]
        if short in ID_LAYERS:
            cases.append(Case(name, ID_LAYERS[short]))
        else:
            cases.append(Case(name, _first_placement(name, kind)))
    return cases


def _first_placement(name, kind):
    """A maker that places the layer on the first input shape and call form it builds a model with."""

    def make():
        shape, call = _placement(name, kind)
        return _layer_model(name, kind, shape, call)

    return make


@functools.cache
def _placement(name, kind):
    failures = []
    for shape in SHAPES.values():
        for call in CALLS.values():
            try:  # built, then traced as fit traces it (batch size unknown) and run on a batch both ways
                model, data = _layer_model(name, kind, shape, call)

                @tf.function(reduce_retracing=True)
                def losses(inputs, targets, model=model):
                    return [model.compute_loss(inputs, targets, model(inputs, training=mode)) for mode in (True, False)]

                losses.get_concrete_function(*data.element_spec)
                losses(*next(iter(data)))
            except Exception as error:  # noqa: BLE001 - this placement does not suit the layer: try the next
                failures.append(f"{shape}: {type(error).__name__}")
                continue
            return shape, call
    raise AssertionError(f"{name}: no tiny model can hold it ({'; '.join(failures)})")


# A model's head for each kind of target a metric or loss reads (units, activation), with its data.
TASKS = {
    "binary": ((1, "sigmoid"), lambda rng: rng.integers(0, 2, (COUNT, 1)).astype("float32")),
    "sparse": ((3, "softmax"), lambda rng: rng.integers(0, 3, (COUNT,)).astype("int32")),
    "categorical": ((3, "softmax"), lambda rng: np.eye(3, dtype="float32")[rng.integers(0, 3, COUNT)]),
    "regression": ((3, "softplus"), lambda rng: rng.random((COUNT, 3), dtype=np.float32)),
}


def compiled_on_task(task: str, *, name: str, optimizer="adam", loss=None, metrics=None):
    (units, activation), targets = TASKS[task]
    inputs = keras.Input((6,))
    outputs = layers.Dense(units, activation=activation)(layers.Dense(4, activation="relu")(inputs))
    model = keras.Model(inputs, outputs, name=name)
    default_loss = {"binary": "binary_crossentropy", "sparse": "sparse_categorical_crossentropy"}.get(task, "mse")
    model.compile(optimizer=optimizer, loss=loss or default_loss, metrics=metrics)
    rng = _rng()
    return model, _dataset(rng.random((COUNT, 6), dtype=np.float32), targets(rng))


def _on_first_task(name, compile_kwargs):
    """A maker compiling a tiny model with the object on the first task whose targets it reads."""
    model_name = name.rsplit(".", 1)[-1].lower()

    def make():
        return compiled_on_task(_task(name, compile_kwargs), name=model_name, **compile_kwargs())

    return make


# Losses whose first fitting task by the probe below trains to NaN in plain Keras: their own task.
TASK_OF = {"keras.losses.CategoricalGeneralizedCrossEntropy": "sparse"}


@functools.cache
def _task(name, compile_kwargs):
    failures = []
    for task in [TASK_OF[name]] if name in TASK_OF else TASKS:
        try:  # eagerly, on one batch: a loss or metric that cannot read these targets fails here
            model, data = compiled_on_task(task, name="probe", **compile_kwargs())
            x, y = next(iter(data))
            predictions = model(x)
            if not np.isfinite(float(model.compute_loss(x, y, predictions))):
                raise FloatingPointError("the loss is not finite")
            model.compute_metrics(x, y, predictions, None)
        except Exception as error:  # noqa: BLE001 - the object does not read this kind of target
            failures.append(f"{task}: {type(error).__name__}")
            continue
        return task
    raise AssertionError(f"{name}: no task suits it ({'; '.join(failures)})")


class Tracked(keras.Model):
    """A model reporting a `Mean` or `Sum` of its loss through its `metrics` property, as the keras-io VAE and
    GAN report theirs (those metrics read one value, so `compile(metrics=...)` cannot take them)."""

    def __init__(self, tracker, **kwargs):
        super().__init__(**kwargs)
        self.dense = layers.Dense(1)
        self.tracker = tracker

    def call(self, inputs):
        return self.dense(inputs)

    @property
    def metrics(self):
        return [*super().metrics, self.tracker]

    def train_step(self, data):
        logs = super().train_step(data)
        self.tracker.update_state(logs["loss"])
        return {**logs, "tracked": self.tracker.result()}


def _tracked(name, kind):
    def make():
        model = Tracked(construct(name, kind), name="tracked")
        model.compile(optimizer="adam", loss="mse")
        rng = _rng()
        return model, _dataset(rng.random((COUNT, 6), dtype=np.float32), rng.random((COUNT, 1), dtype=np.float32))

    return make


def metric_cases() -> list[Case]:
    cases = [
        Case(
            name,
            _tracked(name, kind)
            if kind in (keras.metrics.Mean, keras.metrics.Sum)
            else _on_first_task(name, lambda name=name, kind=kind: dict(metrics=[construct(name, kind)])),
        )
        for name, kind in public_classes(keras.metrics, keras.metrics.Metric).items()
        if name not in NOT_TAKEN
    ]
    for string in (
        "accuracy",
        "mae",
        "mse",
        "auc",
        "binary_accuracy",
        "categorical_crossentropy",
        "top_k_categorical_accuracy",
    ):
        cases.append(Case(f"metrics={string!r}", _on_first_task(string, lambda string=string: dict(metrics=[string]))))
    return cases


def loss_cases() -> list[Case]:
    cases = [
        Case(name, _on_first_task(name, lambda name=name, kind=kind: dict(loss=construct(name, kind))))
        for name, kind in public_classes(keras.losses, keras.losses.Loss).items()
        if name not in NOT_TAKEN
    ]
    for string in ("mse", "huber", "kl_divergence", "categorical_crossentropy", "log_cosh"):
        cases.append(Case(f"loss={string!r}", _on_first_task(string, lambda string=string: dict(loss=string))))
    return cases


def optimizer_cases() -> list[Case]:
    cases = [
        Case(name, lambda name=name, kind=kind: compiled_on_task("sparse", name="opt", optimizer=construct(name, kind)))
        for name, kind in public_classes(keras.optimizers, keras.optimizers.Optimizer).items()
        if name not in NOT_TAKEN
    ]
    for name, kind in public_classes(
        keras.optimizers.schedules, keras.optimizers.schedules.LearningRateSchedule
    ).items():
        if name not in NOT_TAKEN:
            optimizer = lambda kind=kind, name=name: keras.optimizers.SGD(learning_rate=construct(name, kind))  # noqa: E731
            cases.append(
                Case(
                    name, lambda optimizer=optimizer: compiled_on_task("sparse", name="schedule", optimizer=optimizer())
                )
            )
    for string in ("adam", "sgd", "rmsprop"):
        cases.append(
            Case(
                f"optimizer={string!r}", lambda string=string: compiled_on_task("sparse", name="opt", optimizer=string)
            )
        )
    return cases


def all_cases() -> list[Case]:
    return [*layer_cases(), *metric_cases(), *loss_cases(), *optimizer_cases()]
