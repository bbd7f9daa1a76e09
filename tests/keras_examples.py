"""Models written the way public keras-io example scripts write them (custom layers without get_config,
subclassed models with their own train_step, adapted lookups, float inputs carrying ids, losses added by a
layer, LSTMs), with small generated data of the same structure."""

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops


class TokenAndPositionEmbedding(layers.Layer):
    """keras-io text_classification_with_transformer: no get_config, holds two Embeddings."""

    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
        return self.token_emb(x) + positions


def transformer_classifier(vocab_size=20000, maxlen=16, count=64, batch_size=16):
    """A float32 Input carrying token ids into TokenAndPositionEmbedding, as the example does."""
    inputs = layers.Input(shape=(maxlen,))
    x = TokenAndPositionEmbedding(maxlen, vocab_size, 16)(inputs)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dense(8, activation="relu")(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    ids = np.random.default_rng(0).integers(0, vocab_size, (count, maxlen)).astype("float32")
    labels = (ids[:, 0] > vocab_size / 2).astype("int32")
    return model, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch_size)


class TransformerBlock(layers.Layer):
    """keras-io text_classification_with_transformer: MultiHeadAttention, its feed-forward part a Sequential
    made in __init__, LayerNormalization and Dropout; no get_config."""

    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.dropout1(self.att(inputs, inputs), training=training)
        out1 = self.layernorm1(inputs + attn_output)
        return self.layernorm2(out1 + self.dropout2(self.ffn(out1), training=training))


def transformer_block_classifier(vocab_size=200, maxlen=16, count=64, batch_size=16):
    """The keras-io Transformer classifier whole: integer ids, the block above, softmax over 2 classes."""
    inputs = layers.Input(shape=(maxlen,))
    x = TokenAndPositionEmbedding(maxlen, vocab_size, 8)(inputs)
    x = TransformerBlock(8, 2, 16)(x)
    x = layers.GlobalAveragePooling1D()(x)
    outputs = layers.Dense(2, activation="softmax")(layers.Dropout(0.1)(x))
    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    ids = np.random.default_rng(0).integers(0, vocab_size, (count, maxlen)).astype("int32")
    labels = (ids[:, 0] > vocab_size / 2).astype("int32")
    return model, tf.data.Dataset.from_tensor_slices((ids, labels)).batch(batch_size)


def augmented_cnn(count=32, batch_size=8, image_size=16):
    """keras-io image_classification_from_scratch: `data_augmentation = keras.Sequential([...])` called on the
    inputs of a functional model, Rescaling, a logit output and binary cross-entropy."""
    data_augmentation = keras.Sequential([layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)])
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Rescaling(1.0 / 255)(data_augmentation(inputs))
    x = layers.Conv2D(8, 3, strides=2, padding="same")(x)
    x = layers.Activation("relu")(layers.BatchNormalization()(x))
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, layers.Dense(1)(layers.Dropout(0.25)(x)))
    model.compile(
        optimizer=keras.optimizers.Adam(3e-4), loss=keras.losses.BinaryCrossentropy(from_logits=True), metrics=["acc"]
    )
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (count, image_size, image_size, 3)).astype("float32")
    labels = rng.integers(0, 2, (count, 1)).astype("float32")
    return model, tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)


