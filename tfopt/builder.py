"""The one place that turns a Plan into a model, a dataset and a strategy.

Order matters and is fixed here: the strategy is made first, then inside its scope and the dtype-policy
scope the model is created once (an in-process copy of the user's model, or the user's `model_fn`), its
layers are put on the plan's policy (`set_dtype_policy`), the user's weights are copied in where the model
was made afresh, and the model is compiled as the plan says: a copy keeps what the user's compile made and
changes only what recipes changed (`_compile`); a model from `model_fn` is compiled with the user's own
compile objects. Global Keras state (the dtype policy) is only changed inside a scope that restores it,
even when building fails. A plan in micro-batches (its batch did not fit the device) has its batches cut
last, from the pipeline as built, so each update covers one of the user's batches.

What XLA needs is settled here too, on the model this build creates: that every layer lowers to XLA
(else the build compiles without it and says which layer), and full batches of one static shape (a
partial last batch would compile the step again every epoch). So a recipe that asks for XLA builds
nothing, and turning XLA off never costs the examples that static batches would drop.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from tfopt.data.batches import describe_dropped, static_batches
from tfopt.errors import IncompatibleModelError, RecipeConfigError, TfoptError, describe_error
from tfopt.layer_policies import set_dtype_policy
from tfopt.model_copy import copy_keras_object
from tfopt.plan import SET_ON_THE_MODEL, Plan, serialized_setting, users_jit_compile
from tfopt.policies import dtype_policy_scope, has_call, model_dtype_policy, put_tf32_in_force
from tfopt.training.held_optimizers import applied_by_its_own_train_step
from tfopt.training.micro_batches import split_batches

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

_log = logging.getLogger("tfopt")


@dataclasses.dataclass(frozen=True)
class Built:
    """A model ready to train, with the data and strategy it was built for.

    Attributes:
        model: The compiled Keras model.
        dataset: The tf.data pipeline to pass to `model.fit`.
        strategy: The tf.distribute strategy the model's variables live under.
        plan: The plan it was built from.
        service: The tf.data service cluster started on this host for the dataset (`data_service: {workers:
            N}`), or None; `close()` stops it, as the end of the process does.
    """

    model: keras.Model
    dataset: tf.data.Dataset
    strategy: tf.distribute.Strategy
    plan: Plan
    service: Any = None

    def close(self) -> None:
        """Stops what the build started for the dataset (the tf.data service workers); the model stays usable."""
        if self.service is not None:
            self.service.close()


def build(plan: Plan) -> Built:
    """Builds and compiles the model a plan describes.

    Args:
        plan: The plan to build.

    Returns:
        The built model, dataset and strategy.

    Raises:
        IncompatibleModelError: The model could not be created, or the user's weights do not fit it, or
            its compile arguments cannot be made again.

    Example:
        >>> import keras, tensorflow as tf
        >>> from tfopt.hardware import Hardware
        >>> from tfopt.plan import make_plan
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> model.compile(optimizer="sgd", loss="mse")
        >>> data = tf.data.Dataset.from_tensor_slices((tf.zeros((8, 4)), tf.zeros((8, 2)))).batch(4)
        >>> built = build(make_plan(model, data, hardware=Hardware()))
        >>> built.model is model
        False
    """
    from tfopt.distribute.strategy import make_strategy

    strategy = make_strategy(plan.strategy, **plan.strategy_options)
    # A process setting, not a scope: matmul kernels read it when they run, so it must stay in force while
    # the model trains. The user's own setting is remembered for the next plan's baseline.
    put_tf32_in_force(plan.tf32)
    with dtype_policy_scope(plan.dtype_policy), strategy.scope():
        model = _create_model(plan)
        own_policy = model_dtype_policy(model)  # a copy's is the user's
        kept_float32 = set_dtype_policy(
            model, plan.dtype_policy, plan.sample_inputs, float32_outputs=not plan.outputs_in_16_bits
        )
        for layer in model._flatten_layers(include_self=False, recursive=True):
            if layer.name in plan.float32_layers:  # failed in 16 bits on the first batch of an earlier build
                layer.dtype_policy = "float32"
        if kept_float32:
            plan = plan.amend("mixed_precision", "kept float32: " + "; ".join(kept_float32))
        if plan.weights_from is not None:
            _copy_weights(plan.weights_from, model)
        if plan.layer_rewrites:  # with the weights in place: a folded bias moves into a moving mean
            plan = _rewritten(model, plan)
        unsettled = plan.dataset  # the workers of a data service serve it with its partial batches
        plan = _settle_xla(model, plan)
        _check_accumulated_optimizer_trains(model, plan)
        _check_fixed_batch(model, plan, strategy.num_replicas_in_sync)
        plan = _said_where_rates_stay(model, plan)
        loss_scaling = _compile(model, plan, own_policy)
        if loss_scaling:
            plan = plan.amend("mixed_precision", loss_scaling)
    dataset, service, plan = _served(plan, unsettled)
    dataset = split_batches(dataset, plan.micro_batches)
    return Built(model=model, dataset=dataset, strategy=strategy, plan=plan, service=service)


def without_mixed_precision(built: Built, baseline_policy: str, why: str) -> Built:
    """The setup built again at the baseline's dtype policy, its plan saying why mixed precision was left out
    (`tfopt.fidelity.first_batch_checked` found that it fails or disagrees). The pipeline the first build
    serves (from tf.data service workers, if any) feeds the rebuilt model too."""
    _log.warning("mixed_precision: left out: %s", why)
    plan = built.plan
    steps = tuple(step for step in plan.applied if step.recipe != "mixed_precision")
    rebuilt = build(
        plan.replace(dtype_policy=baseline_policy, applied=steps, data_service=None).record(
            "mixed_precision", f"left out: {why}", skipped=True
        )
    )
    return dataclasses.replace(
        rebuilt, dataset=built.dataset, service=built.service, plan=rebuilt.plan.replace(data_service=plan.data_service)
    )


def _served(plan: Plan, unsettled: Any) -> tuple[Any, Any, Plan]:
    """The pipeline as read back from the tf.data service the plan offloads it to (starting the cluster on this
    host that it asks for), and that cluster; the plan's own pipeline where it offloads nothing, or where the
    service cannot take it (said in the plan). The workers run `unsettled`, the pipeline before the build made
    its batches static, whose partial batches the client cuts as `plan.dataset` would."""
    if plan.data_service is None:
        return plan.dataset, None, plan
    import tensorflow as tf

    from tfopt.data.service import served_form
    from tfopt.data.service_client import serve_offload, tf_batch_dimension

    # Decided again on the pipeline as built: recipes of later stages (batch_size, distribution) rebatched it.
    whole = plan.whole_batch_size
    unsettled, served_change = served_form(unsettled, own_pipeline=plan.source is not None)
    length = int(plan.dataset.cardinality())
    offload, why = plan.data_service.planned_again(unsettled, batch_size=whole, batches_per_pass=length)
    if offload is not None:
        try:
            served, cluster = serve_offload(
                unsettled,
                offload,
                batch_size=whole,
                static=tf_batch_dimension(plan.dataset.element_spec) is not None,
                batches_per_pass=length,
            )
            return (
                served,
                cluster,
                _offloaded(plan, offload, "; ".join(filter(None, [offload.describe(), served_change]))),
            )
        except tf.errors.OpError as error:  # the service cannot rebuild it (a resource it cannot serialize)
            why = f"left local: the tf.data service could not take the pipeline ({describe_error(error)})"
    _log.warning("data_service: %s", why)
    return plan.dataset, None, _offloaded(plan, None, why)


def _offloaded(plan: Plan, offload: Any, detail: str) -> Plan:
    """The plan with the offload the build made (None: the pipeline stayed local) and its step said again."""
    kept = tuple(step for step in plan.applied if step.recipe != "data_service")
    return plan.replace(data_service=offload, applied=kept).record("data_service", detail, skipped=offload is None)


def _create_model(plan: Plan) -> keras.Model:
    import keras

    try:
        model = plan.model_fn()
    except TfoptError:
        raise
    except Exception as error:
        if plan.copies_users_model:
            raise IncompatibleModelError(
                f"tfopt could not copy your model {getattr(plan.model_fn.args[0], 'name', '')!r} "
                f"({type(error).__name__}: {error}). Pass model_fn=a function that creates it "
                "(tfopt.apply(model, dataset, model_fn=make_model)): tfopt calls it under the plan's "
                "settings and copies your model's weights into it."
            ) from error
        if "Mixing different tf.distribute.Strategy objects" in str(error):
            raise IncompatibleModelError(
                "model_fn creates its model under a tf.distribute strategy of its own, and tfopt places the model "
                "itself, under the plan's strategy. Take the `with strategy.scope():` out of model_fn and ask for "
                "the strategy with the distribution recipe ({'distribution': {'strategy': 'mirrored'}})."
            ) from error
        raise IncompatibleModelError(f"model_fn raised {type(error).__name__}: {error}") from error
    if not isinstance(model, keras.Model):
        raise IncompatibleModelError(f"model_fn must return a keras.Model; it returned {type(model).__name__}.")
    if model is plan.weights_from:
        raise IncompatibleModelError(
            "model_fn returned a model tfopt already holds (the model you passed, or one it returned before), not a "
            "new one: tfopt would change it (its layers' dtypes, its compile). Make model_fn create the model anew "
            "at each call, or pass the model alone: tfopt copies it."
        )
    if not has_call(model):
        if not all(layer.built for layer in model._flatten_layers(include_self=False)):
            _traced_once(model, plan.dataset.element_spec)
    elif not model.weights and not all(layer.built for layer in model._flatten_layers()):
        # A model never called has no variables until its first call; nor do the layers of one whose user called
        # `model.build(shape)`, which marks it built, however little its call() was run.
        model(plan.sample_inputs)
    return model


def _traced_once(model: keras.Model, element_spec: Any) -> None:
    """Creates the variables of a model without call() whose parts are not all built (a GAN of `Sequential`s
    without `Input`) as `fit` does, by tracing its train_step on the batches' specs, and runs nothing: each
    variable holds its initializer's value, as in the user's model before its first step (an initializer keeps
    the seed it drew when it was made, and the copy has it), and no optimizer or seed has moved. Traced in the
    model's own precision, as its fit would: the plan's policy goes on every layer afterwards, and the layers made
    here under it beside the copied ones in the user's would mix precisions in its train_step."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    try:
        with dtype_policy_scope(model_dtype_policy(model)):
            concrete = tf.function(lambda batch: strategy.run(model.train_step, args=(batch,)))
            concrete.get_concrete_function(element_spec)
    except Exception as error:
        raise IncompatibleModelError(
            f"{type(model).__name__} has no call() and parts without weights, which tfopt creates as fit does, by "
            f"tracing its train_step on your batches' shapes; that failed: {describe_error(error)}. Build its parts "
            "(an Input in each Sequential, or call them once), or, with model_fn, return the model compiled."
        ) from error


