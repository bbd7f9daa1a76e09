"""`SyntheticSource`: learnable synthetic images or token sequences, generated in memory from a seed.

Synthetic data lets a recipe be tried on any model shape without a dataset on disk. It is learnable on
purpose (a model that trains on it shows a falling loss, so numerics recipes can be checked), but it is
not a substitute for a real input pipeline: there is no file to read and nothing to decode, so it
cannot show an input bottleneck. Use `ImageFolderSource(default_dataset_dir())` for that.

* `kind="image"`: uint8 images of an oriented sine grating whose orientation encodes the class, with a
  random phase, frequency, colour and noise; yielded as float32 in [0, 1].
* `kind="tokens"`: int32 sequences of random tokens in which about one position in eight is replaced by
  one of the class's own keyword tokens, for text classifiers.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tfopt.data import images
from tfopt.data.arrays import in_memory_pipeline
from tfopt.data.source import DataSource, PipelineRequest, image_size_pair
from tfopt.errors import DataError

_KINDS = ("image", "tokens")
_KEYWORDS_PER_CLASS = 8
_KEYWORD_RATE = 0.125


class SyntheticSource(DataSource):
    """Deterministic, learnable synthetic examples: images or token sequences.

    Args:
        kind: "image" or "tokens".
        examples: Number of examples.
        num_classes: Number of classes (labels are int32 in `[0, num_classes)`, balanced).
        image_size: `(height, width)` of images (kind "image").
        channels: Image channels (kind "image").
        vocab_size: Token vocabulary size, token 0 unused so it can stand for padding (kind "tokens").
        sequence_length: Tokens per sequence (kind "tokens").
        seed: Seed of the generator; the same seed gives the same examples.

    Raises:
        DataError: `kind` is unknown or a size is out of range.

    Example:
        >>> source = SyntheticSource("tokens", vocab_size=1000, sequence_length=64, num_classes=2)
        >>> dataset = source.pipeline(batch_size=32, optimized=True)
    """

    name = "synthetic"

    def __init__(
        self,
        kind: str = "image",
        *,
        examples: int = 1024,
        num_classes: int = 5,
        image_size: int | tuple[int, int] | list[int] = (64, 64),
        channels: int = 3,
        vocab_size: int = 1000,
        sequence_length: int = 64,
        seed: int = 0,
    ):
        if kind not in _KINDS:
            raise DataError(
                f"synthetic: kind={kind!r} is not a kind of synthetic data. Expected one of {list(_KINDS)}.",
                setting="kind",
            )
        _check_positive(examples=examples, num_classes=num_classes, channels=channels, sequence_length=sequence_length)
        if num_classes < 2:
            raise DataError(
                f"synthetic: num_classes={num_classes} leaves nothing to learn. Pass num_classes >= 2.",
                setting="num_classes",
            )
        if kind == "tokens" and vocab_size <= num_classes * _KEYWORDS_PER_CLASS:
            raise DataError(
                f"synthetic: vocab_size={vocab_size} is too small for {num_classes} classes with "
                f"{_KEYWORDS_PER_CLASS} keyword tokens each. Pass vocab_size > {num_classes * _KEYWORDS_PER_CLASS}.",
                setting="vocab_size",
            )
        self.kind = kind
        self.examples = examples
        self.num_classes = num_classes
        self.image_size = image_size_pair(self.name, image_size)
        self.channels = channels
        self.vocab_size = vocab_size
        self.sequence_length = sequence_length
        self.seed = seed
        self._arrays = None

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The generated `(x, y)` NumPy arrays (generated on first access, then kept)."""
        if self._arrays is None:
            rng = np.random.default_rng(self.seed)
            labels = (np.arange(self.examples) % self.num_classes).astype(np.int32)
            labels = rng.permutation(labels)
            make = _images if self.kind == "image" else _tokens
            self._arrays = (make(self, rng, labels), labels)
        return self._arrays

    def _build_pipeline(self, request: PipelineRequest) -> tf.data.Dataset:
        x, y = self.arrays
        return in_memory_pipeline(
            x,
            y,
            finish=images.to_unit_float if self.kind == "image" else (lambda a, b: (a, b)),
            request=request,
        )

    def describe(self) -> str:
        if self.kind == "image":
            height, width = self.image_size
            shape = f"{height}x{width}x{self.channels} images"
        else:
            shape = f"sequences of {self.sequence_length} tokens from a vocabulary of {self.vocab_size}"
        return f"synthetic {self.kind}: {self.examples} {shape}, {self.num_classes} classes, seed {self.seed}"

    def get_config(self) -> dict:
        return {
            "kind": self.kind,
            "examples": self.examples,
            "num_classes": self.num_classes,
            "image_size": list(self.image_size),
            "channels": self.channels,
            "vocab_size": self.vocab_size,
            "sequence_length": self.sequence_length,
            "seed": self.seed,
        }


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"synthetic: {key}={value!r} is not a positive integer.", setting=key)


def _images(source: SyntheticSource, rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    height, width = source.image_size
    count = len(labels)
    # The class sets the orientation of the grating; the jitter stays below half the gap between classes.
    angle = np.pi * labels / source.num_classes + rng.uniform(-0.3, 0.3, count) * np.pi / source.num_classes
    frequency = rng.uniform(2.0, 5.0, count) * 2 * np.pi / max(height, width)
    phase = rng.uniform(0, 2 * np.pi, count)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    along = np.cos(angle)[:, None, None] * xs + np.sin(angle)[:, None, None] * ys
    wave = np.sin(frequency[:, None, None] * along + phase[:, None, None])
    colour = rng.uniform(0.3, 1.0, (count, 1, 1, source.channels))
    pixels = 0.5 + 0.35 * wave[..., None] * colour + rng.normal(0.0, 0.08, (count, height, width, source.channels))
    return np.clip(pixels * 255.0, 0, 255).astype(np.uint8)


def _tokens(source: SyntheticSource, rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    count, length = len(labels), source.sequence_length
    keywords = rng.permutation(np.arange(1, source.vocab_size))[: source.num_classes * _KEYWORDS_PER_CLASS]
    keywords = keywords.reshape(source.num_classes, _KEYWORDS_PER_CLASS)
    tokens = rng.integers(1, source.vocab_size, (count, length))
    chosen = keywords[labels[:, None], rng.integers(0, _KEYWORDS_PER_CLASS, (count, length))]
    place = rng.random((count, length)) < _KEYWORD_RATE
    place[:, 0] = True  # at least one keyword per sequence, so every example carries its class
    return np.where(place, chosen, tokens).astype(np.int32)
