"""Dataset sources, the embedded default dataset, and TFRecord conversion.

Names are imported on first use (PEP 562) rather than at `import tfopt.data`: the sources need
TensorFlow, which takes seconds to import, and `generate_shapes`/`default_dataset_dir` do not, so
code that only needs the embedded dataset does not pay for it.

Example:
    >>> from tfopt.data import ImageFolderSource, default_dataset_dir
    >>> source = ImageFolderSource(default_dataset_dir(), image_size=(64, 64))
    >>> dataset = source.pipeline(batch_size=32, optimized=True)
"""

from __future__ import annotations

from tfopt._lazy import lazy_exports

_EXPORTS = {
    "generate_shapes": "tfopt.data.generated",
    "default_dataset_dir": "tfopt.data.generated",
    "DataSource": "tfopt.data.source",
    "ImageFolderSource": "tfopt.data.image_folder",
    "NumpySource": "tfopt.data.arrays",
    "SyntheticSource": "tfopt.data.synthetic",
    "TfdsSource": "tfopt.data.tfds_source",
    "TFRecordSource": "tfopt.data.tfrecord.source",
    "SOURCES": "tfopt.data.registry",
    "make_source": "tfopt.data.registry",
    "to_tfrecord": "tfopt.data.tfrecord.convert",
    "verify": "tfopt.data.tfrecord.verify",
}

__all__ = sorted(_EXPORTS)  # noqa: PLE0605 - the lazy table names every export


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
