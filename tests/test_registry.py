"""Names to recipes, and chains that order by stage and reject duplicates and clashes."""

import dataclasses
from typing import ClassVar

import pytest

from tfopt import registry
from tfopt.errors import RecipeClashError, RecipeConfigError
from tfopt.recipes import BatchSize, DataPipeline, Distribution, GradAccum, MixedPrecision, Xla, chain
from tfopt.recipes.base import Recipe, Stage


def test_builtin_names():
    assert {"data_pipeline", "mixed_precision", "xla"} <= set(registry.names())


def test_unknown_name_lists_known_and_closest():
    with pytest.raises(RecipeConfigError) as error:
        registry.get("mixed_precison")
    assert "Did you mean 'mixed_precision'?" in str(error.value)
    assert "data_pipeline" in str(error.value)


@pytest.mark.parametrize(
    "item, recipe",
    [
        ("xla", Xla()),
        ({"xla": None}, Xla()),
        ({"mixed_precision": {"policy": "mixed_bfloat16"}}, MixedPrecision(policy="mixed_bfloat16")),
    ],
)
def test_items(item, recipe):
    assert registry.from_item(item) == recipe


@pytest.mark.parametrize("item", [{"xla": 3}, {"a": {}, "b": {}}, 7])
def test_bad_items(item):
    with pytest.raises(RecipeConfigError):
        registry.from_item(item)


def test_chain_orders_by_stage_and_nests():
    combined = chain(Xla(), chain(MixedPrecision(), DataPipeline()))
    assert [recipe.name for recipe in combined.recipes] == ["data_pipeline", "mixed_precision", "xla"]


def test_batch_size_is_searched_after_numerics_and_compile_and_before_placement():
    # The search times the step mixed precision and XLA made; distribution multiplies the per-replica batch
    # it found; gradient accumulation is set from the final batch.
    combined = chain(
        GradAccum(steps=2), Distribution(), BatchSize(batch_size=16), Xla(), MixedPrecision(), DataPipeline()
    )
    assert [recipe.name for recipe in combined.recipes] == [
        "data_pipeline",
        "mixed_precision",
        "xla",
        "batch_size",
        "distribution",
        "grad_accum",
    ]


def test_chain_rejects_duplicates():
    with pytest.raises(RecipeClashError, match="appears twice") as error:
        chain(MixedPrecision(policy="mixed_float16"), MixedPrecision(policy="mixed_bfloat16"))
    assert error.value.recipes == ("mixed_precision", "mixed_precision")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoXla(Recipe):
    name: ClassVar[str] = "no_xla"
    stage: ClassVar[Stage] = Stage.COMPILE

    def clash(self, other):
        return "no_xla forbids XLA" if other.name == "xla" else None

    def __call__(self, plan):
        return plan


def test_chain_rejects_declared_clash_either_order():
    for recipes in [(NoXla(), Xla()), (Xla(), NoXla())]:
        with pytest.raises(RecipeClashError, match="no_xla forbids XLA") as error:
            chain(*recipes)
        assert error.value.recipes == tuple(recipe.name for recipe in recipes)


def test_chain_config_round_trip():
    combined = chain(MixedPrecision(policy="float32"), Xla(jit_compile=False))
    assert type(combined).from_config(combined.get_config()) == combined