def _rewritten(model: keras.Model, plan: Plan) -> Plan:
    """`model` with the plan's layer rewrites made (`tfopt.rewrites`), and the plan saying which layers."""
    from tfopt.rewrites import rewrite

    said, made = [], []
    optimizer = plan.compile_objects.get("optimizer")  # compiled after the rewrites; a recipe keeps its class
    for name, (rewritten, kept) in rewrite(model, plan.layer_rewrites, optimizer).items():
        if not rewritten and not kept:
            continue  # no layer it could apply to
        named = ", ".join(rewritten[:_NAMED]) + (
            f" and {len(rewritten) - _NAMED} more" if len(rewritten) > _NAMED else ""
        )
        left = f" (left as they are: {'; '.join(kept)})" if kept else ""
        said.append(f"{name} in {len(rewritten)} layer(s){': ' + named if rewritten else ''}{left}")
        made += [name] if rewritten else []
    if not made:
        why = f"no layer rewritten: {'; '.join(said)}" if said else "no layer to rewrite in this model"
        return plan.replace(layer_rewrites=()).left_out("fused_layers", why)
    return plan.replace(layer_rewrites=tuple(made)).amend("fused_layers", "; ".join(said))


_NAMED = 6  # rewritten layers named in plan.applied (ResNet-50 has 53 of each)


