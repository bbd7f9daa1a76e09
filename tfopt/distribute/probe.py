"""Does Keras 3 `model.fit` work under MultiWorkerMirroredStrategy yet? Asks two real workers.

The upstream bug (keras-team/keras#20585) only shows with two or more workers, so the probe launches two
local workers over 127.0.0.1 that each run a two-step `fit` on a tiny model, and records the answer per
TensorFlow/Keras version in a small cache file. Training workers only read that cache (they must not
start clusters of their own); run the probe once per environment, e.g. in CI or
`python -m tfopt.distribute.probe`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

_MARKER = "TFOPT_PROBE"


def default_cache_path() -> Path:
    """Where probe results are kept: $TFOPT_CACHE_DIR or ~/.cache/tfopt, file keras_fit_probe.json."""
    from tfopt.environment_variables import directory

    root = directory("TFOPT_CACHE_DIR", purpose="its cache of probe results") or Path.home() / ".cache" / "tfopt"
    return root / "keras_fit_probe.json"


def keras_fit_works_multi_worker(
    *, refresh: bool = False, cache_path: str | os.PathLike | None = None, timeout_seconds: float = 300.0
) -> bool:
    """Whether Keras' `model.fit` trains under a two-worker MultiWorkerMirroredStrategy here.

    Args:
        refresh: Run the probe even when the cache has an answer for these versions.
        cache_path: The cache file; `default_cache_path()` when None.
        timeout_seconds: Bound on the probe's two workers.

    Returns:
        True where both workers' `fit` completed; False where it raised (the upstream bug).

    Raises:
        DistributionError: The workers could not run at all (not a Keras failure: that returns False).
    """
    from tfopt.distribute.launcher import launch_local_workers

    cache = Path(cache_path) if cache_path else default_cache_path()
    key = _versions_key()
    if not refresh:
        cached = _read_cache(cache).get(key)
        if cached is not None:
            return bool(cached["works"])
    lines: list[str] = []
    launch_local_workers(
        [sys.executable, "-m", "tfopt.distribute.probe", "--worker"],
        2,
        output=lines.append,
        timeout_seconds=timeout_seconds,
    )
    results = [line.split(_MARKER, 1)[1].strip() for line in lines if _MARKER in line]
    works = len(results) == 2 and all(result == "ok" for result in results)
    detail = next((result for result in results if result != "ok"), "ok")
    entries = _read_cache(cache)
    entries[key] = {"works": works, "detail": detail[:300]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(entries, indent=1))
    return works


def cached_keras_fit_works(cache_path: str | os.PathLike | None = None) -> bool:
    """The cached probe answer for the installed versions; False (the safe answer) when never probed."""
    cached = _read_cache(Path(cache_path) if cache_path else default_cache_path()).get(_versions_key())
    return bool(cached and cached["works"])


def _versions_key() -> str:
    from importlib.metadata import version

    return f"tensorflow-{version('tensorflow')}/keras-{version('keras')}"


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _probe_worker() -> None:
    """Runs in each probe worker: a two-step fit on a tiny model, printing ok or the error."""
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    features = np.ones((16, 4), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, features[:, :1])).batch(8)
    try:
        model.fit(dataset, epochs=1, verbose=0, shuffle=False)
        print(f"{_MARKER} ok", flush=True)
    except Exception as error:  # noqa: BLE001 - any failure means "fit does not work here"; the text goes to the cache
        print(f"{_MARKER} {type(error).__name__}: {str(error).splitlines()[0]}", flush=True)


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _probe_worker()
    else:
        print("keras fit works under multi-worker:", keras_fit_works_multi_worker(refresh="--refresh" in sys.argv))