class PatchEncoder(layers.Layer):
    """keras-io image_classification_with_vision_transformer: a Dense projection of each patch plus an
    Embedding of its position, added in call; no get_config."""

    def __init__(self, num_patches, projection_dim):
        super().__init__()
        self.num_patches = num_patches
        self.projection = layers.Dense(units=projection_dim)
        self.position_embedding = layers.Embedding(input_dim=num_patches, output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        return self.projection(patch) + self.position_embedding(positions)


def patch_classifier(count=32, batch_size=8, patches=16, patch_size=12):
    """Patches encoded as the ViT example does, then an MLP block and a logit head."""
    inputs = keras.Input((patches, patch_size))
    x = PatchEncoder(patches, 8)(inputs)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    x = layers.Dense(16, activation="gelu", name="mlp")(layers.Flatten()(x))
    model = keras.Model(inputs, layers.Dense(3, name="logits")(x))
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    images = rng.random((count, patches, patch_size), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices((images, rng.integers(0, 3, count))).batch(batch_size)


class Shifted(layers.Layer):
    """Adds a float32 tensor of its own making to its inputs, which are bfloat16 under the mixed policy: it fails
    in 16 bits, as keras-io's Sampling (float32 noise) does."""

    def call(self, inputs):
        return inputs + tf.ones(tf.shape(inputs), tf.float32)


class Sampling(layers.Layer):
    """keras-io vae: float32 keras.random.normal times the layer's own inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(1337)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        epsilon = keras.random.normal(shape=ops.shape(z_mean), seed=self.seed_generator)
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


class VAE(keras.Model):
    """keras-io vae: its own train_step and metrics property, no call(), compiled without a loss."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            total_loss = reconstruction_loss + ops.mean(ops.sum(kl_loss, axis=1))
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(), "kl_loss": self.kl_loss_tracker.result()}


def vae(count=32, batch_size=8):
    """The VAE on images alone: the dataset yields inputs only."""
    encoder_inputs = keras.Input(shape=(8, 8, 1))
    x = layers.Flatten()(layers.Conv2D(4, 3, activation="relu", strides=2, padding="same")(encoder_inputs))
    x = layers.Dense(8, activation="relu")(x)
    z_mean, z_log_var = layers.Dense(2, name="z_mean")(x), layers.Dense(2, name="z_log_var")(x)
    encoder = keras.Model(encoder_inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])], name="encoder")
    latent_inputs = keras.Input(shape=(2,))
    x = layers.Reshape((4, 4, 4))(layers.Dense(4 * 4 * 4, activation="relu")(latent_inputs))
    decoder_outputs = layers.Conv2DTranspose(1, 3, activation="sigmoid", strides=2, padding="same")(x)
    model = VAE(encoder, keras.Model(latent_inputs, decoder_outputs, name="decoder"))
    model.compile(optimizer=keras.optimizers.Adam())
    images = np.random.default_rng(0).random((count, 8, 8, 1), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices(images).batch(batch_size)


def string_lookup_classifier(count=40, batch_size=10):
    """An adapted StringLookup inside the model (structured-data examples)."""
    vocabulary = [f"w{index}" for index in range(20)]
    lookup = layers.StringLookup()
    lookup.adapt(tf.constant(vocabulary))
    inputs = keras.Input(shape=(1,), dtype="string")
    x = layers.Flatten()(layers.Embedding(lookup.vocabulary_size(), 4)(lookup(inputs)))
    model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(x))
    model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
    words = tf.constant([[vocabulary[index % 20]] for index in range(count)])
    labels = tf.constant([index % 2 for index in range(count)], "float32")
    return model, tf.data.Dataset.from_tensor_slices((words, labels)).batch(batch_size)


class CTCLayer(layers.Layer):
    """keras-io captcha_ocr: no get_config; adds its loss with add_loss and returns the predictions."""

    def call(self, y_true, y_pred):
        self.add_loss(ops.mean(keras.losses.mean_squared_error(y_true, y_pred)))
        return y_pred


def loss_layer_model(count=32, batch_size=8):
    """Dict inputs, one of them the label consumed by a loss layer: the dataset yields dicts only."""
    image = keras.Input(shape=(6,), name="image")
    label = keras.Input(shape=(3,), name="label")
    outputs = CTCLayer(name="ctc_loss")(label, layers.Dense(3)(layers.Dense(8, activation="relu")(image)))
    model = keras.Model(inputs={"image": image, "label": label}, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam())
    rng = np.random.default_rng(0)
    data = {"image": rng.random((count, 6), dtype=np.float32), "label": rng.random((count, 3), dtype=np.float32)}
    return model, tf.data.Dataset.from_tensor_slices(data).batch(batch_size)


def my_loss(y_true, y_pred):
    """An unregistered custom loss function."""
    return ops.mean(ops.square(ops.cast(y_true, y_pred.dtype) - y_pred), axis=-1)