def xla_blockers(model: keras.Model, sample_inputs: Any) -> list[str]:
    """Why `model` cannot be compiled with XLA, one entry per problem; empty where it can.

    Checks each layer's `supports_jit` flag (which Keras silently obeys), then lowers the forward pass
    to XLA HLO, which fails on ops without an XLA kernel (string ops, py_function, some lookups). A model
    without call() of its own (a GAN's, a VAE's: its train_step calls its parts) has no forward pass to
    lower: its train step is tried on the first batch (`tfopt.fidelity.first_batch_checked`).

    Args:
        model: A built Keras model.
        sample_inputs: One batch of its inputs.

    Returns:
        Human-readable reasons, e.g. ["layer 'text_vectorization' (TextVectorization) does not support XLA"].

    Example:
        >>> import keras, numpy as np
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> xla_blockers(model, np.zeros((2, 3), "float32"))
        []
    """
    import tensorflow as tf

    blockers = [
        f"layer {layer.name!r} ({type(layer).__name__}) does not support XLA"
        for layer in model._flatten_layers(include_self=False)
        if not getattr(layer, "supports_jit", True)
    ]
    if blockers or not has_call(model):
        return blockers
    forward = tf.function(lambda inputs: model(inputs, training=True), jit_compile=True)
    try:
        forward.experimental_get_compiler_ir(sample_inputs)(stage="hlo")
    except Exception as error:  # noqa: BLE001 - XLA reports unsupported ops as several different error types
        try:
            tf.function(lambda inputs: model(inputs, training=True)).get_concrete_function(sample_inputs)
        except Exception:  # noqa: BLE001 - it fails without XLA too (a layer in 16 bits): the first batch says why
            return []
        return [f"XLA could not compile the forward pass: {describe_error(error)}"]
    return []


