"""Recipes that meet in one chain, as a user lists them: each pair where one recipe changes what the other
works on is applied together, and both do their job, neither undoing nor refusing the other."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt


def _augment(features, label):
    return features * 2.0, label


def _classifier():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


FEATURES = np.random.default_rng(0).random((256, 8)).astype("float32")
DATA = tf.data.Dataset.from_tensor_slices((FEATURES, np.arange(256) % 3)).map(_augment).batch(16)


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipes, said",
    [
        (
            # The resized batch, not the user's, decides XLA's partial batch (256 = 10 x 24 + 16), which this
            # unshuffled pipeline keeps (dropped, the same 16 would never train).
            [{"batch_size": {"batch_size": 24}}, {"xla": {"jit_compile": True}}],
            {"batch_size": "batch 16 -> 24", "xla": "partial batch of 16 examples that ends each pass is kept"},
        ),
        (
            # The service reads the distributed pipeline back in the global batches the strategy splits.
            [{"distribution": {"strategy": "mirrored"}}, {"data_service": {"workers": 1}}],
            {"distribution": "mirrored with 1 replica(s)", "data_service": "offloaded to 1 tf.data service worker"},
        ),
        (
            # The finder searches up to half the effective batch, so each update still accumulates two or more.
            [
                {"batch_size": {"batch_size": "auto", "max_batch_size": 64}},
                {"grad_accum": {"effective_batch_size": 64}},
            ],
            {"batch_size": "fastest of", "grad_accum": "each update stands for a batch of 64"},
        ),
        (
            # tfopt's own cache would be filled anew every epoch on the service's workers: none is added.
            ["data_pipeline", {"data_service": {"workers": 1}}],
            {"data_pipeline": "no cache: data_service serves this pipeline", "data_service": "offloaded to 1"},
        ),
    ],
    ids=["batch_size+xla", "distribution+data_service", "batch_size_auto+grad_accum", "data_pipeline+data_service"],
)
def test_recipes_that_change_each_others_input_both_apply(recipes, said, cpu_hardware):
    with tfopt.apply(_classifier(), DATA, recipes, hardware=cpu_hardware, measure_speed=False) as result:
        steps = {step.recipe: step for step in result.plan.applied if step.recipe in said}
        assert sorted(steps) == sorted(said)
        for recipe, words in said.items():
            # A search whose fastest trial is the user's own batch keeps it, as a skipped step (timing noise decides).
            kept_own_batch = steps[recipe].detail.startswith("kept batch")
            assert (kept_own_batch or not steps[recipe].skipped) and words in steps[recipe].detail, steps[recipe]
        assert sum(1 for _ in result.dataset) > 0


def test_a_default_pipeline_recipe_adapted_to_the_service_is_still_verified_by_timing():
    """`apply` keeps a recipe left at its defaults only where it measurably helps: adapted to the service,
    the pipeline recipe is still the user's default one, and so still judged."""
    from tfopt.optimize import _left_to_tfopt, resolve_recipes

    chain = resolve_recipes(["data_pipeline", {"data_service": {"workers": 1}}])
    assert type(chain.recipes[0]).__name__ == "ServedDataPipeline"
    assert "data_pipeline" in _left_to_tfopt(chain)


def _no_search(*args, **kwargs):
    raise AssertionError("a chain's check ran the batch-size search, which only applying the chain may run")


def test_a_check_sees_the_batch_the_recipes_before_it_give(cpu_hardware, monkeypatch):
    """grad_accum's effective batch must be a multiple of the batch after batch_size changed it: checked up front
    on that batch, not the user's; a searched batch, which only the search finds, is checked once it ran."""
    from tfopt.errors import RecipeConfigError
    from tfopt.optimize import resolve_recipes
    from tfopt.plan import make_plan
    from tfopt.recipes import batch_size

    monkeypatch.setattr(batch_size, "find_batch_size", _no_search)
    by_16, by_32 = (make_plan(_classifier(), DATA.rebatch(size), hardware=cpu_hardware) for size in (16, 32))
    searched = {"batch_size": "auto", "max_batch_size": 16}
    for plan, resized, effective in ((by_16, 8, 16), (by_32, 16, 48), (by_16, searched, 16)):
        resized = resized if isinstance(resized, dict) else {"batch_size": resized}
        resolve_recipes([{"batch_size": resized}, {"grad_accum": {"effective_batch_size": effective}}]).check(plan)
    with pytest.raises(RecipeConfigError, match=r"effective_batch_size=12 is not a multiple .* of the batch size 8"):
        resolve_recipes([{"batch_size": {"batch_size": 8}}, {"grad_accum": {"effective_batch_size": 12}}]).check(by_16)
    summed = _classifier()  # wrong whatever batch the search finds: refused before it runs
    summed.compile("adam", keras.losses.SparseCategoricalCrossentropy(reduction="sum"))
    with pytest.raises(RecipeConfigError, match="reduction='sum'"):
        resolve_recipes([{"batch_size": searched}, {"grad_accum": {"steps": 2}}]).check(
            make_plan(summed, DATA.rebatch(16), hardware=cpu_hardware)
        )


def test_an_effective_batch_twice_the_resized_batch_accumulates_two_of_them(cpu_hardware):
    recipes = [{"batch_size": {"batch_size": 8}}, {"grad_accum": {"effective_batch_size": 16}}]
    with tfopt.apply(_classifier(), DATA, recipes, hardware=cpu_hardware, measure_speed=False) as result:
        (step,) = [step for step in result.plan.applied if step.recipe == "grad_accum"]
        assert step.detail.startswith("accumulates 2 micro-batches of 8: each update stands for a batch of 16")
        assert result.model.optimizer.gradient_accumulation_steps == 2


def test_chain_refuses_a_name_where_it_takes_recipe_objects():
    from tfopt.errors import RecipeConfigError

    with pytest.raises(RecipeConfigError, match=r"chain takes recipe objects .*not a str \('xla'\).*tfopt.apply"):
        tfopt.chain("xla")
