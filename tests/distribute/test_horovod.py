"""Horovod through tfopt's adapter: two Gloo ranks on 127.0.0.1 must end with identical weights."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tfopt.distribute.horovod import INSTALL_HINT, import_horovod
from tfopt.errors import DistributionError

HERE = Path(__file__).parent


def horovod_missing_reason():
    try:
        import_horovod()
    except DistributionError as error:
        return f"Horovod cannot be imported here: {error}"
    return None


def test_missing_horovod_explains_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)  # makes the import fail
    with pytest.raises(DistributionError) as error:
        import_horovod()
    assert "scripts/install_horovod.sh" in str(error.value) and INSTALL_HINT in str(error.value)


@pytest.mark.multi_worker
@pytest.mark.slow
@pytest.mark.skipif(horovod_missing_reason() is not None, reason=str(horovod_missing_reason()))
def test_two_gloo_ranks_end_with_identical_weights(tmp_path):
    horovodrun = shutil.which("horovodrun", path=str(Path(sys.executable).parent))
    completed = subprocess.run(
        [
            horovodrun,
            "-np",
            "2",
            "-H",
            "127.0.0.1:2",
            "--gloo",
            "--network-interfaces",
            "lo",
            sys.executable,
            str(HERE / "worker_script.py"),
            str(tmp_path),
            "--strategy",
            "horovod",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={
            "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "PYTHONPATH": str(HERE.parent.parent),
        },
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    first, second = (json.loads((tmp_path / f"worker_{rank}.json").read_text()) for rank in range(2))
    assert first["replicas"] == 2 and first["is_chief"] and not second["is_chief"]
    assert first["weights"] == second["weights"]
    assert set(first["ids"]).isdisjoint(second["ids"]) and len(first["ids"] + second["ids"]) == 64
    # The same global batches as the multi-worker test, so the same losses as one-device training.
    sys.path.insert(0, str(HERE))
    from worker_script import train_reference

    expected_loss, expected_weights = train_reference(2)
    np.testing.assert_allclose(first["loss"], expected_loss, rtol=1e-5)
    for got, want in zip(first["weights"], expected_weights):
        np.testing.assert_allclose(got, want, atol=1e-5)