def _settle_xla(model: keras.Model, plan: Plan) -> Plan:
    """The plan as it builds under XLA: without it where the model runs eagerly, or where a layer of this model
    does not lower to it (Keras would otherwise obey a layer's `supports_jit=False` silently, or fail at the
    first step on an op without an XLA kernel), else, where XLA is tfopt's choice and not the user's compile's,
    with its batches made full and static, saying what that drops."""
    if not plan.jit_compile:
        return plan
    if model.run_eagerly:
        return plan.with_compile(jit_compile=False).left_out(
            "xla", "off: your model runs eagerly (compiled with run_eagerly=True), which XLA cannot compile"
        )
    blockers = xla_blockers(model, plan.sample_inputs)
    if blockers:
        _log.warning("xla: off: %s", "; ".join(blockers))
        return plan.with_compile(jit_compile=False).record("xla", "off after all: " + "; ".join(blockers), skipped=True)
    if users_jit_compile(plan.compile_objects):
        return plan  # the user's own XLA trains on their batches, as their fit would
    whole = plan.whole_batch_size  # micro-batches are cut from static batches after
    dataset, dropped = static_batches(plan.dataset, whole)
    if dataset is plan.dataset:  # the batches were static already
        return plan
    if dropped and not _reshuffled_before_batching(plan.dataset):
        return plan.record(
            "xla",
            f"the partial batch of {dropped} examples that ends each pass is kept: the pipeline does not reshuffle "
            "before batching, so dropping it would leave the same examples out of every epoch, which plain Keras "
            "trains; XLA compiles the step again for it each epoch (docs/recipes/xla.md says what that costs): "
            "shuffle before .batch(), or batch with drop_remainder=True yourself, and XLA keeps its batches full",
        )
    return plan.replace(dataset=dataset).record("xla", describe_dropped(dropped, whole))


