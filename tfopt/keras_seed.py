"""Keras' global SeedGenerator, put back after `apply` as plain Keras would find it.

A random op given no seed (`keras.random.normal(shape)` in a train_step: keras.io's DDIM and masked autoencoder
draw their noise so) draws from one generator Keras keeps for the process, which no model copy has a copy of.
`apply` trains the copy on the user's batches (the first-batch check, the measurements), drawing from it: without
putting it back, the copy and the user's own model, trained afterwards, would draw other noise than plain fit.

Keras makes the generator on the first draw (after `keras.utils.set_random_seed`, which drops it), seeded from
Python's `random`. Where `apply` made it, it is kept (the copy's traced functions hold it) and started where the
one plain Keras would make next starts: seeded by the draw from Python's `random` that making it would take, so
this must run after Python's generators are put back (`tfopt.data.python_generators`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def keras_seed_kept() -> Iterator[None]:
    """Puts Keras' global SeedGenerator back as it was before the block, or, where the block made it, at the
    start one made after the block would have."""
    import keras
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR, make_default_seed

    before = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    state = before.state.numpy() if before is not None else None
    try:
        yield
    finally:
        if before is not None:
            before.state.assign(state)
            global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, before)
        else:
            made = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
            if made is not None:
                made.state.assign(keras.ops.convert_to_tensor([make_default_seed(), 0], dtype=made.state.dtype))
