"""What tfopt.apply gives back computes what the user's model computes: ids never rounded, a layer that fails
in 16 bits kept float32, the user's class, loss and weights, every element structure fit takes, and mixed
precision kept only where it measured faster."""

import dataclasses
import statistics

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfopt
from tests import keras_examples
from tfopt.builder import build
from tfopt.fidelity import TOLERANCE, agreement, outcome
from tfopt.layer_policies import set_dtype_policy
from tfopt.plan import make_plan
from tfopt.policies import dtype_policy_scope
from tfopt.verdict import built_again, candidates, decided

BUILD_ONLY = dict(measure_speed=False)


def test_ids_carried_by_a_float_input_reach_the_embedding_unrounded(cpu_hardware):
    user, data = keras_examples.transformer_classifier(vocab_size=20000)
    built = build(make_plan(user, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    embedding = built.model.layers[1]
    assert embedding.compute_dtype == "float32"  # its call() would round the ids before its Embeddings read them
    assert embedding.token_emb.compute_dtype == "bfloat16"  # Keras casts no Embedding's inputs: it reads them exactly
    assert built.model.layers[3].compute_dtype == "bfloat16"  # the rest computes in 16 bits
    ids, _ = next(iter(data))
    assert float(tf.reduce_max(ids)) > 256  # ids bfloat16 would round
    # The same rows, looked up exactly (rows of other ids differ wholly), summed in 16 bits
    np.testing.assert_allclose(np.asarray(embedding(ids), "float32"), user.layers[1](ids), rtol=1e-2, atol=1e-3)
    assert "reading ids or raw features: 'token_and_position_embedding" in str(built.plan.applied[-1])


def test_layers_carrying_ids_from_a_float_input_to_an_embedding_stay_float32():
    """keras-io's recommender style: the user and movie ids are columns of one float Input, taken by Lambdas (and a
    Reshape) on their way to the Embeddings. Data sorted by user id (MovieLens') puts ids over 256 only in later
    batches, which the first-batch check never sees: the layers on the way must not round them."""
    inputs = keras.Input((2,))
    users = keras.layers.Reshape((1,), name="as_column")(
        keras.layers.Lambda(lambda t: t[:, 0], name="take_user")(inputs)
    )
    movies = keras.layers.Lambda(lambda t: t[:, 1], name="take_movie")(inputs)
    features = keras.layers.Dense(3, name="features")(inputs)  # reads the same Input, carries no ids on
    scaled = keras.layers.Discretization([0.0, 1.0], name="bins")(keras.layers.Dense(1, name="score")(inputs))
    user_vectors = keras.layers.Flatten()(keras.layers.Embedding(1000, 4, name="user_embedding")(users))
    movie_vectors = keras.layers.Embedding(100, 4, name="movie_embedding")(movies)
    joined = keras.layers.Concatenate(name="joined")([user_vectors, movie_vectors, features, scaled])
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(keras.layers.Dense(4, name="hidden")(joined)))
    notes = set_dtype_policy(model, "mixed_bfloat16", None)
    dtypes = {layer.name: layer.compute_dtype for layer in model.layers[1:]}
    for name in ("take_user", "as_column", "take_movie", "bins", "head"):
        assert dtypes[name] == "float32", name
    assert dtypes["features"] == dtypes["score"] == dtypes["joined"] == dtypes["hidden"] == "bfloat16"
    assert dtypes["user_embedding"] == dtypes["movie_embedding"] == "bfloat16"  # Keras casts no Embedding's inputs
    carrying = notes[1].removeprefix("carrying them there: ").split(", ")
    assert sorted(carrying) == ["'as_column' (Reshape)", "'take_movie' (Lambda)", "'take_user' (Lambda)"]
    ids = np.array([[857.0, 99.0], [997.0, 3.0]], "float32")
    np.testing.assert_array_equal(model.get_layer("take_user")(ids), [857.0, 997.0])  # bfloat16: 856, 996


def test_the_way_to_an_embedding_in_a_nested_tower_goes_on_in_the_graph_around_it():
    tower = keras.Sequential([keras.layers.Embedding(20000, 4), keras.layers.Flatten(), keras.layers.Dense(4)])
    inputs = keras.Input((3,))
    model = keras.Model(
        inputs, keras.layers.Dense(1)(tower(keras.layers.Lambda(lambda t: t[:, :1], name="pick")(inputs)))
    )
    set_dtype_policy(model, "mixed_bfloat16", None)
    assert model.get_layer("pick").compute_dtype == "float32"
    assert tower.layers[-1].compute_dtype == "bfloat16"


class OneHotIds(keras.layers.Layer):
    """Reads the ids a float column carries itself: no class of Keras' tells tfopt it does."""

    def __init__(self, depth, **kwargs):
        super().__init__(**kwargs)
        self.depth = depth

    def call(self, inputs):
        return tf.one_hot(tf.cast(tf.reshape(inputs, [-1]), "int32"), self.depth)


class Squashed(keras.layers.Layer):
    """Computes features of floats, and an integer (a count) from its weights: it reads no ids."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, inputs):
        steps = tf.cast(tf.reduce_sum(self.scale), "int32")
        return tf.tanh(inputs * 2.0) * tf.cast(steps, inputs.dtype)


class ReadsIdsInItsCall(keras.Model):
    """A subclassed model: its call() passes the id column through a `Lambda` and a `Reshape` to an Embedding, and
    through its own slicing to a layer casting it; a `Dropout` after the Embedding carries features, not ids."""

    def __init__(self):
        super().__init__()
        self.pick = keras.layers.Lambda(lambda t: t[:, 0], name="pick")
        self.column = keras.layers.Reshape((1,), name="column")
        self.embedding = keras.layers.Embedding(1000, 2, name="embedding")
        self.dropout = keras.layers.Dropout(0.1)
        self.ids = OneHotIds(1000, name="ids")
        self.head = keras.layers.Dense(1)

    def call(self, inputs):
        embedded = self.dropout(keras.ops.squeeze(self.embedding(self.column(self.pick(inputs))), 1))
        return self.head(keras.ops.concatenate([self.ids(inputs[:, :1]), embedded], axis=-1))


def test_a_layer_of_the_users_casting_a_float_input_to_ids_and_the_way_there_stay_float32():
    """keras-io's ids in a float column, read by user code rather than an Embedding: a layer whose call() casts
    them to integers, found in its traced graph. MovieLens-style data sorted by id shows ids past 256 only after
    the first batch, which the first-batch check never sees: tfopt must not round them, nor say more than that."""
    inputs = keras.Input((2,))
    ids = OneHotIds(1000, name="one_hot_ids")(keras.layers.Lambda(lambda t: t[:, :1], name="take_id")(inputs))
    counted = keras.layers.Lambda(lambda t: tf.cast(t[:, 1:] * 10.0, "int32"), name="bucket")(inputs)
    features = Squashed(name="squashed")(keras.layers.Dense(3, name="features")(inputs))
    joined = keras.layers.Concatenate()([ids, features, keras.ops.cast(counted, "float32")])
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(keras.layers.Dense(4, name="hidden")(joined)))
    notes = set_dtype_policy(model, "mixed_bfloat16", None)
    dtypes = {layer.name: layer.compute_dtype for layer in model.layers[1:]}
    assert dtypes["one_hot_ids"] == dtypes["take_id"] == dtypes["bucket"] == dtypes["head"] == "float32"
    assert dtypes["squashed"] == dtypes["features"] == dtypes["hidden"] == "bfloat16"
    assert notes[:2] == [
        "reading ids or raw features: 'bucket' (Lambda), 'one_hot_ids' (OneHotIds)",
        "carrying them there: 'take_id' (Lambda)",
    ]
    rows = np.array([[857.0, 0.5], [999.0, 0.25]], "float32")
    picked = np.argmax(model.get_layer("one_hot_ids")(model.get_layer("take_id")(rows)), axis=-1)
    np.testing.assert_array_equal(picked, [857, 999])  # bfloat16: 856, and 1000 (past the depth: no row)

    subclassed = ReadsIdsInItsCall()
    subclassed(rows)
    notes = set_dtype_policy(subclassed, "mixed_bfloat16", tf.constant(rows))
    assert notes[:2] == [
        "reading ids or raw features: 'ids' (OneHotIds)",
        "carrying them there: 'pick' (Lambda), 'column' (Reshape)",
    ]
    assert subclassed.dropout.compute_dtype == "bfloat16"
    np.testing.assert_array_equal(subclassed.column(subclassed.pick(rows)), [[857.0], [999.0]])


class Bucketed(keras.layers.Layer):
    """Turns a float column into buckets with `digitize`: no cast, TensorFlow's `Bucketize`."""

    def call(self, inputs):
        return keras.ops.one_hot(keras.ops.digitize(inputs[:, 0], [300.0, 600.0, 900.0]), 4)


class LooksUpInALoop(keras.layers.Layer):
    """Gathers rows of a table of its own by the id column, one row at a time: the cast is in `map_fn`'s loop."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(1000, 2), initializer="random_normal")

    def call(self, inputs):
        return tf.map_fn(lambda row: tf.gather(self.table, tf.cast(row[0], "int32")), inputs)


class ScalesFeaturesPassesIds(keras.layers.Layer):
    """Has weights, and passes the id column on untouched by them."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(1,), initializer="ones")

    def call(self, inputs):
        return inputs[:, 0], inputs[:, 1:] * self.scale


def test_ids_made_without_a_cast_in_loops_or_passed_on_by_layers_with_weights_stay_unrounded():
    inputs = keras.Input((2,))
    ids, features = ScalesFeaturesPassesIds(name="split")(inputs)
    front = keras.Input((2,))  # a nested functional model with weights: its Identity passes the id column on
    nested = keras.Model(front, [keras.layers.Identity(name="same")(front[:, :1]), keras.layers.Dense(2)(front)])
    picked, _ = nested(inputs)
    joined = keras.layers.Concatenate()(
        [
            Bucketed(name="buckets")(inputs),
            LooksUpInALoop(name="rows")(inputs),
            keras.layers.Embedding(1000, 2)(ids),
            keras.layers.Flatten()(keras.layers.Embedding(1000, 2)(picked)),
            features,
        ]
    )
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))
    notes = set_dtype_policy(model, "mixed_bfloat16", None)
    assert notes[:2] == [
        "reading ids or raw features: 'buckets' (Bucketed), 'rows' (LooksUpInALoop)",
        "carrying them there: 'same' (Identity), 'split' (ScalesFeaturesPassesIds)",
    ]
    assert nested.layers[-1].compute_dtype == "bfloat16"  # the Dense computes features


