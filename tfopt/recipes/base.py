"""The Recipe unit and `chain`, which composes recipes into one.

A recipe is a tiny object with one job (optax's GradientTransformation is the model): its constructor's
keyword arguments are its whole config, `check()` rejects a plan it cannot serve before anything is
built, and `__call__` returns a new Plan without side effects. `chain(*recipes)` is itself a recipe,
so chains nest.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, ClassVar

from tfopt import registry
from tfopt.errors import RecipeClashError, RecipeConfigError
from tfopt.plan import Plan


class Stage(enum.IntEnum):
    """Build order: the data feeds the model, the dtype decides how layers are made, and the compile-time
    step settings (XLA) decide what a batch costs. Only then is the batch sized by timing that step (a
    float32 step without XLA would be the wrong step to time); placement multiplies the per-replica batch
    over the replicas, and the update (gradient accumulation) is set from the final batch.

    Example:
        >>> Stage.NUMERICS < Stage.COMPILE < Stage.BATCH
        True
    """

    DATA = 0
    NUMERICS = 1
    COMPILE = 2
    BATCH = 3
    PLACEMENT = 4
    UPDATE = 5


class Recipe(abc.ABC):
    """Base class of every recipe.

    Subclasses are keyword-only frozen dataclasses, so the constructor is the schema and
    `get_config()` round-trips: `type(r)(**r.get_config()) == r`.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True, kw_only=True)
        ... class Note(Recipe):
        ...     name = "note"
        ...     stage = Stage.DATA
        ...     text: str = "checked"
        ...     def __call__(self, plan):
        ...         return plan.record(self.name, self.text)
        >>> Note(text="why").get_config()
        {'text': 'why'}
    """

    name: ClassVar[str]
    stage: ClassVar[Stage]

    def check(self, plan: Plan) -> None:  # noqa: B027 - optional: most recipes fit every plan
        """Raises a tfopt error if this recipe cannot be applied to `plan`. Has no side effects."""

    def check_for_source(self) -> None:  # noqa: B027 - optional: most recipes fit every data
        """Raises a tfopt error for a setting that cannot apply to a `tfopt.data` source's pipeline: a recipe
        file's data is always one, so its check says so at the setting's line before anything runs."""

    def check_before_trials(self, plan: Plan) -> None:
        """What `check` raises whatever batch the trials of a recipe before this one pick (a batch-size search,
        which runs when the chain is applied): `Chain.check` asks this where that batch is not known yet, so that
        a setting wrong anyway fails before the trials. All of `check` by default; a check reading the batch
        overrides it."""
        self.check(plan)

    def planned(self, plan: Plan) -> Plan | None:
        """The plan this recipe hands on, as far as the checks of the recipes after it read it (the batch, the
        strategy, the compile settings), for `Chain.check`; None where that is known only once its trials ran.

        Most recipes change a few settings, so this applies the recipe. Recipes of the DATA stage change the
        pipeline only (a graph rewrite, a tf.data service that may be asked over the network), which no check
        reads: the plan is handed on as it is. A recipe whose call reads the data overrides this
        (`BatchSize`: the batch and learning rate it sets, without reading a batch).
        """
        if self.needs_trials:
            return None
        return plan if self.stage is Stage.DATA else self(plan)

    @property
    def needs_trials(self) -> bool:
        """Whether this recipe leaves a choice to timed trials, which `measured` makes."""
        return False

    def measured(self, plan: Plan) -> Recipe:
        """This recipe with the choices it leaves to timed trials made on `plan`; itself where it leaves none.

        Trials build and train throwaway models, which a pure `__call__` must not, so `tfopt.apply` runs
        them here first (`BatchSize(batch_size="auto")` searches here) and then applies the result.
        """
        return self

    def measured_and_applied(self, plan: Plan) -> tuple[Recipe, Plan]:
        """`measured(plan)` and that recipe applied to `plan`, each recipe of a chain applied once."""
        chosen = self.measured(plan)
        return chosen, chosen(plan)

    @abc.abstractmethod
    def __call__(self, plan: Plan) -> Plan:
        """Returns a new plan with this recipe applied; never modifies `plan`."""

    def clash(self, other: Recipe) -> str | None:
        """Why this recipe cannot be combined with `other`, or None where they combine."""
        return None

    def beside(self, others: Sequence[Recipe]) -> Recipe:
        """This recipe as it runs in a chain with `others`: itself, unless one of them changes what it should
        do (data_pipeline caches nothing in memory for a pipeline that data_service serves)."""
        return self

    def get_config(self) -> dict[str, Any]:
        """The constructor's keyword arguments, YAML-safe."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Recipe:
        """Creates the recipe from `get_config()` output."""
        return cls(**config)