def _reshuffled_before_batching(dataset: tf.data.Dataset) -> bool:
    """Whether the partial batch that ends a pass holds other examples each epoch (`tfopt.data.graph`). A
    pipeline whose graph cannot be read is taken as reshuffled: its partial batches are dropped, as the plan
    says."""
    from tfopt.data import graph as pipeline_graph

    graph, _ = pipeline_graph.read(dataset)
    return graph is None or pipeline_graph.reshuffled_before_batching(graph)


def _copy_weights(source: keras.Model, target: keras.Model) -> None:
    weights = source.get_weights()
    if not target.weights:
        raise IncompatibleModelError(
            "The model made by model_fn has no weights before its first call and cannot be called on a batch "
            "of your data, so your model's weights cannot be copied into it. Build it in model_fn (call it on "
            "a batch, or build its parts), or pass model=None to start from model_fn's own weights."
        )
    try:
        target.set_weights(weights)
    except ValueError as error:
        raise IncompatibleModelError(
            f"The model built by model_fn does not match the model you passed, so its weights cannot be "
            f"copied ({error}). Make model_fn create the same architecture, or pass model=None to start "
            "from model_fn's own initial weights."
        ) from error


# The recipes that change how many examples a step gets.
_BATCH_RECIPES = ("batch_size", "distribution", "grad_accum")


def _check_accumulated_optimizer_trains(model: keras.Model, plan: Plan) -> None:
    """grad_accum sets the compiled optimizer to accumulate: a train_step of the model's own that applies
    optimizers of its own (a GAN's `d_optimizer` and `g_optimizer`) would leave it unused, and nothing would
    accumulate.

    Raises:
        RecipeConfigError: So, naming the optimizers the train_step applies.
    """
    if not any(step.recipe == "grad_accum" and not step.skipped for step in plan.applied):
        return
    held = applied_by_its_own_train_step(model)
    if held:
        raise RecipeConfigError(
            f"grad_accum: {type(model).__name__}'s own train_step applies its optimizers {', '.join(held)}, not "
            "the one compile made, which grad_accum sets to accumulate: nothing would accumulate. Leave grad_accum "
            "out, or create those optimizers with gradient_accumulation_steps=N yourself."
        )


def _check_fixed_batch(model: keras.Model, plan: Plan, replicas: int) -> None:
    """Refuses a step batch that a stateful layer cannot take: it keeps its states for the batch its input fixes
    (`Input(batch_size=8)`), and Keras fails mid-step on another with a bare shape error. A model with a fixed
    input batch and no stateful layer trains at any batch in plain fit: left alone.

    Raises:
        RecipeConfigError: So, naming the layer, its batch and the recipes that changed the step's.
    """
    step_batch = plan.batch_size // replicas // plan.micro_batches
    changed = [step.recipe for step in plan.applied if step.recipe in _BATCH_RECIPES and not step.skipped]
    stateful = [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if getattr(layer, "stateful", False) is True
    ]
    fixed = [tensor.shape[0] for tensor in getattr(model, "inputs", None) or [] if tensor.shape]
    sizes = {size for size in fixed if size is not None and size != step_batch}
    if changed and stateful and sizes:
        size, recipes = min(sizes), " and ".join(changed)
        raise RecipeConfigError(
            f"{recipes}: the stateful layer {stateful[0].name!r} keeps its states for the batch of {size} the "
            f"model's input fixes, and each step would get {step_batch} examples: plain fit fails on such a batch "
            f"too. Give the recipes a batch of {size} per step, or leave {recipes} out."
        )


