"""Tests of tfopt.models: the built-in models train, stay float32 at the output, and names resolve."""

from __future__ import annotations

import textwrap

import keras
import numpy as np
import pytest

from tfopt.models import MODELS, application_names, resolve_model, small_cnn, text_transformer


def _train_two_steps(model, x, y):
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=4, epochs=1, steps_per_epoch=2, verbose=0)
    return history.history["loss"][-1]


def test_small_cnn_trains_and_outputs_probabilities():
    keras.utils.set_random_seed(0)
    model = small_cnn(input_shape=[16, 16, 3], classes=3, filters=[4, 8])
    x = np.random.default_rng(0).random((8, 16, 16, 3), dtype=np.float32)
    y = np.array([0, 1, 2, 0, 1, 2, 0, 1], dtype=np.int32)
    assert np.isfinite(_train_two_steps(model, x, y))
    probabilities = model.predict(x, verbose=0)
    assert probabilities.shape == (8, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def test_text_transformer_trains_on_token_ids():
    keras.utils.set_random_seed(0)
    model = text_transformer(
        sequence_length=12, vocab_size=30, classes=2, embed_dim=8, num_heads=2, ff_dim=16, num_layers=1
    )
    x = np.random.default_rng(0).integers(0, 30, size=(8, 12)).astype(np.int32)
    y = np.array([0, 1] * 4, dtype=np.int32)
    assert np.isfinite(_train_two_steps(model, x, y))
    assert model.predict(x, verbose=0).shape == (8, 2)


@pytest.mark.parametrize(
    "builder, kwargs",
    [
        (small_cnn, dict(input_shape=[16, 16, 3], classes=3, filters=[4])),
        (text_transformer, dict(sequence_length=8, vocab_size=20, embed_dim=8, ff_dim=8, num_layers=1)),
    ],
)
def test_outputs_stay_float32_under_mixed_float16(builder, kwargs):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = builder(**kwargs)
    finally:
        keras.config.set_dtype_policy(previous)
    hidden_dtypes = {layer.compute_dtype for layer in model.layers if layer.name.startswith(("conv", "ff_in"))}
    assert hidden_dtypes == {"float16"}
    assert model.output.dtype == "float32"


def test_text_transformer_can_be_cloned_from_its_config():
    # tfopt's build step clones functional models; the custom embedding layer must survive that.
    model = text_transformer(sequence_length=8, vocab_size=20, embed_dim=8, ff_dim=8, num_layers=1)
    clone = keras.models.clone_model(model)
    assert clone.count_params() == model.count_params()
    assert clone.get_layer("embedding").get_config()["vocab_size"] == 20


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: small_cnn(input_shape=[16, 16]), "input_shape: expected a list of 3 positive integers"),
        (lambda: small_cnn(classes=0), "classes: expected a positive integer; received 0"),
        (lambda: small_cnn(dropout=1.5), "dropout: expected a rate in [0, 1); received 1.5"),
        (lambda: text_transformer(embed_dim=10, num_heads=4), "embed_dim=10 is not a multiple of num_heads=4"),
        (lambda: text_transformer(num_layers=True), "num_layers: expected a positive integer; received True"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_the_argument(call, message):
    with pytest.raises(ValueError) as error:
        call()
    assert message in str(error.value)


def test_resolve_model_finds_builtins_and_keras_applications():
    assert resolve_model("small_cnn") is MODELS["small_cnn"]
    assert resolve_model("ResNet50") is keras.applications.ResNet50
    assert {"ResNet50", "MobileNetV2", "EfficientNetB0"} <= set(application_names())


def test_resolve_model_imports_from_the_search_paths(tmp_path):
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        def build(units=3):
            return units
    """)
    )
    builder = resolve_model("my_models:build", search_paths=[tmp_path])
    assert builder(units=5) == 5


@pytest.mark.parametrize(
    "name, message",
    [
        ("ResNet5", "Did you mean 'ResNet50'?"),
        ("resnet50", "Did you mean 'ResNet50'?"),
        ("small_cn", "Did you mean 'small_cnn'?"),
        ("no_such_module_xyz:build", "Cannot import module 'no_such_module_xyz'"),
        (
            "tfopt.models:small_cnx",
            "has no attribute 'small_cnx' (model 'tfopt.models:small_cnx'). Did you mean 'small_cnn'?",
        ),
        ("tfopt.models:MODELS", "names a dict, not a function"),
        ("os.path:join", "names Python's standard library module 'os.path', which builds no model"),
        ("bad path:x", "is not an import path"),
        ("", "must be a non-empty string"),
    ],
)
def test_resolve_model_errors_name_the_closest_valid_name(name, message):
    with pytest.raises(ValueError) as error:
        resolve_model(name)
    assert message in str(error.value)


def test_resolve_model_reports_what_an_imported_module_raised(tmp_path):
    (tmp_path / "broken_models.py").write_text("raise RuntimeError('no GPU driver here')\n")
    with pytest.raises(ValueError) as error:
        resolve_model("broken_models:build", search_paths=[tmp_path])
    assert "raised RuntimeError: no GPU driver here" in str(error.value)
