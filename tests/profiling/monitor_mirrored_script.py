"""Run in a fresh process by test_monitor.py: TensorFlow must see two logical CPUs before it starts.

Trains the same model from the same weights under MirroredStrategy over two CPUs, with and without
`tfopt.Monitor`, and prints one JSON line: the Monitor's windows and both runs' weights (with the argument
`uneven`: the histories of an epoch whose last batch the replicas share unevenly). The host is
described as an H100's, with a GPU TensorFlow sees, as on a GPU machine: the replicas are CPUs all the same.
"""

from __future__ import annotations

import json
import sys

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfopt.hardware import Gpu, Hardware  # noqa: E402
from tfopt.profiling import monitor as monitor_module  # noqa: E402
from tfopt.profiling.monitor import Monitor  # noqa: E402

H100_HOST = Hardware(gpus=(Gpu("NVIDIA H100 80GB HBM3", (9, 0), 80 * 2**30),), cpu_count=16)
if not tf.config.list_logical_devices("GPU"):
    monitor_module._visible_gpus = lambda: ["GPU:0"]

rng = np.random.default_rng(0)
features = rng.normal(size=(128, 4)).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(16, drop_remainder=True).repeat()


def train(callbacks):
    keras.utils.set_random_seed(0)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    model.fit(dataset, epochs=1, steps_per_epoch=13, verbose=0, callbacks=callbacks)
    return model


def epoch_logs(callbacks):
    """The history of an epoch of 61 examples in batches of 16: the replicas see 7 and 6 of the last one."""
    keras.utils.set_random_seed(1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    x = np.random.default_rng(0).random((61, 5), dtype=np.float32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        model.compile(
            optimizer="adam",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(x, (x.sum(1) > 2.5).astype("int32"), batch_size=16, verbose=0, callbacks=callbacks)
    return {key: value for key, value in history.history.items() if not key.startswith("tfopt/")}


if sys.argv[1:] == ["uneven"]:  # a window closing on the epoch's last step (4), on this host's CPUs
    print("RESULT " + json.dumps([epoch_logs([Monitor(every_steps=3, hardware=Hardware())]), epoch_logs([])]))
    sys.exit(0)
monitor = Monitor(every_steps=4, hardware=H100_HOST)
monitored = train([monitor])
plain = train([])
print(
    "RESULT "
    + json.dumps(
        {
            "start": monitor.records_of("start")[0],
            "windows": [
                {key: value for key, value in record.items() if key != "logs"}
                for record in monitor.records_of("window")
            ],
            "weights_max_diff": max(
                float(np.max(np.abs(a - b))) for a, b in zip(monitored.get_weights(), plain.get_weights())
            ),
        }
    )
)