def _said_where_rates_stay(model: keras.Model, plan: Plan) -> Plan:
    """The plan saying, where a recipe scaled the compiled optimizer's learning rate (a larger batch's, more
    replicas'), that the optimizers a train_step of the model's own applies keep theirs: they are not the plan's
    to recreate, and a plan saying "0.001 -> 0.004" of an optimizer that never trains misleads."""
    held = applied_by_its_own_train_step(model)
    if not held or "optimizer" not in _changed_settings(plan):
        return plan
    for recipe in ("batch_size", "distribution"):
        if any(step.recipe == recipe and not step.skipped and "learning rate" in step.detail for step in plan.applied):
            plan = plan.amend(
                recipe,
                f"that rate is the compiled optimizer's, which {type(model).__name__}'s own train_step does not "
                f"apply: {', '.join(held)} keep their rates (scale them yourself, or set scale_learning_rate: none)",
            )
    return plan


def _compile(model: keras.Model, plan: Plan, own_policy: str) -> str | None:
    """Compiles the model as the plan says, never calling an overridden `compile` with arguments it does not
    declare (a GAN's `compile(d_optimizer, g_optimizer, loss_fn)`); returns what the plan should say of loss
    scaling, if anything.

    A copy of the user's compiled model keeps what their compile made (optimizers with their state, loss and
    metric objects, attributes their own `compile` set): XLA and the steps per call are set on the model (Keras
    reads both when it makes the train function), and only where a recipe changed another setting (the
    optimizer's learning rate) is the copy compiled again, by `keras.Model.compile` itself, with its own objects
    and the changed ones.
    A model made by `model_fn`, or given `compile=`, is compiled with the plan's arguments: by its own
    `compile` where that takes them. Loss scaling: `_loss_scaling`.
    """
    import keras

    if plan.keeps_users_compile and model.compiled:
        changed = _changed_settings(plan)
        if changed:
            optimizer = model.optimizer
            if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
                optimizer = optimizer.inner_optimizer
            arguments = {**model._compile_config.config, "optimizer": optimizer, **_made_again(changed, plan)}
            # Wrapped again where it was (Keras' compile would wrap a mixed_float16 model's either way).
            auto_scale_loss = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
            made = model.optimizer
            keras.Model.compile(
                model, **{**arguments, "jit_compile": plan.jit_compile, "auto_scale_loss": auto_scale_loss}
            )
            if "optimizer" in changed:
                _carry_optimizer_state(made, model.optimizer)
    else:
        made = model.optimizer if model.compiled else None  # a copy's: the user's optimizer, state and all
        arguments = _compile_arguments(plan)
        declared = {  # XLA is set below, through Keras' setter
            key: value
            for key, value in arguments.items()
            if key != "jit_compile" and _KERAS_COMPILE_DEFAULTS.get(key, _UNSET) != value
        }
        if _declares(model.compile, declared):
            model.compile(**declared)
        else:
            keras.Model.compile(model, **arguments)
        users = getattr(plan.model_fn.args[0], "optimizer", None) if plan.copies_users_model else None
        if users is not None and plan.compile_objects.get("optimizer") is users:
            _carry_optimizer_state(made, model.optimizer)  # compile= given the model's own trained optimizer
    model.jit_compile = plan.jit_compile and not model.run_eagerly
    model.steps_per_execution = plan.steps_per_call
    if model._compile_config is not None:  # what get_compile_config() and a saved copy say
        model._compile_config.config["steps_per_execution"] = plan.steps_per_call
        model._compile_config.config["jit_compile"] = model.jit_compile
    return _loss_scaling(model, plan.dtype_policy, own_policy)