def lstm_forecaster(count=64, batch_size=16):
    """keras-io timeseries_weather_forecasting, small."""
    inputs = keras.Input(shape=(12, 5))
    model = keras.Model(inputs, layers.Dense(1)(layers.LSTM(16)(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.001), loss=my_loss)
    series = np.random.default_rng(0).random((count, 12, 5), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices((series, series[:, -1, :1])).batch(batch_size)


def imbalanced_classifier(count=64, batch_size=16):
    """keras-io imbalanced_classification and melanoma: metrics holding enums (AUC's curve and summation
    method), confusion-matrix counters and thresholds."""
    model = keras.Sequential(
        [keras.Input(shape=(6,)), layers.Dense(8, activation="relu"), layers.Dropout(0.3), layers.Dense(1, "sigmoid")]
    )
    metrics = [
        keras.metrics.FalseNegatives(name="fn"),
        keras.metrics.Precision(name="precision"),
        keras.metrics.Recall(name="recall"),
        keras.metrics.AUC(name="auc"),
        keras.metrics.AUC(name="prc", curve="PR"),
    ]
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics)
    rng = np.random.default_rng(0)
    features = rng.random((count, 6), dtype=np.float32)
    labels = (features[:, 0] > 0.8).astype("float32")
    return model, tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)


class ConditionalGAN(keras.Model):
    """keras-io conditional_gan: its own compile(d_optimizer, g_optimizer, loss_fn), two optimizers held as
    attributes, a seed generator, a metrics property and a train_step that calls its parts; no call()."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)
        self.gen_loss_tracker = keras.metrics.Mean(name="generator_loss")
        self.disc_loss_tracker = keras.metrics.Mean(name="discriminator_loss")

    @property
    def metrics(self):
        return [self.gen_loss_tracker, self.disc_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, data):
        real_images, one_hot_labels = data
        image_labels = ops.repeat(one_hot_labels[:, None, None, :], repeats=4 * 4, axis=1)
        image_labels = ops.reshape(image_labels, (-1, 4, 4, 2))
        batch_size = ops.shape(real_images)[0]
        latent = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated = self.generator(ops.concatenate([latent, one_hot_labels], axis=1))
        combined = ops.concatenate(
            [ops.concatenate([generated, image_labels], -1), ops.concatenate([real_images, image_labels], -1)], axis=0
        )
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(combined))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        latent = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            fake = self.generator(ops.concatenate([latent, one_hot_labels], axis=1))
            g_loss = self.loss_fn(
                ops.zeros((batch_size, 1)), self.discriminator(ops.concatenate([fake, image_labels], -1))
            )
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.gen_loss_tracker.update_state(g_loss)
        self.disc_loss_tracker.update_state(d_loss)
        return {"g_loss": self.gen_loss_tracker.result(), "d_loss": self.disc_loss_tracker.result()}


def conditional_gan(count=32, batch_size=8, latent_dim=4, built=True):
    """Images of 4x4x1 with one-hot labels of 2 classes. `built=False`: parts without `Input`, as keras-io's DCGAN
    writes them, so nothing has weights before the first train step."""
    discriminator = keras.Sequential(
        [
            *([keras.Input((4, 4, 3))] if built else []),
            layers.Conv2D(4, 3, padding="same"),
            layers.LeakyReLU(0.2),
            layers.Flatten(),
            layers.Dense(1),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            *([keras.Input((latent_dim + 2,))] if built else []),
            layers.Dense(16),
            layers.LeakyReLU(0.2),
            layers.Reshape((4, 4, 1)),
        ],
        name="generator",
    )
    model = ConditionalGAN(discriminator, generator, latent_dim)
    model.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    images = rng.random((count, 4, 4, 1), dtype=np.float32)
    labels = np.eye(2, dtype="float32")[rng.integers(0, 2, count)]
    return model, tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch_size)


class Distiller(keras.Model):
    """keras-io knowledge_distillation: compile(optimizer, metrics, student_loss_fn, ...) and a compute_loss
    override without the `training` argument, a teacher model held as an attribute."""

    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)
        distillation_loss = self.distillation_loss_fn(
            ops.softmax(teacher_pred / self.temperature, axis=1), ops.softmax(y_pred / self.temperature, axis=1)
        ) * (self.temperature**2)
        return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

    def call(self, x):
        return self.student(x)


def distiller(count=32, batch_size=8):
    teacher = keras.Sequential(
        [keras.Input((6,)), layers.Dense(16, activation="relu"), layers.Dense(3)], name="teacher"
    )
    student = keras.Sequential([keras.Input((6,)), layers.Dense(4, activation="relu"), layers.Dense(3)], name="student")
    model = Distiller(student=student, teacher=teacher)
    model.compile(
        optimizer=keras.optimizers.Adam(),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    rng = np.random.default_rng(0)
    features = rng.random((count, 6), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices((features, rng.integers(0, 3, count).astype("int32"))).batch(
        batch_size
    )


def custom_standardization(input_data):
    """keras-io text_classification_from_scratch: an unregistered function in TextVectorization's config."""
    lowercase = tf.strings.lower(input_data)
    stripped_html = tf.strings.regex_replace(lowercase, "<br />", " ")
    return tf.strings.regex_replace(stripped_html, "[!\"#$%&'()*+,-./:;<=>?@\\[\\\\\\]^_`{|}~]", "")


