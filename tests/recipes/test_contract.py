"""The contract every registered recipe keeps: pure, config round trip, clear errors, trainable result.

Runs over the registry, so a new recipe is held to it as soon as it is registered. A recipe that needs
arguments to be constructed, or a setting to feed the bad-config check, says so in the tables below.
"""

import dataclasses

import keras
import numpy as np
import pytest

from tests.conftest import make_cnn, make_images
from tfopt import registry
from tfopt.builder import build
from tfopt.errors import RecipeConfigError
from tfopt.plan import make_plan

# A setting each recipe must reject, the words its message must contain, and the setting the error names
# (`TfoptError.setting`, which a recipe file points at).
BAD_SETTINGS = {
    "data_pipeline": ({"ram_budget_fraction": 2.0}, "ram_budget_fraction", "ram_budget_fraction"),
    "batch_size": ({"batch_size": 0}, "Expected 'auto' or a positive integer", "batch_size"),
    "distribution": ({"strategy": "gpu_farm"}, "is not valid", "strategy"),
    "grad_accum": ({"steps": 1}, "Expected an integer >= 2", "steps"),
    "mixed_precision": ({"policy": "fp16"}, "Expected one of", "policy"),
    "xla": ({"jit_compile": "yes"}, "Expected 'auto'", "jit_compile"),
    "data_service": ({"workers": 0}, "must be a whole number of at least 1", "workers"),
    "fused_layers": ({"conv_bias": "yes"}, "Expected 'auto', true or false", "conv_bias"),
    "steps_per_execution": ({"steps": 0}, "Expected 'auto' or a whole number", "steps"),
}


def all_recipe_names():
    return registry.names()


@pytest.fixture
def baseline(cpu_hardware):
    return make_plan(make_cnn(), make_images(), hardware=cpu_hardware)


@pytest.mark.parametrize("name", all_recipe_names())
def test_config_round_trips(name):
    recipe = registry.get(name)()
    config = recipe.get_config()
    assert type(recipe)(**config) == recipe
    assert registry.from_item({name: config}) == recipe


@pytest.mark.parametrize("name", all_recipe_names())
def test_recipe_is_pure(name, baseline):
    builds = []
    counting = baseline.replace(model_fn=lambda: builds.append(1) or baseline.model_fn())
    recipe = registry.get(name)().measured(counting)  # where a recipe leaves a choice to trials, they run here
    builds.clear()
    before = {f.name: getattr(counting, f.name) for f in dataclasses.fields(counting)}
    result = recipe(counting)
    after = {f.name: getattr(counting, f.name) for f in dataclasses.fields(counting)}
    assert after == before, "the recipe changed the plan it was given"
    assert builds == [], "the recipe built a model: building is build()'s, trials are measured()'s"
    assert result is not counting
    assert len(result.applied) == len(counting.applied) + 1
    assert result.applied[-1].recipe == name


@pytest.mark.parametrize("name", all_recipe_names())
def test_bad_setting_raises_clear_error(name):
    assert name in BAD_SETTINGS, f"add a bad setting for the new recipe {name!r} to BAD_SETTINGS"
    settings, words, setting = BAD_SETTINGS[name]
    with pytest.raises(RecipeConfigError) as error:
        registry.from_item({name: settings})
    assert name in str(error.value) and words in str(error.value)
    assert error.value.setting == setting


@pytest.mark.parametrize("name", all_recipe_names())
def test_unknown_setting_names_the_closest(name):
    field = dataclasses.fields(registry.get(name))[0].name
    with pytest.raises(RecipeConfigError, match=f"Did you mean '{field}'"):
        registry.from_item({name: {field + "x": 1}})


class StepCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1


@pytest.mark.parametrize("name", all_recipe_names())
def test_two_training_steps_after_recipe(name, baseline):
    plan = registry.get(name)().measured(baseline)(baseline)
    built = build(plan)
    counter = StepCounter()
    try:
        history = built.model.fit(built.dataset.repeat(), steps_per_epoch=2, epochs=1, verbose=0, callbacks=[counter])
    finally:
        built.close()  # what the build started for the data (data_service's worker process)
    assert counter.steps == 2
    assert np.isfinite(history.history["loss"][0])