def _carry_optimizer_state(made: Any, new: Any) -> None:
    """Starts the optimizer a recipe made again (a scaled learning rate, gradient accumulation) where the copy's
    stood, as plain Keras would go on: a trained model's moments and step count, loss scale, and the slots the
    copy's was built with (a folded bias's, `tfopt.rewrites.conv_bias`). Both are of one class and config and
    built over the same variables in the same order, so their slots pair by position (their names do not tell
    two layers of one name in different models apart). The learning rate is the recipe's; an accumulation cycle
    starts afresh, at the same count of updates. What `exclude_from_weight_decay()` set, which no config holds,
    goes over whether or not the copy's was built."""
    import keras

    if made is None or new is None:
        return
    made_inner, new_inner = (
        optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
        for optimizer in (made, new)
    )
    for excluded in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if excluded in made_inner.__dict__:
            new_inner.__dict__[excluded] = copy.copy(made_inner.__dict__[excluded])
            new_inner.__dict__["_exclude_from_weight_decay_cache"] = {}
    if not made.built:
        return
    new.build(made._trainable_variables)
    if isinstance(made, keras.optimizers.LossScaleOptimizer) and isinstance(new, keras.optimizers.LossScaleOptimizer):
        new.step_counter.assign(made.step_counter)
        new.dynamic_scale.assign(made.dynamic_scale)
    made, new = made_inner, new_inner
    slots, fresh = _slots(made), _slots(new)
    if len(slots) != len(fresh) or any(tuple(a.shape) != tuple(b.shape) for a, b in zip(slots, fresh)):
        return  # not made alike after all (an optimizer class of the user's): it starts afresh, as a new one does
    for source, variable in zip(slots, fresh):
        variable.assign(source)
    # `_iterations` counts micro-batches under accumulation, `iterations` the updates.
    new._iterations.assign(made.iterations * (new.gradient_accumulation_steps or 1))


def _slots(optimizer: Any) -> list[Any]:
    """An optimizer's state per trained variable (moments, velocities), in the order it was built, without its
    step count, learning rate and gradient accumulators."""
    own = {id(optimizer._iterations), id(getattr(optimizer, "_learning_rate", None))}
    return [
        variable
        for variable in optimizer.variables
        if id(variable) not in own and not variable.path.endswith("_gradient_accumulator")
    ]


def _loss_scaling(model: keras.Model, policy: str, own_policy: str) -> str | None:
    """Wraps or unwraps the model's optimizer for float16 loss scaling where the plan changed the precision; what
    the plan should say of it, if anything.

    At the model's own precision its optimizer stays as it was made: wrapped by Keras for a mixed_float16 model,
    by the user, or left unwrapped on purpose (`compile(auto_scale_loss=False)`). Moved to mixed_float16, Keras'
    own `train_step` scales the loss for a `LossScaleOptimizer`, which Keras wraps only where the *model's*
    policy is mixed_float16 (a model_fn that pins its own dtype escapes that, and fp16 gradients then
    underflow): tfopt wraps it, and a model that only runs its layers takes their policy, so that Keras wraps
    the optimizer of a second stage too (`_follow_its_layers`). A `train_step` of the user's may not scale the
    loss, and a wrapper would then divide its gradients by the scale: its optimizer is left as it was. Moved
    from mixed_float16 to a precision that needs no scaling, the wrapper Keras made for it is taken off.
    """
    import keras

    if policy == own_policy:
        return None
    scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    if policy != "mixed_float16":
        if scaled and own_policy == "mixed_float16":
            _set_optimizer(model, model.optimizer.inner_optimizer)
        _follow_its_layers(model, policy)
        return None
    if type(model).train_step is not keras.Model.train_step:
        return (
            "the optimizer is left as your compile made it: your own train_step decides loss scaling (scale the "
            "loss with self.optimizer.scale_loss and wrap the optimizer in keras.optimizers.LossScaleOptimizer, or "
            "use mixed_bfloat16, which needs no scaling)"
        )
    if model.optimizer is not None and not scaled:
        _set_optimizer(model, keras.optimizers.LossScaleOptimizer(model.optimizer))
    _follow_its_layers(model, policy)
    return None


def _set_optimizer(model: keras.Model, optimizer: Any) -> None:
    """Sets the model's optimizer, and names it in the compile config that a saved copy keeps: a `.keras` file
    then loads with the wrapper, and with the state saved of it, where Keras' own compile would not wrap it."""
    model.optimizer = optimizer
    if model._compile_config is not None:
        model._compile_config.config["optimizer"] = optimizer