def end_to_end_text_classifier(count=32, batch_size=8):
    """keras-io text_classification_from_scratch: a model trained on vectorized text, then an end-to-end model
    of raw strings made by calling the adapted TextVectorization and that model."""
    words = ["Great film!", "awful<br />plot", "A fine cast.", "dull, slow", "loved it", "not again"]
    texts = np.array([f"{words[index % 6]} {words[(index * 5) % 6]}" for index in range(count)])
    labels = np.array([index % 2 for index in range(count)], "float32")
    vectorize_layer = layers.TextVectorization(
        standardize=custom_standardization, max_tokens=40, output_mode="int", output_sequence_length=6
    )
    vectorize_layer.adapt(texts)
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = layers.GlobalMaxPooling1D()(layers.Embedding(40, 4)(inputs))
    model = keras.Model(inputs, layers.Dense(1, activation="sigmoid", name="predictions")(x))
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    raw = tf.data.Dataset.from_tensor_slices((texts[:, None], labels)).batch(batch_size)
    inputs = keras.Input(shape=(1,), dtype="string")
    end_to_end = keras.Model(inputs, model(vectorize_layer(inputs)))
    end_to_end.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return end_to_end, raw


class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule of the user's own, without get_config."""

    def __init__(self, peak, warmup_steps):
        self.peak = peak
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        return self.peak * ops.minimum(1.0, (ops.cast(step, "float32") + 1.0) / self.warmup_steps)


class ClippedSGD(keras.optimizers.SGD):
    """An optimizer subclass with a setting of its own that its (inherited) get_config leaves out."""

    def __init__(self, clip, **kwargs):
        super().__init__(clipvalue=clip, **kwargs)
        self.clip = clip


def custom_optimizer_classifier(count=32, batch_size=8):
    inputs = keras.Input((6,))
    model = keras.Model(inputs, layers.Dense(3, activation="softmax")(layers.Dense(8, activation="relu")(inputs)))
    model.compile(
        optimizer=ClippedSGD(0.5, learning_rate=WarmupSchedule(0.1, 3)), loss="sparse_categorical_crossentropy"
    )
    rng = np.random.default_rng(0)
    features = rng.random((count, 6), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices((features, rng.integers(0, 3, count).astype("int32"))).batch(
        batch_size
    )


class OwnTrainStep(keras.Model):
    """A model without call() whose train_step calls its part (a layer or a model): a mean squared error applied
    by its optimizer, the loss reported through `report` where given (a script handing it to Python), the
    inputs first through `augment` where given (keras-io SimCLR's augmenters: a Sequential without Input)."""

    def __init__(self, part, report=None, augment=None):
        super().__init__()
        self.part = part
        self.report = report
        self.augment = augment

    def train_step(self, data):
        x, y = data
        if self.augment is not None:
            x = self.augment(x, training=True)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.part(x) - y))
        gradients = tape.gradient(loss, self.part.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.part.trainable_weights))
        return {"loss": self.report(loss) if self.report is not None else loss}


