"""`SOURCES` and `make_source`: build a data source from its YAML name and keyword arguments.

The YAML item `data: {source: image_folder, path: ..., image_size: [64, 64]}` becomes
`make_source("image_folder", path=..., image_size=[64, 64])`; the keys are exactly the constructor's
keyword arguments, so an unknown key is reported with the valid ones rather than as a bare TypeError.
"""

from __future__ import annotations

import inspect

from tfopt.data.arrays import NumpySource
from tfopt.data.image_folder import ImageFolderSource
from tfopt.data.source import DataSource
from tfopt.data.synthetic import SyntheticSource
from tfopt.data.tfds_source import TfdsSource
from tfopt.data.tfrecord.source import TFRecordSource
from tfopt.errors import DataError
from tfopt.suggest import did_you_mean

SOURCES: dict[str, type[DataSource]] = {
    cls.name: cls for cls in (ImageFolderSource, NumpySource, SyntheticSource, TfdsSource, TFRecordSource)
}


def make_source(source: str, /, **kwargs) -> DataSource:
    """Builds the source registered as `source` with the constructor arguments `kwargs`.

    Args:
        source: A key of `SOURCES`, e.g. "image_folder", "tfrecord", "tfds", "numpy", "synthetic".
            Positional-only, so that a source's own `name` argument (tfds) can be passed as a keyword.
        **kwargs: The source's constructor arguments (the YAML keys next to `source:`).

    Returns:
        The constructed source.

    Raises:
        DataError: `source` is not registered (the message lists the known names and the closest one),
            a key is not an argument of that source (the message lists the valid keys), a required
            argument is missing, or the source itself rejects its data.

    Example:
        >>> source = make_source("synthetic", kind="tokens", examples=64, vocab_size=100, sequence_length=16)
        >>> tokens, labels = next(iter(source.pipeline(batch_size=8, optimized=False)))
        >>> tuple(tokens.shape)
        (8, 16)
        >>> make_source("image_folders")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tfopt.errors.DataError: data source 'image_folders' is not known. Did you mean 'image_folder'?...
    """
    name = source
    cls = SOURCES.get(name)
    if cls is None:
        raise DataError(
            f"data source {name!r} is not known.{did_you_mean(str(name), SOURCES)} Known sources: {sorted(SOURCES)}.",
            setting="source",
        )
    parameters = inspect.signature(cls.__init__).parameters
    valid = [key for key in parameters if key != "self"]
    for key in kwargs:
        if key not in valid:
            raise DataError(
                f"data source {name!r} has no argument {key!r}.{did_you_mean(str(key), valid)} Valid "
                f"arguments: {valid}.",
                setting=key,
            )
    required = [
        key
        for key, parameter in parameters.items()
        if key != "self" and parameter.default is inspect.Parameter.empty and key not in kwargs
    ]
    if required:
        raise DataError(
            f"data source {name!r} needs the argument {required[0]!r} (valid arguments: {valid}).", setting=required[0]
        )
    return cls(**kwargs)
