import numpy as np
import pytest

from tests.training.conftest import STEPS_PER_EPOCH, make_built
from tfopt.errors import DataError, IncompatibleModelError, NonFiniteLossError
from tfopt.training.checkpointing import CheckpointCallback, TrainingCheckpoint


def state(model):
    return [v.numpy().copy() for v in [*model.weights, *model.optimizer.variables]]


def test_restore_brings_back_weights_optimizer_and_step(tmp_path):
    source = make_built(seed=0)
    source.model.fit(source.dataset, epochs=1, verbose=0)  # Adam moments and iterations become non-zero
    checkpoint = TrainingCheckpoint(tmp_path, source.model, steps_per_epoch=STEPS_PER_EPOCH, async_write=True)
    checkpoint.save(10)
    checkpoint.sync()

    target = make_built(seed=1)
    assert not np.array_equal(target.model.weights[0].numpy(), source.model.weights[0].numpy())
    restored = TrainingCheckpoint(tmp_path, target.model, steps_per_epoch=STEPS_PER_EPOCH).restore()
    assert restored == 10
    assert int(target.model.optimizer.iterations.numpy()) == STEPS_PER_EPOCH
    for saved, loaded in zip(state(source.model), state(target.model), strict=True):
        np.testing.assert_array_equal(saved, loaded)


@pytest.mark.parametrize("damage", ["truncate_data", "truncate_index"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_good_one(tmp_path, caplog, damage):
    import logging

    source = make_built(seed=0)
    checkpoint = TrainingCheckpoint(tmp_path, source.model, steps_per_epoch=STEPS_PER_EPOCH, async_write=False)
    saved = {}
    for step in (2, 4, 6):
        source.model.fit(source.dataset, epochs=1, steps_per_epoch=2, verbose=0)
        checkpoint.save(step)
        saved[step] = state(source.model)
    suffix = ".data-00000-of-00001" if damage == "truncate_data" else ".index"
    newest = tmp_path / f"ckpt-6{suffix}"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])

    target = make_built(seed=1)
    with caplog.at_level(logging.WARNING, logger="tfopt"):
        restored = TrainingCheckpoint(tmp_path, target.model, steps_per_epoch=STEPS_PER_EPOCH).restore()
    assert restored == 4
    for expected, loaded in zip(saved[4], state(target.model), strict=True):
        np.testing.assert_array_equal(expected, loaded)
    assert f"The checkpoint {tmp_path / 'ckpt-6'} is damaged" in caplog.text
    assert f"Resuming from {tmp_path / 'ckpt-4'}: the newer ckpt-6" in caplog.text


def test_every_checkpoint_damaged_is_said(tmp_path, built):
    checkpoint = TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH, async_write=False)
    checkpoint.save(1)
    (tmp_path / "ckpt-1.data-00000-of-00001").write_bytes(b"")
    with pytest.raises(DataError, match=f"Every checkpoint in {tmp_path} is damaged: ckpt-1 "):
        TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH).restore()


def test_empty_directory_restores_nothing(tmp_path, built):
    assert TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH).restore() is None


def test_keeps_only_the_newest(tmp_path, built):
    checkpoint = TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH, keep=2, async_write=False)
    for step in range(1, 6):
        checkpoint.save(step)
    assert sorted(path.name for path in tmp_path.glob("*.index")) == ["ckpt-4.index", "ckpt-5.index"]
    assert checkpoint.latest_path.endswith("ckpt-5")


def test_never_writes_nan_weights(tmp_path, built):
    checkpoint = TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH, async_write=False)
    checkpoint.save(1)
    bias = built.model.layers[-1].bias
    bias.assign(np.full(bias.shape, np.nan, "float32"))
    with pytest.raises(NonFiniteLossError, match=rf"step 2: the model's weights hold NaN or Inf \({bias.path}\)"):
        checkpoint.save(2)
    assert checkpoint.latest_path.endswith("ckpt-1")
    assert not list(tmp_path.glob("ckpt-2*"))


