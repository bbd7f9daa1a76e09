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

import importlib

_EXPORTS = {
    "generate_shapes": "tfopt.data.generated",
    "default_dataset_dir": "tfopt.data.generated",
    "DataSource": "tfopt.data.source",
    "ImageFolderSource": "tfopt.data.image_folder",
    "NumpySource": "tfopt.data.arrays",
    "SyntheticSource": "tfopt.data.synthetic",
    "TfdsSource": "tfopt.data.tfds_source",
    "TFRecordSource": "tfopt.data.tfrecord_source",
    "SOURCES": "tfopt.data.registry",
    "make_source": "tfopt.data.registry",
    "to_tfrecord": "tfopt.data.tfrecord",
    "verify": "tfopt.data.tfrecord_verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'tfopt.data' has no attribute {name!r}; public names are {__all__}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