class Chain(Recipe):
    """Several recipes applied as one, ordered by stage.

    Duplicates and clashing pairs are rejected when the chain is made, so a bad combination fails
    before any profiling or building starts.
    """

    name = "chain"
    stage = Stage.DATA

    def __init__(self, *recipes: Recipe):
        flat: list[Recipe] = []
        for recipe in recipes:
            if not isinstance(recipe, Recipe):
                raise RecipeConfigError(
                    f"chain takes recipe objects (tfopt.recipes.Xla(), ...), not a {type(recipe).__name__} "
                    f"({recipe!r}); names and {{name: {{settings}}}} items go to tfopt.apply(..., recipes=[...])."
                )
            flat.extend(recipe.recipes if isinstance(recipe, Chain) else [recipe])
        _reject_clashes(flat)
        flat = [recipe.beside([other for other in flat if other is not recipe]) for recipe in flat]
        # sorted() is stable: recipes of one stage keep the order the user gave.
        self.recipes: tuple[Recipe, ...] = tuple(sorted(flat, key=lambda recipe: recipe.stage))

    def check(self, plan: Plan) -> None:
        """Checks each recipe on the plan the recipes before it make (`Recipe.planned`): grad_accum's effective
        batch against the batch that batch_size and distribution give, not the user's. Where a recipe's plan is
        known only from its trials (a batch-size search, which runs once, when the chain is applied), the
        recipes after it are checked here for what holds whatever the batch (`Recipe.check_before_trials`), and
        in full as the chain applies them, on the plan the trials made."""
        self.planned(plan)

    def planned(self, plan: Plan) -> Plan | None:
        known: Plan | None = plan
        for recipe in self.recipes:
            if known is None:  # a recipe's plan (its call may read the batch) waits for the trials too
                recipe.check_before_trials(plan)
            else:
                recipe.check(known)
                plan, known = known, recipe.planned(known)
        return known

    def __call__(self, plan: Plan) -> Plan:
        for recipe in self.recipes:
            recipe.check(plan)
            plan = recipe(plan)
        return plan

    @property
    def needs_trials(self) -> bool:
        return any(recipe.needs_trials for recipe in self.recipes)

    def measured(self, plan: Plan) -> Chain:
        """The chain with each recipe's trials run on the plan the recipes before it made."""
        return self.measured_and_applied(plan)[0]

    def measured_and_applied(self, plan: Plan) -> tuple[Chain, Plan]:
        if not self.needs_trials:
            return self, self(plan)
        chosen = []
        for recipe in self.recipes:
            recipe.check(plan)
            recipe = recipe.measured(plan)
            plan = recipe(plan)
            chosen.append(recipe)
        return Chain(*chosen), plan

    def get_config(self) -> dict[str, Any]:
        return {"recipes": [{recipe.name: recipe.get_config()} for recipe in self.recipes]}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Chain:
        return cls(*(registry.from_item(item) for item in config["recipes"]))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chain) and self.recipes == other.recipes

    def __hash__(self) -> int:
        return hash(self.recipes)

    def __repr__(self) -> str:
        return f"chain({', '.join(map(repr, self.recipes))})"


def chain(*recipes: Recipe) -> Chain:
    """Combines recipes into one, applied in build order (data, numerics, compile, batch, placement, update).

    Args:
        *recipes: Recipe objects or other chains.

    Returns:
        A recipe that applies them all.

    Raises:
        RecipeClashError: The same recipe appears twice, or two recipes contradict each other.

    Example:
        >>> from tfopt.recipes import MixedPrecision, Xla
        >>> [recipe.name for recipe in chain(Xla(), MixedPrecision()).recipes]
        ['mixed_precision', 'xla']
    """
    return Chain(*recipes)


def _reject_clashes(recipes: list[Recipe]) -> None:
    for index, first in enumerate(recipes):
        for second in recipes[index + 1 :]:
            if first.name == second.name:
                raise RecipeClashError(
                    f"The recipe {first.name!r} appears twice ({first!r} and {second!r}); a chain takes each "
                    "recipe once. Keep one and put all its settings there.",
                    recipes=(first.name, second.name),
                )
            reason = first.clash(second) or second.clash(first)
            if reason:
                raise RecipeClashError(
                    f"{first.name} and {second.name} cannot be combined: {reason}", recipes=(first.name, second.name)
                )