class CastsInItsOwnCall(keras.Model):
    """Its own call() turns the id column a Keras `Reshape` passes on into integers: no layer of it reads them."""

    def __init__(self):
        super().__init__()
        self.column = keras.layers.Reshape((1,), name="column")
        self.head = keras.layers.Dense(1, name="head")

    def call(self, inputs):
        return self.head(tf.one_hot(tf.cast(self.column(inputs[:, 0])[:, 0], "int32"), 1000))


class FourierMixing(keras.layers.Layer):
    """FNet's mixing (keras-io): a cast to complex numbers, not to integers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.call = tf.function(self.call)  # a call() of its own, set on the layer: put back as it was

    def call(self, inputs):
        self.add_loss(tf.reduce_sum(inputs) * 0.0)
        return tf.math.real(tf.signal.fft2d(tf.cast(inputs, tf.complex64)))


def test_ids_read_by_the_models_own_code_by_a_category_encoding_and_not_by_complex_numbers():
    own = CastsInItsOwnCall()
    rows = np.array([[857.0, 0.5], [999.0, 0.25]], "float32")
    own(rows)
    assert set_dtype_policy(own, "mixed_bfloat16", tf.constant(rows))[0] == "carrying them there: 'column' (Reshape)"

    inputs = keras.Input((2,))
    column = keras.layers.Reshape((1,), name="take")(inputs[:, 0])  # on to a keras.ops cast of the graph's own
    hot = keras.ops.one_hot(keras.ops.cast(column[:, 0], "int32"), 1000)
    # CategoryEncoding casts what it is given to its compute dtype where it runs in a graph, as fit runs it.
    counted = keras.layers.CategoryEncoding(1000, name="counts")(keras.layers.Reshape((1,), name="ids")(inputs[:, 1]))
    mixed = FourierMixing(name="fourier")(keras.layers.Reshape((2, 1))(inputs))
    features = keras.layers.Concatenate()([hot, counted, keras.layers.Flatten()(mixed)])
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(features))
    own_call = model.get_layer("fourier").__dict__["call"]
    notes = set_dtype_policy(model, "mixed_bfloat16", None)
    assert notes[:2] == [
        "reading ids or raw features: 'counts' (CategoryEncoding)",
        "carrying them there: 'take' (Reshape), 'ids' (Reshape)",
    ]
    assert model.get_layer("fourier").compute_dtype == "bfloat16"
    assert model.get_layer("fourier").__dict__["call"] is own_call and not model.losses

    sparse = keras.Input((6,), sparse=True)
    ids = keras.Input((1,))
    looked_up = keras.layers.Flatten()(keras.layers.Embedding(1000, 2)(keras.layers.Identity(name="same")(ids)))
    both = keras.layers.Concatenate()([keras.layers.Dense(2)(sparse), looked_up])
    model = keras.Model([sparse, ids], keras.layers.Lambda(lambda t: t * 2.0, name="doubled")(both))
    batch = [tf.sparse.from_dense(np.eye(2, 6, dtype="float32")), tf.constant([[857.0], [3.0]])]
    for sample in (batch, None):
        assert set_dtype_policy(model, "mixed_bfloat16", sample)[0] == "carrying them there: 'same' (Identity)"


class ReadsOnlyEagerly(keras.Model):
    """Its call() reads a value with `.numpy()`: compiled to run eagerly, it has no graph to trace."""

    def __init__(self):
        super().__init__()
        self.pick = keras.layers.Lambda(lambda t: t[:, 0], name="pick")
        self.embedding = keras.layers.Embedding(1000, 2)
        self.dropout = keras.layers.Dropout(0.1, name="dropout")
        self.head = keras.layers.Dense(1, name="head")

    def call(self, inputs):
        scale = float(inputs.numpy()[0, 1]) * 0.0 + 1.0
        return self.head(self.dropout(self.embedding(self.pick(inputs)) * scale))


def test_where_the_forward_pass_cannot_be_traced_its_layers_without_weights_stay_float32():
    model = ReadsOnlyEagerly()
    rows = np.array([[857.0, 0.5], [999.0, 0.25]], "float32")
    model(rows)
    notes = set_dtype_policy(model, "mixed_bfloat16", tf.constant(rows))
    assert notes[0] == "carrying them there: 'pick' (Lambda), 'dropout' (Dropout)"
    np.testing.assert_array_equal(model.pick(rows), [857.0, 999.0])


def test_the_id_case_fails_the_fidelity_check_and_ordinary_bf16_passes(cpu_hardware):
    user, data = keras_examples.transformer_classifier(vocab_size=20000)
    batch = next(iter(data))
    reference = outcome(user, batch)
    rounded = build(make_plan(user, data, hardware=cpu_hardware))
    for layer in rounded.model._flatten_layers(include_self=True):  # as a global policy would, outputs float32
        if layer is not rounded.model.layers[-1]:
            layer.dtype_policy = "mixed_bfloat16"
    assert not agreement(reference, outcome(rounded.model, batch), "mixed_bfloat16").agrees

    kept = build(make_plan(user, data, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    checked = agreement(reference, outcome(kept.model, batch), "mixed_bfloat16")
    assert checked.agrees and checked.predictions_error < TOLERANCE["mixed_bfloat16"]

    cnn, images = keras_examples.lstm_forecaster()
    lstm = build(make_plan(cnn, images, hardware=cpu_hardware).replace(dtype_policy="mixed_bfloat16"))
    assert agreement(outcome(cnn, next(iter(images))), outcome(lstm.model, next(iter(images))), "mixed_bfloat16").agrees


def test_vae_keeps_its_class_train_step_and_weights_and_the_outputs_of_its_parts_in_float32(cpu_hardware):
    user, images = keras_examples.vae()
    weights = [weight.copy() for weight in user.get_weights()]
    result = tfopt.apply(user, images, hardware=cpu_hardware, **BUILD_ONLY)
    model = result.model
    assert type(model) is keras_examples.VAE and model is not user
    sampling = next(layer for layer in model._flatten_layers() if isinstance(layer, keras_examples.Sampling))
    # No call(): its train_step reads its encoder's outputs (Sampling's among them) and its decoder's.
    assert sampling.compute_dtype == model.decoder.layers[-1].compute_dtype == "float32"
    assert model.decoder.layers[1].compute_dtype == "bfloat16"
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert "producing the outputs" in step.detail and "'sampling" in step.detail
    for mine, theirs in zip(model.get_weights(), weights):
        np.testing.assert_array_equal(mine, theirs)
    history = model.fit(result.dataset, epochs=1, verbose=0).history
    assert sorted(history) == ["kl_loss", "loss"] and np.isfinite(history["loss"][0])


def test_a_layer_failing_in_16_bits_is_kept_float32_in_every_build_of_the_plan(cpu_hardware):
    """In the middle of a model it is no output layer: the first batch finds it, and builds from the plan keep
    it."""
    inputs = keras.Input((6,))
    shifted = keras_examples.Shifted(name="shifted")(keras.layers.Dense(2)(inputs))
    user = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Dense(4, activation="relu")(shifted)))
    user.compile(optimizer="adam", loss="mse")
    rng = np.random.default_rng(0)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(16, 6)).astype("float32"), rng.normal(size=(16, 3)).astype("float32"))
    ).batch(8)
    result = tfopt.apply(user, data, hardware=cpu_hardware, **BUILD_ONLY)
    assert result.plan.dtype_policy == "mixed_bfloat16"
    assert result.model.get_layer("shifted").compute_dtype == "float32"
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert "kept float32, failing under mixed_bfloat16: 'shifted' (Shifted: " in step.detail
    assert result.plan.float32_layers == ("shifted",)
    again = built_again(result, result.plan.with_compile(steps_per_execution=4)).model
    assert again.get_layer("shifted").compute_dtype == "float32"
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])


def test_loss_layer_model_on_dict_inputs_only(cpu_hardware):
    user, data = keras_examples.loss_layer_model()
    result = tfopt.apply(user, data, hardware=cpu_hardware, **BUILD_ONLY)
    batch = next(iter(data))
    assert type(result.model.get_layer("ctc_loss")) is keras_examples.CTCLayer
    assert result.model.get_layer("ctc_loss").compute_dtype == "float32"  # it produces the output
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])
    assert outcome(user, batch).loss == pytest.approx(
        float(user.compute_loss(x=batch, y_pred=user(batch, training=False), training=False))
    )


def test_unregistered_custom_loss_is_the_users_own_and_gives_the_same_loss(cpu_hardware):
    user, data = keras_examples.lstm_forecaster()
    built = build(make_plan(user, data, hardware=cpu_hardware))
    assert built.model.loss is keras_examples.my_loss
    batch = next(iter(data))
    assert outcome(built.model, batch).loss == outcome(user, batch).loss


def measured_as(setups, **examples_per_second):
    """A side-by-side measurement of `setups` whose rounds read the examples/s given per setup name."""
    from tfopt.profiling.measurement import SideBySide

    rounds = tuple(tuple(examples_per_second[name.replace(" ", "_")]) for name in setups.setups)
    return SideBySide(measurements=(None,) * len(rounds), rounds=rounds)


def test_kept_only_where_faster_beyond_noise(cpu_hardware):
    user, data = keras_examples.lstm_forecaster()
    plan = make_plan(user, data, hardware=cpu_hardware)
    with_bf16 = build(plan.replace(dtype_policy="mixed_bfloat16").record("mixed_precision", "mixed_bfloat16"))
    setups = candidates(build(plan), with_bf16, frozenset({"mixed_precision"}))
    assert list(setups.setups) == ["before", "your numerics", "after"] and setups.numerics == ("mixed_precision",)
    ones = (1.0, 1.0, 1.0, 1.0)
    slower = decided(setups, measured_as(setups, before=ones, your_numerics=ones, after=(0.71, 0.65, 0.78, 0.74)))
    assert slower.chosen == "your numerics" and slower.built.model is setups.setups["your numerics"].model
    assert slower.built.plan.dtype_policy == "float32"
    step = slower.built.plan.applied[-1]
    assert step.skipped and "measured 0.72x [0.65-0.78] over 4 rounds" in step.detail and step.detail.endswith("slower")
    noisy = decided(setups, measured_as(setups, before=ones, your_numerics=ones, after=(1.05, 0.97, 1.12, 1.0)))
    assert noisy.chosen == "your numerics" and noisy.built.plan.applied[-1].detail.endswith("within noise")
    faster = decided(setups, measured_as(setups, before=ones, your_numerics=ones, after=(1.3, 1.2, 1.4, 1.3)))
    assert faster.built.model is with_bf16.model and faster.built.plan.dtype_policy == "mixed_bfloat16"
    assert "kept: measured 1.30x [1.20-1.40] over 4 rounds" in str(faster.built.plan.applied[-1])


def test_summary_gives_the_spread_and_says_within_noise(cpu_hardware):
    user, data = keras_examples.lstm_forecaster()
    result = tfopt.apply(user, data, hardware=cpu_hardware, steps=6, warmup_steps=1)  # 3 rounds of 2 steps
    low, high = result.speedup_range
    assert len(result.speedup_rounds) == 3 and (low, high) == (min(result.speedup_rounds), max(result.speedup_rounds))
    speedup = statistics.median(result.speedup_rounds)  # the rounds' range brackets it
    assert result.speedup == speedup and f"({speedup:.2f}x [{low:.2f}-{high:.2f}]" in result.summary()
    assert ("within noise" in result.summary()) == (low <= 1.0 <= high)
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert "measured" in step.detail  # kept or left out, with its ratio


def test_set_dtype_policy_keeps_output_layers_of_a_subclassed_model_float32():
    class Classifier(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="relu")
            self.head = keras.layers.Dense(2, activation="softmax")

        def call(self, inputs):
            return self.head(self.hidden(inputs))

    model = Classifier()
    model(np.zeros((1, 3), "float32"))
    notes = set_dtype_policy(model, "mixed_bfloat16", np.zeros((2, 3), "float32"))
    assert model.head.compute_dtype == "float32" and model.hidden.compute_dtype == "bfloat16"
    assert notes == ["producing the outputs: 'dense_1' (Dense)"] or notes[0].startswith("producing the outputs")


def test_a_subclassed_models_output_made_by_keras_ops_keeps_its_last_layer_float32():
    """`return ops.softmax(self.head(x))`: the output is no layer's, so the head once went bfloat16 while the plan
    said output layers compute in float32."""

    class SoftmaxHead(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras.layers.Dense(4, activation="relu")
            self.head = keras.layers.Dense(2)

        def call(self, inputs):
            return keras.ops.softmax(self.head(self.hidden(inputs)))

    model = SoftmaxHead()
    model(np.zeros((1, 3), "float32"))
    notes = set_dtype_policy(model, "mixed_bfloat16", np.zeros((2, 3), "float32"))
    assert model.head.compute_dtype == "float32" and model.hidden.compute_dtype == "bfloat16"
    assert notes == [f"producing the outputs: '{model.head.name}' (Dense)"]
    assert model(np.zeros((2, 3), "float32")).dtype == "float32"


class NoisyStep(keras.Model):
    """A train_step drawing its own random numbers (a GAN's latent vectors, a diffusion model's noise), which XLA
    draws from another generator."""

    def __init__(self, part):
        super().__init__()
        self.part = part
        self.seed = keras.random.SeedGenerator(7)

    def train_step(self, data):
        x, y = data
        noisy = x + 3.0 * keras.random.normal(keras.ops.shape(x), seed=self.seed)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self.part(noisy) - y))
        gradients = tape.gradient(loss, self.part.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.part.trainable_weights))
        return {"loss": loss}


def test_a_disagreement_under_xla_only_leaves_xla_out_not_the_precision(cpu_hardware):
    # Weights of one: the noise moves the loss far more than the tolerance, whatever the weights drawn before.
    user = NoisyStep(keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")]))
    user.compile(optimizer="sgd")
    data = keras_examples.regression_data()
    result = tfopt.apply(user, data, [{"xla": {"jit_compile": True}}], hardware=cpu_hardware, measure_speed=False)
    (xla,) = [step for step in result.plan.applied if step.recipe == "xla"]
    assert xla.skipped and xla.detail.startswith("off: the first batch disagrees under XLA only (float32 against")
    assert not result.model.jit_compile and not any(step.recipe == "fidelity" for step in result.plan.applied)


def test_nan_weights_are_refused_before_anything_is_measured(cpu_hardware):
    user, data = keras_examples.lstm_forecaster()
    weights = user.get_weights()
    weights[-1] = np.full_like(weights[-1], np.nan)
    user.set_weights(weights)
    with pytest.raises(
        tfopt.IncompatibleModelError,
        match=rf"weights hold NaN or Inf before any recipe "
        rf"\({user.weights[-1].path}\)",
    ):
        tfopt.apply(user, data, hardware=cpu_hardware)


def test_nan_inputs_are_refused_before_anything_is_measured(cpu_hardware):
    user, data = keras_examples.lstm_forecaster()
    poisoned = data.map(lambda x, y: (x * np.nan, y))
    with pytest.raises(
        tfopt.IncompatibleModelError,
        match=r"predictions and loss on the first batch of your data "
        r"are not finite \(NaN or inf\)",
    ):
        tfopt.apply(user, poisoned, hardware=cpu_hardware)


def test_a_left_out_recipe_gives_back_the_measured_setup_without_it(cpu_hardware, monkeypatch):
    """Whatever the timing says, the result is the setup that was measured: bf16 forced slower here, the
    pipeline rewrite faster."""
    import tfopt.optimize

    real = tfopt.optimize.decided

    def timed(setups, measured):
        rounds = [len(measured.rounds[0]) * [1.0 if name in ("before", "after") else 2.0] for name in setups.setups]
        return real(setups, dataclasses.replace(measured, rounds=tuple(map(tuple, rounds))))

    monkeypatch.setattr(tfopt.optimize, "decided", timed)
    user, data = keras_examples.lstm_forecaster()
    result = tfopt.apply(user, data, hardware=cpu_hardware, steps=6, warmup_steps=1)
    assert result.plan.dtype_policy == "float32" and not result.plan.jit_compile
    assert all(layer.compute_dtype == "float32" for layer in result.model._flatten_layers())
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert step.skipped and "measured 0.50x [0.50-0.50] over 3 rounds" in step.detail
    pipeline = next(step for step in result.plan.applied if step.recipe == "data_pipeline")
    assert not pipeline.skipped and "kept: measured 2.00x [2.00-2.00] over 3 rounds" in pipeline.detail
    assert len(result.speedup_rounds) == 3 and result.dataset is not data  # the tuned pipeline stays


@pytest.mark.parametrize(
    "make",
    [
        keras_examples.lstm_forecaster,
        keras_examples.vae,
        keras_examples.transformer_classifier,
        keras_examples.semi_supervised_contrastive,
    ],
    ids=["lstm_custom_loss", "vae_own_train_step", "float_ids_custom_layer", "zipped_batches_of_two_sizes"],
)
def test_training_the_result_learns_what_plain_keras_learns(make):
    """Two epochs of the model tfopt gives back (float32 here, where the hardware has no 16-bit units) end at
    the weights two epochs of plain Keras reach from the same start: the same train_step, loss, optimizer
    settings, data and order."""
    from tests.conftest import FAKE_HARDWARE
    from tests.same_training import assert_same_training

    user, data = make()
    # Measured too: the first-batch check and the timed steps both train the model, and must put back all of
    # it (weights, optimizer, the seed generators' state).
    result = tfopt.apply(user, data, hardware=FAKE_HARDWARE["cpu_plain"], steps=4, warmup_steps=1)
    assert result.plan.dtype_policy == "float32"
    # Plain Keras trains on a pipeline of its own: one that reshuffles (seeded) gives each new iterator the next
    # order, and `result.dataset` is the user's own where no recipe rebuilt it.
    assert_same_training(result, user, make()[1])


def test_too_few_rounds_keep_nothing(cpu_hardware):
    """Two rounds show no spread: even a recipe twice as fast in both is left out, saying why."""
    user, data = keras_examples.lstm_forecaster()
    plan = make_plan(user, data, hardware=cpu_hardware)
    with_bf16 = build(plan.replace(dtype_policy="mixed_bfloat16").record("mixed_precision", "mixed_bfloat16"))
    setups = candidates(build(plan), with_bf16, frozenset({"mixed_precision"}))
    two = decided(setups, measured_as(setups, before=(1.0, 1.0), your_numerics=(1.0, 1.0), after=(2.0, 2.0)))
    assert two.chosen == "your numerics" and two.built.plan.dtype_policy == "float32"
    assert two.built.plan.applied[-1].detail.endswith("too few rounds to tell from noise (measure 3 or more)")


def test_the_pipeline_is_judged_with_xla_batches_and_not_where_another_recipe_rebatches(cpu_hardware):
    """Recipes that meet the pipeline rewrite: under XLA, "your pipeline" is the user's with static batches;
    where batch_size changes the examples per step, the rewrite is no question of its own."""
    from tests.conftest import make_cnn, make_images

    data = make_images()
    plan = make_plan(make_cnn(), data, hardware=cpu_hardware)
    tuned = plan.record("data_pipeline", "tuned")
    before, xla = build(plan), build(tuned.with_compile(jit_compile=True))
    setups = candidates(before, xla, frozenset({"data_pipeline", "xla"}))
    assert list(setups.setups) == ["before", "your numerics", "your pipeline", "after"] and setups.pipeline
    users = setups.setups["your pipeline"]
    assert users.model is xla.model and users.dataset.element_spec[0].shape[0] == 8  # XLA's static batches
    rebatched = build(tuned.replace(batch_size=16, dataset=data.unbatch().batch(16)))
    assert not candidates(before, rebatched, frozenset({"data_pipeline"})).pipeline


def test_a_model_whose_own_code_fails_in_16_bits_is_named_as_such(cpu_hardware):
    """Its train_step subtracts its float32 targets from its layer's outputs, bfloat16 under the mixed policy (a
    layer, not a model of its own: no output kept float32): its own code fails, not the layer."""
    part = keras.layers.Dense(1)
    part.build((None, 4))
    user = keras_examples.OwnTrainStep(part)
    user.compile(optimizer="sgd")
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    data = keras_examples.regression_data()
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert step.skipped
    assert "the model's own code (OwnTrainStep: its train_step or call, not one of its layers)" in step.detail
    assert "keras.ops.cast" in step.detail and "Give that layer" not in step.detail
    assert result.plan.dtype_policy == "float32"
    assert np.isfinite(result.model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])


def test_a_keras_model_failing_outside_its_layers_is_not_said_to_fail_in_code_of_the_users(cpu_hardware):
    """An activity regularizer's loss is summed by Keras with the others in 16 bits, which fails under the mixed
    policy in plain Keras too: Keras' code fails, not a train_step or call() of the user's."""
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu", activity_regularizer=keras.regularizers.l1(1e-3))(inputs)
    user = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    user.compile(optimizer="adam", loss="mse")
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(
        user, keras_examples.regression_data(features=6), forced, hardware=cpu_hardware, measure_speed=False
    )
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert step.skipped and result.plan.dtype_policy == "float32"
    assert "Keras' own code around the layers of this Functional model" in step.detail
    assert "its train_step or call" not in step.detail


def test_a_model_whose_own_code_mixes_its_output_layer_with_16_bit_tensors_trains_as_under_keras_policy(
    cpu_hardware,
):
    """keras-io's recommender adds what its last Embedding returns (kept float32 as producing the outputs) to its
    other layers' bfloat16 results: plain Keras trains it under the mixed policy, where they are all bfloat16.
    So does tfopt, and it says so; it said the model's own code failed."""
    user, data = keras_examples.recommender()
    ids = next(iter(data))[0]
    user(ids)  # built: the weights both start from
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    assert result.plan.dtype_policy == "mixed_bfloat16" and result.plan.outputs_in_16_bits
    assert {layer.compute_dtype for layer in result.model.layers} == {"bfloat16"}
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert not step.skipped
    back = f"then {result.model.movie_bias.name!r} back in mixed_bfloat16, the outputs in 16 bits as under Keras' own"
    assert back in step.detail
    assert "cannot compute AddV2" in step.detail
    with dtype_policy_scope("mixed_bfloat16"):
        plain, _ = keras_examples.recommender()
        plain(ids)
    plain.set_weights(user.get_weights())
    expected = plain.fit(data, epochs=2, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(result.model.fit(result.dataset, epochs=2, verbose=0).history["loss"], expected)


def test_a_gan_without_call_keeps_the_outputs_of_its_parts_in_float32(cpu_hardware):
    """Its train_step computes its losses from its generator's and discriminator's outputs: those layers stay
    float32 under the mixed policy, as a functional model's output layers do."""
    user, data = keras_examples.conditional_gan()
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    model = result.model
    assert result.plan.dtype_policy == "mixed_bfloat16"
    for part in (model.generator, model.discriminator):
        *inner, last = part.layers
        assert last.dtype_policy.name == "float32", part.name
        assert {layer.dtype_policy.name for layer in inner if layer.weights} == {"mixed_bfloat16"}, part.name
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert "producing the outputs" in step.detail
    assert np.isfinite(model.fit(result.dataset, epochs=1, verbose=0).history["g_loss"][0])


class ShiftedInside(keras.Model):
    """A subclassed model calling a Lambda that fails in 16 bits: Keras filters the Lambda's frame out of the
    traceback, leaving the model's own call as the innermost layer in it."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4)
        self.scale = keras.layers.Lambda(lambda t: t * 2.0, name="scale")  # a Lambda that works in 16 bits
        self.shift = keras.layers.Lambda(lambda t: t + tf.ones(tf.shape(t), tf.float32), name="shift")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        return self.out(self.shift(self.scale(self.hidden(inputs))))


def test_a_lambda_failing_in_16_bits_inside_a_subclassed_model_is_the_layer_kept_float32(cpu_hardware):
    """Keras' message names the class (Lambda), and two layers have it: the first is kept float32 first, then,
    failing still, the one still in 16 bits; the rest of the model stays in 16 bits."""
    user = ShiftedInside()
    user.compile(optimizer="sgd", loss="mse")
    data = keras_examples.regression_data()
    user(next(iter(data))[0])
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    assert result.plan.dtype_policy == "mixed_bfloat16" and result.plan.float32_layers[-1] == "shift"
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert "kept float32, failing under mixed_bfloat16: " in step.detail and "'shift' (Lambda: " in step.detail
    assert result.model.hidden.compute_dtype == "bfloat16" and result.model.shift.compute_dtype == "float32"


def test_a_layer_holding_an_id_reader_stays_float32_and_the_layers_it_holds_compute_in_16_bits(cpu_hardware):
    """The ViT's PatchEncoder adds its Dense's projection to its Embedding of positions. Keras would round what it
    is given before its call(): it stays float32. Its Embedding reads its ids exactly in 16 bits (Keras casts no
    Embedding's inputs), so both addends are 16-bit and the model keeps mixed precision, as plain Keras would."""
    user, data = keras_examples.patch_classifier()
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    model = result.model
    encoder = next(layer for layer in model.layers if isinstance(layer, keras_examples.PatchEncoder))
    assert result.plan.dtype_policy == "mixed_bfloat16" and result.plan.float32_layers == ()
    assert encoder.compute_dtype == "float32"
    assert encoder.projection.compute_dtype == encoder.position_embedding.compute_dtype == "bfloat16"
    assert model.get_layer("mlp").compute_dtype == "bfloat16" and model.get_layer("logits").compute_dtype == "float32"
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert f"reading ids or raw features: {encoder.name!r} (PatchEncoder)" in step.detail
    assert np.isfinite(model.fit(result.dataset, epochs=1, verbose=0).history["loss"][0])


class ShiftsWhenPredicting(keras.layers.Layer):
    """Adds a float32 constant at inference only: fails once its inputs are bfloat16."""

    def call(self, inputs, training=False):
        return inputs if training else inputs + tf.constant(0.0, tf.float32)


class OwnStepReadingXY(keras.Model):
    """A train_step of its own that reads (x, y) as fit does: its forward pass is compared."""

    def __init__(self):
        super().__init__()
        self.hidden, self.shift, self.head = keras.layers.Dense(8), ShiftsWhenPredicting(), keras.layers.Dense(3)

    def call(self, inputs, training=False):
        return self.head(self.shift(self.hidden(inputs), training=training))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def test_a_forward_pass_failing_in_16_bits_is_kept_float32_under_a_train_step_of_the_models_own(cpu_hardware):
    """Its predictions are compared where the user's model gave some: a failure there is the layer's, not a
    batch its train_step reads otherwise (as keras-io's Siamese triplets, tests/test_public_examples.py)."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype("float32"), rng.integers(0, 3, 16).astype("int32")
    keras.utils.set_random_seed(0)
    user = OwnStepReadingXY()
    user(x[:2])
    user.compile("adam", keras.losses.SparseCategoricalCrossentropy(True))
    bf16 = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    result = tfopt.apply(user, data, bf16, hardware=cpu_hardware, **BUILD_ONLY)
    assert "kept float32, failing under mixed_bfloat16: 'shifts_when_predicting'" in str(result.plan.applied[0])
    assert result.model.predict(x, verbose=0).shape == (16, 3)


def test_a_failure_only_under_several_replicas_says_what_plain_keras_does_there(cpu_hardware):
    """A GAN whose train_step builds its own optimizers on its first call trains on one device and fails under
    MirroredStrategy, in plain fit too (seen with two logical CPUs): the message says so, not "report it"."""
    from tfopt.fidelity import _fails_as_it_is
    from tfopt.plan import make_plan

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    data = tf.data.Dataset.from_tensor_slices((np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32"))).batch(2)
    plan = make_plan(model, data, hardware=cpu_hardware).replace(strategy="mirrored")
    message = _fails_as_it_is(ValueError("You must feed a value for placeholder."), model, plan)
    assert message.startswith(
        "The optimized setup fails on the first batch under mirrored, where your model trains on one device: "
        "ValueError: You must feed a value for placeholder. Keras traces the train_step per replica"
    )
    assert "build such state in compile" in message and "report it" not in message


def test_a_loss_without_reduction_is_taken_as_plain_keras_takes_it():
    """One loss per example (reduction=None): Keras sums them into the gradient and logs their mean. tfopt said
    the model failed on its first batch (it read the loss as one number)."""
    from tests.conftest import FAKE_HARDWARE
    from tests.same_training import assert_same_training

    def make():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None))
        rng = np.random.default_rng(0)
        features, labels = rng.random((32, 4), dtype=np.float32), rng.integers(0, 3, 32)
        return model, tf.data.Dataset.from_tensor_slices((features, labels)).batch(8)

    user, data = make()
    result = tfopt.apply(user, data, hardware=FAKE_HARDWARE["cpu_plain"], measure_speed=False)
    assert_same_training(result, user, make()[1])


def test_a_model_without_call_mixing_its_parts_outputs_with_16_bit_tensors_trains_as_under_keras_policy(
    cpu_hardware,
):
    """keras-io's masked autoencoder adds its encoder's outputs (kept float32 as what its train_step reads) to
    positions another part embedded in bfloat16: plain Keras trains it under the mixed policy. tfopt said its
    parts could not be built (traced with the copy's layers in float32 and the new ones in bfloat16)."""
    keras.utils.set_random_seed(0)
    user, data = keras_examples.masked_autoencoder()
    forced = [{"mixed_precision": {"policy": "mixed_bfloat16"}}]
    result = tfopt.apply(user, data, forced, hardware=cpu_hardware, measure_speed=False)
    assert result.plan.dtype_policy == "mixed_bfloat16" and result.plan.outputs_in_16_bits
    step = next(step for step in result.plan.applied if step.recipe == "mixed_precision")
    assert not step.skipped and "the outputs in 16 bits as under Keras' own mixed policy" in step.detail
    keras.utils.set_random_seed(0)
    with dtype_policy_scope("mixed_bfloat16"):  # its fit makes the parts' layers: under the policy too
        plain, _ = keras_examples.masked_autoencoder()
        expected = plain.fit(data, epochs=2, verbose=0, shuffle=False).history["loss"]
    np.testing.assert_allclose(result.model.fit(result.dataset, epochs=2, verbose=0).history["loss"], expected)
