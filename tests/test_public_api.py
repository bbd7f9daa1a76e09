"""The public surface is exactly what __all__ lists, and importing tfopt does not import TensorFlow."""

import inspect
import subprocess
import sys

import tfopt
import tfopt.errors

CALLS = {"apply", "profile", "diagnose", "compare", "load_recipe", "chain", "Monitor"}
RESULTS = {"ApplyResult", "Profile", "Report"}
ERRORS = {
    name
    for name, value in vars(tfopt.errors).items()
    if inspect.isclass(value) and issubclass(value, tfopt.errors.TfoptError)
}
PUBLIC = {"__version__", *CALLS, *RESULTS, *ERRORS}


def test_public_surface():
    assert set(tfopt.__all__) == PUBLIC
    assert len(ERRORS) == 13  # every tfopt error class, so `except tfopt.DataError` works
    for name in PUBLIC:
        assert getattr(tfopt, name) is not None


def test_building_blocks_live_in_their_subpackages():
    for name in ("build", "Plan", "find_batch_size", "make_plan"):
        assert not hasattr(tfopt, name), name
    from tfopt.builder import build
    from tfopt.plan import Plan, make_plan
    from tfopt.recipes import find_batch_size

    assert callable(build) and callable(make_plan) and callable(find_batch_size) and inspect.isclass(Plan)


def test_apply_is_a_function_even_after_its_module_loads():
    import tfopt.optimize

    assert callable(tfopt.apply) and tfopt.DataError is tfopt.errors.DataError


def test_only_package_init_modules_declare_all():
    import pathlib

    package = pathlib.Path(tfopt.__file__).parent
    declaring = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "\n__all__" in "\n" + path.read_text()
    )
    assert declaring == []


def test_import_is_light():
    code = "import sys, tfopt; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.split() == ["False", "False"]
