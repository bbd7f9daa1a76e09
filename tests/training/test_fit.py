import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.training.conftest import STEPS_PER_EPOCH, make_built
from tfopt.errors import DataError, NonFiniteLossError
from tfopt.training.checkpointing import TrainingCheckpoint
from tfopt.training.fit import train

REPO = Path(__file__).resolve().parents[2]


class Crash(Exception):
    """Stands in for a crash mid-run (the SIGKILL test below does it for real, in a subprocess)."""


class CrashAt(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise Crash


def weights(built):
    return [w.numpy() for w in built.model.weights]


# Crash at step 15; checkpoints every 4 steps and at epoch ends: the newest is at 12 (10 per epoch) or 14 (7).
@pytest.mark.parametrize(
    "steps_per_epoch, newest_checkpoint", [(None, 12), (7, 14)], ids=["one_pass_per_epoch", "stream"]
)
def test_crash_and_resume_equals_uninterrupted_run(tmp_path, steps_per_epoch, newest_checkpoint):
    epochs = 3
    reference = make_built()
    uninterrupted = train(reference, epochs=epochs, steps_per_epoch=steps_per_epoch)
    steps = epochs * (steps_per_epoch or STEPS_PER_EPOCH)
    assert uninterrupted.global_step == steps and uninterrupted.last_checkpoint is None

    first = make_built()
    with pytest.raises(Crash):
        train(
            first,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            checkpoint_dir=tmp_path,
            checkpoint_every_steps=4,
            callbacks=[CrashAt(15)],
        )
    resumed = train(
        make_built(seed=5),
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        checkpoint_dir=tmp_path,
        checkpoint_every_steps=4,
    )

    assert resumed.resumed_from_step == newest_checkpoint
    assert resumed.steps_run == steps - newest_checkpoint and resumed.global_step == steps
    assert len(resumed.history["loss"]) == epochs - newest_checkpoint // (steps_per_epoch or STEPS_PER_EPOCH)
    assert int(resumed_model_iterations(tmp_path)) == steps
    # Same data, same order, same optimizer state: the resumed run ends where the uninterrupted one does.
    for expected, actual in zip(weights(reference), resumed_weights(tmp_path), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_a_run_resumed_mid_epoch_writes_the_moving_average_into_the_weights_once_at_its_end(tmp_path):
    """Keras ends every fit by writing an EMA optimizer's average into the weights: the resumed run's fit for the
    rest of its epoch must not, or the run goes on from the average (it did, ending 1e-2 away)."""
    ema = {"class_name": "Adam", "config": {"learning_rate": 0.01, "use_ema": True, "ema_momentum": 0.5}}
    reference = make_built(optimizer=ema)
    train(reference, epochs=2)
    with pytest.raises(Crash):
        train(
            make_built(optimizer=ema),
            epochs=2,
            checkpoint_dir=tmp_path,
            checkpoint_every_steps=3,
            callbacks=[CrashAt(7)],
            async_checkpoint=False,
        )
    resumed = make_built(seed=5, optimizer=ema)
    assert train(resumed, epochs=2, checkpoint_dir=tmp_path, checkpoint_every_steps=3).resumed_from_step == 6
    # Resumed once more, the finished run trains nothing and still ends with the average in the weights.
    finished = make_built(seed=6, optimizer=ema)
    assert train(finished, epochs=2, checkpoint_dir=tmp_path).steps_run == 0
    for built in (resumed, finished):
        for expected, actual in zip(weights(reference), weights(built), strict=True):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


class InterruptAt(CrashAt):
    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise KeyboardInterrupt  # what Ctrl-C or a scheduler's SIGTERM raises between two steps


def test_an_interrupted_run_names_the_checkpoint_it_wrote(tmp_path, caplog):
    """Checkpoints are written asynchronously: the message once named the one before, or None."""
    with caplog.at_level("INFO", logger="tfopt"), pytest.raises(KeyboardInterrupt):
        train(make_built(), epochs=3, checkpoint_dir=tmp_path, checkpoint_every_steps=4, callbacks=[InterruptAt(7)])
    (said,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("Interrupted")]
    newest = tf.train.latest_checkpoint(str(tmp_path))
    assert (
        newest is not None
        and newest.endswith("-7")
        and said == f"Interrupted: the steps trained so far are in {newest}."
    )


# (steps_per_epoch, the model's steps per call, calls up to the crash, the newest checkpoint then): one pass of
# 10 steps an epoch trains at 5 per call for 4 (calls end at steps 5, 10, 15, 20) and at 2 for 3, whose resumed
# rest of epoch 2 (8 steps) trains at 4; a stream of 8 steps an epoch at 4.
@pytest.mark.parametrize(
    "steps_per_epoch, per_call, calls, newest_checkpoint",
    [(None, 4, 4, 15), (None, 3, 7, 12), (8, 4, 5, 16)],
    ids=["one_pass_at_4", "one_pass_at_3", "stream_at_4"],
)
def test_at_several_steps_per_call_a_resumed_run_ends_where_one_step_per_call_does(
    tmp_path, steps_per_epoch, per_call, calls, newest_checkpoint
):
    """Keras calls back once per call. Given steps_per_epoch it runs whole calls (10 steps an epoch at 4 per
    call would train 12), and it numbers a call cut short by the data's end as if it were whole: so each epoch,
    and the rest of a resumed one, trains at the divisor of its steps nearest to the model's number.
    Checkpoints are written at the end of a call that crossed an interval of 4 steps, each named by the updates
    it holds (the crash at the end of a call, before its checkpoint, leaves the one before), and training
    resumes from there to the weights of an uninterrupted run at one step per call."""

    def at_several_per_call(seed=0):
        built = make_built(seed=seed)
        built.model.steps_per_execution = per_call
        return built

    epochs = 3
    reference = make_built()
    train(reference, epochs=epochs, steps_per_epoch=steps_per_epoch)
    every = dict(epochs=epochs, steps_per_epoch=steps_per_epoch, checkpoint_dir=tmp_path, checkpoint_every_steps=4)
    crashed = at_several_per_call()
    with pytest.raises(Crash):
        train(crashed, callbacks=[CrashAt(calls)], **every)
    assert crashed.model.steps_per_execution == per_call  # as it was, after training at another number
    assert_checkpoints_named_by_their_updates(tmp_path)
    resumed = train(at_several_per_call(seed=5), **every)
    assert resumed.resumed_from_step == newest_checkpoint
    assert resumed.global_step == epochs * (steps_per_epoch or STEPS_PER_EPOCH)
    assert_checkpoints_named_by_their_updates(tmp_path)
    assert int(resumed_model_iterations(tmp_path)) == resumed.global_step
    for expected, actual in zip(weights(reference), resumed_weights(tmp_path), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def assert_checkpoints_named_by_their_updates(directory):
    """Every checkpoint kept is named by the step it says it is at, and its optimizer made that many updates."""
    import tensorflow as tf

    for index in Path(directory).glob("ckpt-*.index"):
        path = str(index.with_suffix(""))
        reader = tf.train.load_checkpoint(path)
        step = int(path.rsplit("-", 1)[1])
        assert int(reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE")) == step
        assert int(reader.get_tensor("optimizer_variables/0/.ATTRIBUTES/VARIABLE_VALUE")) == step, path


def resumed_model_iterations(directory):
    built = make_built(seed=9)
    TrainingCheckpoint(directory, built.model, steps_per_epoch=built_steps(directory)).restore()
    return built.model.optimizer.iterations.numpy()


def resumed_weights(directory):
    built = make_built(seed=9)
    TrainingCheckpoint(directory, built.model, steps_per_epoch=built_steps(directory)).restore()
    return weights(built)


def built_steps(directory):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(directory))
    return int(reader.get_tensor("steps_per_epoch/.ATTRIBUTES/VARIABLE_VALUE"))


def test_one_pass_per_epoch_reads_all_epochs_from_one_iterator_and_trains_as_keras_does():
    built, reference = make_built(), make_built()
    calls = []
    fit = built.model.fit

    def recording_fit(**kwargs):
        calls.append(kwargs)
        return fit(**kwargs)

    built.model.fit = recording_fit
    result = train(built, epochs=3)

    # One fit call over the repeated dataset: one iterator, where Keras makes one per epoch.
    assert len(calls) == 1 and calls[0]["steps_per_epoch"] == STEPS_PER_EPOCH and calls[0]["epochs"] == 3
    assert int(calls[0]["x"].cardinality()) == -1  # tf.data.INFINITE_CARDINALITY
    assert result.global_step == 3 * STEPS_PER_EPOCH and len(result.history["loss"]) == 3
    # Each epoch is one whole pass in order: the same weights as Keras' own epochs over the finite dataset.
    reference.model.fit(reference.dataset, epochs=3, verbose=0, shuffle=False)
    for ours, keras_own in zip(weights(built), weights(reference)):
        np.testing.assert_array_equal(ours, keras_own)


def test_finished_run_started_again_trains_nothing(tmp_path):
    train(make_built(), epochs=2, checkpoint_dir=tmp_path)
    again = train(make_built(), epochs=2, checkpoint_dir=tmp_path)
    assert (again.resumed_from_step, again.steps_run, again.history) == (2 * STEPS_PER_EPOCH, 0, {})
    more = train(make_built(), epochs=3, checkpoint_dir=tmp_path)
    assert (more.steps_run, more.global_step, len(more.history["loss"])) == (STEPS_PER_EPOCH, 30, 1)


def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path):
    poisoned = make_built(poison_batch=6)  # global step 7 sees NaN inputs
    with pytest.raises(NonFiniteLossError) as error:
        train(poisoned, epochs=2, checkpoint_dir=tmp_path, checkpoint_every_steps=2)
    message = str(error.value)
    assert "Training stopped at step 7: the loss is nan" in message
    assert error.value.step == 7
    assert error.value.last_good_checkpoint.endswith("ckpt-6") and "ckpt-6" in message
    assert not list(tmp_path.glob("ckpt-7*")) and not list(tmp_path.glob("ckpt-8*"))
    fresh = make_built(seed=3)
    assert TrainingCheckpoint(tmp_path, fresh.model, steps_per_epoch=STEPS_PER_EPOCH).restore() == 6
    assert all(np.isfinite(w).all() for w in weights(fresh))


def test_nan_without_checkpoints_still_stops():
    with pytest.raises(NonFiniteLossError, match="step 3: the loss is nan"):
        train(make_built(poison_batch=2), epochs=1)


def test_unknown_length_is_counted(built):
    import dataclasses

    filtered = dataclasses.replace(built, dataset=built.dataset.filter(lambda x, y: True))
    assert train(filtered, epochs=1).steps_per_epoch == STEPS_PER_EPOCH


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"epochs": 0}, "epochs must be a positive integer; received 0"),
        ({"epochs": 1, "steps_per_epoch": 0}, "steps_per_epoch must be a positive integer or None"),
        ({"epochs": 1, "checkpoint_every_steps": 0}, "checkpoint_every_steps must be a positive integer"),
    ],
)
def test_bad_arguments(built, kwargs, words):
    with pytest.raises(DataError, match=words):
        train(built, **kwargs)