def _follow_its_layers(model: keras.Model, policy: str) -> None:
    """Puts the model itself on its layers' new policy, as a global policy would have, where its `call` runs
    its layers and nothing else on inputs kept in their `Input`'s dtype (a Functional model's, which converts no
    input, or a Sequential's that starts at its InputLayer): nothing it computes changes, and Keras' `compile`
    then wraps (or no longer wraps) the optimizer of a second stage for float16 loss scaling itself. A model
    whose own `call` computes would compute in 16 bits under it, and keeps its own policy."""
    import keras
    from keras.src.models.functional import Functional

    call = type(model).call
    if call is Functional.call or (
        call is keras.Sequential.call and model._layers and isinstance(model._layers[0], keras.layers.InputLayer)
    ):
        model.dtype_policy = policy


# Keras' compile defaults: arguments at these values are left out of a call to a model's own `compile`.
_UNSET = object()
_KERAS_COMPILE_DEFAULTS = {
    "loss_weights": None,
    "weighted_metrics": None,
    "run_eagerly": False,
    "steps_per_execution": 1,
}


def _declares(method: Any, arguments: dict[str, Any]) -> bool:
    """Whether a `compile` method takes every one of these keyword arguments."""
    import inspect

    parameters = inspect.signature(method).parameters.values()
    names = {parameter.name for parameter in parameters}
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters) or set(arguments) <= names


def _changed_settings(plan: Plan) -> dict[str, Any]:
    """The compile settings, other than XLA, that recipes changed from the user's: name -> config."""
    return {
        key: config
        for key, config in plan.compile_config.items()
        if key not in SET_ON_THE_MODEL
        and (key not in plan.compile_objects or serialized_setting(plan.compile_objects[key]) != config)
    }


def _compile_arguments(plan: Plan) -> dict[str, Any]:
    """The compile arguments of one build: the user's own objects where the plan left a setting as it was
    (metric objects and the optimizer copied, for they hold state), else made from the plan's config with
    the user's classes and functions at hand, so nothing is looked up again by a name Keras may not know."""
    import keras

    changed = _changed_settings(plan)
    arguments = {"jit_compile": plan.jit_compile}
    for key, given in plan.compile_objects.items():
        # A trained optimizer's state belongs to the user's variables: a fresh one is made from its config.
        if isinstance(given, keras.optimizers.Optimizer) and given.built:
            changed[key] = plan.compile_config[key]
        elif key not in changed:
            arguments[key] = _own_copy(given)
    arguments.update(_made_again(changed, plan))
    return arguments


def _made_again(changed: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """Compile arguments made from their changed configs, with the user's own classes and functions at hand."""
    import keras

    if not changed:
        return {}
    try:
        return keras.saving.deserialize_keras_object(
            changed, custom_objects=_custom_objects(plan.compile_objects.values())
        )
    except (TypeError, ValueError) as error:
        raise IncompatibleModelError(
            f"The model's compile arguments {sorted(changed)} could not be made again after a recipe changed "
            f"them ({error}). Register custom optimizers and learning-rate schedules with "
            "@keras.saving.register_keras_serializable(), or leave out the recipe that changes them."
        ) from error


def _own_copy(value: Any) -> Any:
    """A compile argument for one build: stateful Keras objects copied, the rest (functions, names, stateless
    losses) as the user gave them."""
    import keras

    if isinstance(value, (keras.optimizers.Optimizer, keras.metrics.Metric)):
        return copy_keras_object(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_own_copy(item) for item in value)
    if isinstance(value, dict):
        return {key: _own_copy(item) for key, item in value.items()}
    return value


def _custom_objects(values: Any) -> dict[str, Any]:
    """Every class and function reachable from the user's compile arguments, by the names Keras serializes."""
    import keras

    found: dict[str, Any] = {}
    stack = list(values)
    while stack:
        value = stack.pop()
        if isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif callable(value) or isinstance(value, keras.optimizers.Optimizer):
            kind = value if isinstance(value, type) or not hasattr(value, "get_config") else type(value)
            name = getattr(kind, "__name__", None)
            if name:
                found[name] = kind
                found[keras.saving.get_registered_name(kind)] = kind
            schedule = getattr(value, "_learning_rate", None)
            if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
                stack.append(schedule)
    return found
