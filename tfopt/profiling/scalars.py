"""TensorBoard scalars written with TensorFlow alone.

`tf.summary.scalar` lives in the `tensorboard` package, which TensorFlow 2.21 no longer installs: calling it
without that package raises TBNotInstalledError in the middle of the user's training. Core
`tf.summary.write` with the scalars plugin's metadata writes the same event records, which TensorBoard
shows as scalars.
"""

from __future__ import annotations

from collections.abc import Mapping


def write_scalars(values: Mapping[str, float], *, step: int) -> None:
    """Writes each value as a TensorBoard scalar named by its key, at `step`, to the default summary writer.

    Always recorded: a `keras.callbacks.TensorBoard(update_freq=N)` in the same `fit` leaves
    `tf.summary.record_if(step % N == 0)` in force, which would drop these silently.
    """
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    with tf.summary.record_if(True):
        for name, value in values.items():
            tf.summary.write(name, tf.constant(float(value)), step=step, metadata=metadata)
