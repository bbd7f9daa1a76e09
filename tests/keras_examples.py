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