def test_other_model_is_rejected(tmp_path, built):
    import keras

    TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH, async_write=False).save(3)
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(2), keras.layers.Dense(1)])
    other.compile(optimizer="adam", loss="mse")
    with pytest.raises(IncompatibleModelError, match="does not match this model"):
        TrainingCheckpoint(tmp_path, other, steps_per_epoch=STEPS_PER_EPOCH).restore()


def test_other_steps_per_epoch_is_rejected(tmp_path, built):
    TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=10, async_write=False).save(3)
    with pytest.raises(DataError, match="steps_per_epoch=10; this run has steps_per_epoch=7"):
        TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=7).restore()


def test_keep_must_be_positive(tmp_path, built):
    with pytest.raises(DataError, match="received 0"):
        TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=10, keep=0)


def test_callback_saves_at_intervals_and_epoch_ends(tmp_path, built):
    checkpoint = TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH, keep=100, async_write=False)
    built.model.fit(
        built.dataset, epochs=2, verbose=0, callbacks=[CheckpointCallback(checkpoint, every_steps=4, steps_done=0)]
    )
    steps = sorted(int(path.name.split("-")[1].split(".")[0]) for path in tmp_path.glob("*.index"))
    assert steps == [4, 8, 10, 12, 16, 20]


def test_builds_the_optimizer_in_the_models_strategy(tmp_path):
    # A model built under OneDeviceStrategy (the distribution recipe on one GPU) refuses optimizer
    # variables created outside its scope: 'Need to be inside "with strategy.scope()"'.
    import keras
    import tensorflow as tf

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    checkpoint = TrainingCheckpoint(tmp_path, model, steps_per_epoch=STEPS_PER_EPOCH, async_write=False)
    checkpoint.save(1)
    # iteration, learning rate, and Adam's two moments for the kernel and the bias
    assert len(model.optimizer.variables) == 6
    assert checkpoint.latest_path.endswith("ckpt-1")


WRITE_FAILS = """
import resource, signal, sys

import keras

from tfopt.errors import CheckpointWriteError
from tfopt.training.checkpointing import TrainingCheckpoint

directory, mode = sys.argv[1], sys.argv[2]
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
checkpoint = TrainingCheckpoint(directory, model, steps_per_epoch=10, async_write=mode == "async")
checkpoint.save(1)
checkpoint.sync()
# No file may grow past 100 kB from here, and the next checkpoint is larger: its write fails as on a full disk.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
try:
    checkpoint.save(2)
    checkpoint.sync()
except CheckpointWriteError as error:
    print(error)
"""


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failed_write_is_said_leaves_no_partial_files_and_keeps_the_last_good_checkpoint(tmp_path, mode):
    import subprocess
    import sys

    import keras

    from tests.processes import child_environment

    (tmp_path / "child.py").write_text(WRITE_FAILS)
    directory = tmp_path / "checkpoints"
    finished = subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), str(directory), mode],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=120,
    )
    said = finished.stdout.strip()
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert said.startswith(f"Writing a checkpoint to {directory} failed (") and "File too large" in said
    assert f"the newest complete checkpoint, {directory / 'ckpt-1'}, is kept" in said
    assert "Exception ignored" not in finished.stderr  # an asynchronous failure is not left for exit to print
    assert sorted(path.name for path in directory.iterdir()) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    assert TrainingCheckpoint(directory, model, steps_per_epoch=10).restore() == 1


def test_a_partial_write_of_a_killed_run_is_removed_when_a_run_starts(tmp_path, built):
    (tmp_path / "ckpt-7_temp").mkdir()
    (tmp_path / "ckpt-7_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"\0" * 10)
    TrainingCheckpoint(tmp_path, built.model, steps_per_epoch=STEPS_PER_EPOCH)
    assert not (tmp_path / "ckpt-7_temp").exists()