def regression_data(count=20, batch_size=8, features=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(count, features)).astype("float32")
    y = rng.normal(size=(count, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


class CountsWhatItSees(keras.Model):
    """State that training writes and `model.variables` does not list: a `tf.Variable` step counter its train_step
    keeps (a loss warm-up reads it), a stateful LSTM's states, and a `MutableHashTable` counting the ids seen."""

    def __init__(self):
        super().__init__()
        self.seen = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=0.0)
        self.lstm = layers.LSTM(4, stateful=True)
        self.dense = layers.Dense(1)
        self.steps_taken = tf.Variable(0.0, trainable=False)

    def call(self, inputs, training=None):
        ids, sequences = inputs
        counts = tf.ensure_shape(self.seen.lookup(ids), ids.shape)
        if training:
            self.seen.insert(ids, counts + 1.0)
        return self.dense(tf.concat([self.lstm(sequences), tf.math.log1p(counts)], -1))

    def train_step(self, data):
        self.steps_taken.assign_add(1.0)
        return super().train_step(data)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        warm_up = ops.minimum(1.0, self.steps_taken / 4.0)
        return warm_up * super().compute_loss(x, y, y_pred, sample_weight, training=training)


def counts_what_it_sees(count=32, batch_size=8):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 5, size=(count, 1)).astype("int64")
    sequences = rng.normal(size=(count, 3, 2)).astype("float32")
    targets = rng.normal(size=(count, 1)).astype("float32")
    keras.utils.set_random_seed(0)
    model = CountsWhatItSees()
    model((ids[:batch_size], sequences[:batch_size]))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    data = tf.data.Dataset.from_tensor_slices(((ids, sequences), targets)).batch(batch_size, drop_remainder=True)
    return model, data


class DistanceLayer(layers.Layer):
    """keras-io's siamese_network: the anchor's squared distances to the positive and the negative."""

    def call(self, anchor, positive, negative):
        return ops.sum(ops.square(anchor - positive), -1), ops.sum(ops.square(anchor - negative), -1)


class SiameseModel(keras.Model):
    """keras-io's siamese_network (triplet loss): call() takes the triplet, and its own train_step trains on
    batches of (anchor, positive, negative) without labels, which Keras would read as (x, y, sample_weight)."""

    def __init__(self, siamese_network, margin=0.5):
        super().__init__()
        self.siamese_network = siamese_network
        self.margin = margin
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, inputs):
        return self.siamese_network(inputs)

    def train_step(self, data):
        with tf.GradientTape() as tape:
            ap_distance, an_distance = self.siamese_network(data)
            loss = ops.maximum(ap_distance - an_distance + self.margin, 0.0)
        gradients = tape.gradient(loss, self.siamese_network.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.siamese_network.trainable_weights))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


def siamese_triplets(count=16, batch_size=8):
    keras.utils.set_random_seed(0)
    embedding = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"), layers.Dense(4)])
    anchor, positive, negative = (layers.Input(name=name, shape=(6,)) for name in ("anchor", "positive", "negative"))
    distances = DistanceLayer()(embedding(anchor), embedding(positive), embedding(negative))
    model = SiameseModel(keras.Model([anchor, positive, negative], distances))
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    rng = np.random.default_rng(0)
    triplets = tuple(rng.normal(size=(count, 6)).astype("float32") for _ in range(3))
    return model, tf.data.Dataset.from_tensor_slices(triplets).batch(batch_size)


class SemiSupervisedContrastive(keras.Model):
    """keras-io semi-supervised_contrastive (shortened): unlabeled and labeled batches of other sizes zipped in one
    pipeline, a compile taking two optimizers, and a train_step of its own applying them."""

    def __init__(self):
        super().__init__()
        self.encoder = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu")], name="encoder")
        self.projection_head = keras.Sequential([keras.Input((8,)), layers.Dense(4)], name="projection_head")
        self.linear_probe = keras.Sequential([keras.Input((8,)), layers.Dense(3)], name="linear_probe")
        self.noise = layers.GaussianNoise(0.1)

    def compile(self, contrastive_optimizer, probe_optimizer, **kwargs):
        super().compile(**kwargs)
        self.contrastive_optimizer = contrastive_optimizer
        self.probe_optimizer = probe_optimizer
        self.probe_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def train_step(self, data):
        (unlabeled, _), (labeled, labels) = data
        views = ops.concatenate((unlabeled, labeled), axis=0)
        contrastive_weights = self.encoder.trainable_weights + self.projection_head.trainable_weights
        with tf.GradientTape() as tape:
            first = self.projection_head(self.encoder(self.noise(views, training=True)))
            second = self.projection_head(self.encoder(self.noise(views, training=True)))
            contrastive_loss = ops.mean(ops.square(first - second))
        self.contrastive_optimizer.apply(tape.gradient(contrastive_loss, contrastive_weights), contrastive_weights)
        with tf.GradientTape() as tape:
            probe_loss = self.probe_loss(labels, self.linear_probe(self.encoder(labeled)))
        self.probe_optimizer.apply(
            tape.gradient(probe_loss, self.linear_probe.trainable_weights), self.linear_probe.trainable_weights
        )
        return {"c_loss": contrastive_loss, "p_loss": probe_loss}


