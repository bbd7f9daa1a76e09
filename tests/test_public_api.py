"""The public surface is exactly what __all__ lists, and importing tfopt does not import TensorFlow."""

import subprocess
import sys

import tfopt

PUBLIC = {"__version__", "apply", "ApplyResult", "Plan", "build", "chain", "profile", "Profile", "compare", "Report",
          "diagnose", "find_batch_size", "load_recipe", "Monitor"}


def test_public_surface():
    assert set(tfopt.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(tfopt, name) is not None


def test_build_and_apply_are_functions_even_after_their_modules_load():
    import tfopt.builder  # noqa: F401
    import tfopt.optimize  # noqa: F401

    assert callable(tfopt.build) and callable(tfopt.apply)


def test_import_is_light():
    code = "import sys, tfopt; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.split() == ["False", "False"]
