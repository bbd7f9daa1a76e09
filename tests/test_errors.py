"""tfopt's errors: the setting an error is about, the recipes a clash names, and pickling that keeps both."""

import pickle

import pytest

from tfopt.errors import DataError, NonFiniteLossError, RecipeClashError, RecipeConfigError, TfoptError


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