def semi_supervised_contrastive(count=16):
    model = SemiSupervisedContrastive()
    model.compile(contrastive_optimizer=keras.optimizers.Adam(), probe_optimizer=keras.optimizers.Adam())
    rng = np.random.default_rng(0)
    unlabeled = tf.data.Dataset.from_tensor_slices(
        (rng.random((2 * count, 6), dtype=np.float32), np.full(2 * count, -1))
    )
    labeled = tf.data.Dataset.from_tensor_slices((rng.random((count, 6), dtype=np.float32), rng.integers(0, 3, count)))
    return model, tf.data.Dataset.zip(
        (unlabeled.shuffle(2 * count, seed=3).batch(8), labeled.shuffle(count, seed=4).batch(4))
    )


class RecommenderNet(keras.Model):
    """keras-io collaborative_filtering_movielens: its call() adds what its Embeddings return with `+` (no dtype
    promotion), the last of them a bias, and applies the sigmoid itself."""

    def __init__(self, users=20, movies=30, size=4, **kwargs):
        super().__init__(**kwargs)
        self.user_embedding = layers.Embedding(users, size, embeddings_initializer="he_normal")
        self.user_bias = layers.Embedding(users, 1)
        self.movie_embedding = layers.Embedding(movies, size, embeddings_initializer="he_normal")
        self.movie_bias = layers.Embedding(movies, 1)

    def call(self, inputs):
        user_vector = self.user_embedding(inputs[:, 0])
        movie_vector = self.movie_embedding(inputs[:, 1])
        x = ops.tensordot(user_vector, movie_vector, 2) + self.user_bias(inputs[:, 0]) + self.movie_bias(inputs[:, 1])
        return ops.nn.sigmoid(x)


def recommender(count=32, batch_size=8):
    rng = np.random.default_rng(0)
    ids = np.stack([rng.integers(0, 20, count), rng.integers(0, 30, count)], 1).astype("int64")
    ratings = rng.random(count).astype("float32")
    model = RecommenderNet()
    model.compile(loss=keras.losses.BinaryCrossentropy(), optimizer=keras.optimizers.Adam(1e-3))
    return model, tf.data.Dataset.from_tensor_slices((ids, ratings)).batch(batch_size)


class PatchPositions(layers.Layer):
    """keras-io masked_image_modeling's PatchEncoder: layers made in build(); returns the patches projected with
    their positions added, and the positions."""

    def build(self, input_shape):
        self.projection = layers.Dense(4)
        self.position_embedding = layers.Embedding(input_shape[1], 4)

    def call(self, patches):
        positions = self.position_embedding(ops.arange(ops.shape(patches)[1]))[None]
        return self.projection(patches) + positions, positions


class MaskedAutoencoder(keras.Model):
    """keras-io masked_image_modeling's shape: no call(), parts not built until its train_step runs them, and the
    train_step adds its encoder's outputs to positions another part embedded (`encoder_outputs +
    unmasked_positions`)."""

    def __init__(self):
        super().__init__()
        self.patch_encoder = PatchPositions()
        self.encoder = keras.Sequential([layers.Dense(4), layers.LayerNormalization()])
        self.decoder = layers.Dense(2)

    def train_step(self, patches):
        with tf.GradientTape() as tape:
            embedded, positions = self.patch_encoder(patches)
            decoded = self.decoder(self.encoder(embedded) + positions)
            loss = self.compute_loss(y=patches, y_pred=decoded)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        return {"loss": loss}


def masked_autoencoder(count=16):
    model = MaskedAutoencoder()
    model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
    patches = np.random.default_rng(0).random((count, 3, 2), dtype=np.float32)
    return model, tf.data.Dataset.from_tensor_slices(patches).batch(8)
