"""The examples in tfopt's docstrings run, and every public name has one.

Every module of the package is imported and its docstring examples are run with `doctest`, in the
module's own namespace, from a temporary working directory that links the repository's `recipes/`
(examples name `recipes/small_cnn.yaml` as a user in a clone would; files they write land in the
temporary directory). An example that needs a real model, data or hardware says `# doctest: +SKIP` and is
skipped by doctest itself, line by line; everything else must run and print what it shows.

"Public" means a function or class named in an `__all__` (the package's, a subpackage's or a
module's), named by the first module (in sorted order) that lists it; only package `__init__` modules
declare `__all__`. `MISSING_EXAMPLES` is the list of those without an example today; it may only shrink:
a new public name without an example fails, and so does a name that gained one but is still listed.
`KNOWN_FAILING` lists docstring examples that do not run today, each with the reason; they are
strict xfails, so each one fails the suite as soon as it is fixed (then delete its entry).
"""

import doctest
import importlib
import inspect
import os
import pathlib
import pkgutil

import pytest

import tfopt

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
MODULES = sorted(module.name for module in pkgutil.walk_packages(tfopt.__path__, "tfopt.")) + ["tfopt"]
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

KNOWN_FAILING: dict[str, str] = {}

# Public names that need no example of their own: the error classes (each is shown where it is raised,
# in the Raises: section of the functions that raise it).
MISSING_EXAMPLES: set[str] = set()


def docstring_tests(module_name):
    module = importlib.import_module(module_name)
    return [test for test in doctest.DocTestFinder().find(module, module_name) if test.examples]


def all_docstring_tests():
    return [(module, test.name) for module in MODULES for test in docstring_tests(module)]


def _param(module, name):
    if name in KNOWN_FAILING:
        return pytest.param(module, name, id=name, marks=pytest.mark.xfail(reason=KNOWN_FAILING[name], strict=True))
    return pytest.param(module, name, id=name)


@pytest.mark.parametrize(("module_name", "test_name"), [_param(*pair) for pair in all_docstring_tests()])
def test_docstring_example(module_name, test_name, tmp_path, monkeypatch):
    (tmp_path / "recipes").symlink_to(REPOSITORY / "recipes", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TFOPT_DATA_DIR", os.environ.get("TFOPT_DATA_DIR", str(tmp_path / "datasets")))
    (test,) = [test for test in docstring_tests(module_name) if test.name == test_name]
    output = []
    result = doctest.DocTestRunner(optionflags=OPTIONS).run(test, out=output.append, clear_globs=True)
    assert result.failed == 0, "".join(output)


def test_known_failing_entries_still_exist():
    names = {name for _, name in all_docstring_tests()}
    assert set(KNOWN_FAILING) <= names, f"delete these entries: {sorted(set(KNOWN_FAILING) - names)}"


def public_objects():
    """Qualified name -> object of every function and class named in an `__all__` of the package."""
    found = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            value = getattr(module, name, None)
            if inspect.isfunction(value) or inspect.isclass(value):
                found.setdefault(f"{module_name}.{name}", value)
    return found


def has_example(value):
    return ">>>" in (inspect.getdoc(value) or "")


def test_every_public_name_has_a_docstring():
    undocumented = sorted(name for name, value in public_objects().items() if not inspect.getdoc(value))
    assert undocumented == []


def test_public_names_without_an_example_only_shrink():
    missing = {
        name
        for name, value in public_objects().items()
        if not has_example(value) and not (inspect.isclass(value) and issubclass(value, Exception))
    }
    new = sorted(missing - MISSING_EXAMPLES)
    assert not new, f"public names without a docstring example (add one, with +SKIP if it needs real data): {new}"
    fixed = sorted(MISSING_EXAMPLES - missing)
    assert not fixed, f"these have an example now (or are no longer public): delete them from MISSING_EXAMPLES: {fixed}"


def test_every_recipe_has_an_example():
    from tfopt import registry

    recipes = {name: registry.get(name) for name in registry.names()}
    assert {name: has_example(recipe) for name, recipe in recipes.items()} == dict.fromkeys(recipes, True)
