import keras
import numpy as np
import pytest

from tfopt.errors import NonFiniteLossError, TfoptError
from tfopt.training.guards import check_finite_loss, loss_scale_state, non_finite_weights


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_loss_raises_with_step(loss):
    with pytest.raises(NonFiniteLossError, match=f"step 7: the loss is {loss}") as error:
        check_finite_loss(np.float32(loss), step=7)
    assert error.value.step == 7
    assert isinstance(error.value, TfoptError) and isinstance(error.value, FloatingPointError)


def test_finite_loss_passes():
    assert check_finite_loss(np.float32(3.5), step=1) is None


def test_message_names_the_loss_scale_under_float16():
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(), initial_scale=1024.0)
    with pytest.raises(NonFiniteLossError, match="float16 loss scale is 1024 \\(started at 1024\\)"):
        check_finite_loss(float("nan"), step=1, optimizer=optimizer)
    assert loss_scale_state(keras.optimizers.Adam()) is None


def test_non_finite_weights_names_the_variable_holding_one_nan_or_inf():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, name="first"), keras.layers.Dense(1)])
    assert non_finite_weights(model) == []
    kernel = model.layers[0].kernel
    kernel.assign(np.where(np.eye(2, 3) == 1, np.nan, kernel.numpy()))
    model.layers[1].bias.assign([np.inf])
    assert non_finite_weights(model) == [kernel.path, model.layers[1].bias.path]
    assert kernel.path.endswith("first/kernel")


def test_with_checkpoint_names_the_path():
    error = NonFiniteLossError("Training stopped at step 3: the loss is nan.", step=3)
    assert "ckpt-2" in str(error.with_checkpoint("run/ckpt-2"))
    assert error.with_checkpoint("run/ckpt-2").last_good_checkpoint == "run/ckpt-2"
    assert "No checkpoint had been written" in str(error.with_checkpoint(None))
