"""tfopt's errors: the setting an error is about, the recipes a clash names, and pickling that keeps both."""

import pickle

import numpy as np
import pytest
import tensorflow as tf

from tfopt.errors import (
    DataError,
    NonFiniteLossError,
    RecipeClashError,
    RecipeConfigError,
    TfoptError,
    describe_error,
)


def test_setting_is_a_keyword_that_leaves_the_message_alone():
    error = RecipeConfigError("xla: jit_compile='yes' is not valid.", setting="jit_compile")
    assert error.setting == "jit_compile"
    assert error.args == ("xla: jit_compile='yes' is not valid.",)
    assert str(error) == "xla: jit_compile='yes' is not valid."
    assert TfoptError("no single setting").setting is None
    assert isinstance(error, ValueError)


@pytest.mark.parametrize(
    "error",
    [
        RecipeConfigError("mixed_precision: policy='fp16' is not a policy.", setting="policy"),
        DataError("synthetic: examples=0 is not a positive integer.", setting="examples"),
        RecipeClashError("The recipe 'xla' appears twice.", recipes=("xla", "xla")),
        NonFiniteLossError("Training stopped at step 3: the loss is nan.", step=3, last_good_checkpoint="ckpt-2"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_pickling_keeps_type_message_and_attributes(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error) and again.args == error.args
    assert vars(again) == vars(error)


def _raised_by(run):
    try:
        run()
    except Exception as error:  # noqa: BLE001 - the error under test
        return error
    raise AssertionError("nothing was raised")


def _fit(dataset):
    import keras

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(dataset.map(lambda value: (tf.reshape(value, [1]), value)).batch(2), epochs=1, verbose=0)


def _missing_label(index):
    if int(index) >= 3:
        raise KeyError("label 'zebra' missing from labels.csv")
    return np.float32(index)


def _generator():
    yield np.float32(1.0)
    raise ValueError("row 2 of data.csv has 3 columns, expected 4")


def _checked(index):
    tf.debugging.assert_less(index, tf.constant(2, tf.int64), message="id out of range")
    return tf.cast(index, tf.float32)


@pytest.mark.parametrize(
    ("dataset", "expected"),
    [
        (
            lambda: tf.data.Dataset.range(8).map(
                lambda index: tf.ensure_shape(tf.py_function(_missing_label, [index], tf.float32), [])
            ),
            "KeyError: \"label 'zebra' missing from labels.csv\" (raised by your code in _missing_label, "
            f"{__file__}, line ",
        ),
        (
            lambda: tf.data.Dataset.from_generator(_generator, output_signature=tf.TensorSpec((), tf.float32)),
            f"ValueError: row 2 of data.csv has 3 columns, expected 4 (raised by your code in _generator, {__file__}",
        ),
        (
            lambda: tf.data.Dataset.range(8).map(_checked),
            "InvalidArgumentError: assertion failed: [id out of range] [Condition x < y did not hold",
        ),
        (
            lambda: tf.data.Dataset.from_tensor_slices(["/nonexistent/image.png"]).map(
                lambda path: tf.strings.to_number(tf.io.read_file(path))
            ),
            "NotFoundError: /nonexistent/image.png; No such file or directory",
        ),
    ],
    ids=["py_function", "from_generator", "assert_in_map", "missing_file"],
)
def test_an_error_inside_a_pipeline_is_said_as_the_users_code_raised_it(dataset, expected):
    error = _raised_by(lambda: _fit(dataset()))
    said = describe_error(error)
    assert said.startswith(expected), said
    assert "{{" not in said and "Traceback" not in said and "Graph execution error" not in said


APPLY_SCRIPT = """
import keras, numpy as np, tensorflow as tf, tfopt

def lookup(index):
    if int(index) >= 12:
        raise KeyError("label 'zebra' missing from labels.csv")
    return np.float32(index)

data = tf.data.Dataset.range(400).map(lambda i: tf.ensure_shape(tf.py_function(lookup, [i], tf.float32), []))
data = data.map(lambda v: (tf.fill([4], v), tf.cast(v, tf.int32) % 2)).batch(4)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
model.compile("adam", "sparse_categorical_crossentropy")
try:
    tfopt.apply(model, data, recipes=[], steps=10, warmup_steps=2)
except tfopt.TfoptError as error:
    print(error)
"""


def test_a_failing_pipeline_in_apply_is_said_in_words_and_the_process_ends(tmp_path):
    """The py_function fails at the fourth batch, while the steps are timed: the user reads their exception and
    where it came from, and the script ends (the failed iterator, still running the py_function, once kept
    the interpreter from exiting)."""
    import subprocess
    import sys

    from tests.processes import child_environment

    (tmp_path / "script.py").write_text(APPLY_SCRIPT)
    finished = subprocess.run(
        [sys.executable, str(tmp_path / "script.py")],
        capture_output=True,
        text=True,
        env=child_environment(),
        timeout=120,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    said = finished.stdout.strip()
    assert said.startswith("Training failed while timing steps: KeyError: \"label 'zebra' missing from labels.csv\"")
    assert f"(raised by your code in lookup, {tmp_path / 'script.py'}, line 6:" in said
    assert "{{" not in said and "Traceback" not in said