def test_infinite_dataset_needs_steps_per_epoch(built):
    import dataclasses

    endless = dataclasses.replace(built, dataset=built.dataset.repeat())
    with pytest.raises(DataError, match="Pass steps_per_epoch"):
        train(endless, epochs=1)


CHILD = textwrap.dedent("""
    import os, signal, sys
    import keras
    sys.path.insert(0, {repo!r})
    from tests.training.conftest import make_built
    from tfopt.training.fit import train

    kill_at = int(sys.argv[2])

    class KillAt(keras.callbacks.Callback):
        seen = 0
        def on_train_batch_end(self, batch, logs=None):
            KillAt.seen += 1
            if KillAt.seen == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    result = train(make_built(), epochs=3, checkpoint_dir=sys.argv[1], checkpoint_every_steps=5,
                   callbacks=[KillAt()])
    print("RESULT", result.resumed_from_step, result.steps_run, result.global_step, len(result.history["loss"]))
""")


@pytest.mark.slow
def test_sigkill_mid_epoch_then_restart_finishes_all_steps(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(REPO)))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    directory = tmp_path / "ckpt"
    killed = subprocess.run(
        [sys.executable, str(script), str(directory), "17"], capture_output=True, text=True, env=env, timeout=300
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    restarted = subprocess.run(
        [sys.executable, str(script), str(directory), "0"], capture_output=True, text=True, env=env, timeout=300
    )
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    resumed_from, steps_run, global_step, epochs_logged = map(int, restarted.stdout.split("RESULT")[1].split())
    # Killed at step 17 of epoch 2 (of 3); checkpoints every 5 steps and at epoch ends (10): at most
    # the steps since the newest complete checkpoint are trained again.
    assert resumed_from in (10, 15)
    assert global_step == 3 * STEPS_PER_EPOCH == resumed_from + steps_run
    assert epochs_logged == 2  # the rest of epoch 2, then epoch 3: no epoch lost, none repeated


def _classifier_built(nan_weights=False, nan_feature=False):
    """Three classes, cross-entropy on softmax outputs, after a layer that masks NaN activations as 0 (as
    scripts do for missing values): the loss stays finite while NaN gradients reach the first layer."""
    import tensorflow as tf

    from tfopt.builder import Built
    from tfopt.hardware import Hardware
    from tfopt.plan import make_plan

    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")
    if nan_feature:
        x[:, 1] = np.nan
    y = np.arange(40) % 3
    nan_to_zero = keras.layers.Lambda(lambda t: keras.ops.where(keras.ops.isnan(t), 0.0, t), name="nan_to_zero")
    model = keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(8, name="hidden"),
            nan_to_zero,
            keras.layers.Dense(3, activation="softmax", name="probabilities"),
        ]
    )
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    if nan_weights:
        model.layers[0].kernel.assign(np.full((3, 8), np.nan, "float32"))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    return Built(
        model=model,
        dataset=dataset,
        strategy=tf.distribute.get_strategy(),
        plan=make_plan(model, dataset, hardware=Hardware()),
    )


def test_nan_weights_stop_training_before_the_first_step_without_a_checkpoint_dir():
    built = _classifier_built(nan_weights=True)
    with pytest.raises(
        NonFiniteLossError,
        match=r"did not start: the model's weights hold NaN or Inf before the "
        r"first step \(sequential\w*/hidden/kernel\)",
    ) as error:
        train(built, epochs=2)
    assert error.value.step == 0 and int(built.model.optimizer.iterations) == 0


def test_a_nan_feature_that_keeps_the_loss_finite_stops_training_at_the_epoch_end():
    built = _classifier_built(nan_feature=True)
    losses = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: losses.append(logs["loss"]))
    with pytest.raises(
        NonFiniteLossError,
        match=r"step 10: the model's weights hold NaN or Inf "
        r"\(sequential\w*/hidden/kernel\), though the loss",
    ):
        train(built, epochs=3, callbacks=[record])
    assert len(losses) == 10 and all(np.isfinite(losses))  # the loss alone never said a word
