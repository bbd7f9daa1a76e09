"""Tests of tfopt.recipe_file: strict loading, line-accurate errors, overrides, defaults, saving."""

from __future__ import annotations

import os
import pathlib
import re
import textwrap

import numpy as np
import pytest
import yaml

from tfopt.errors import RecipeFileError
from tfopt.recipe_file import (
    load_recipe,
    parse_override,
    read_recipe,
    recipe_item_settings,
    runtime_settings,
    save_resolved,
)
from tfopt.recipe_file.schema import RuntimeSection
from tfopt.recipes import MixedPrecision

RECIPES_DIR = pathlib.Path(__file__).resolve().parents[2] / "recipes"
# Synthetic data: constructing it touches no disk, so these tests check the file, not the data.
TINY_DATA = "data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}\n"


def write(directory: pathlib.Path, text: str, name: str = "recipe.yaml") -> pathlib.Path:
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(path: pathlib.Path, overrides=()) -> str:
    with pytest.raises(RecipeFileError) as error:
        load_recipe(path, overrides=overrides)
    return str(error.value)


@pytest.mark.parametrize("path", sorted(RECIPES_DIR.glob("*.yaml")), ids=lambda path: path.name)
def test_shipped_recipes_resolve(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TFOPT_DATA_DIR", os.fspath(tmp_path))  # where the embedded dataset is generated
    recipe = load_recipe(path, overrides=["data.image_size=[32, 32]"] if "image_size" in path.read_text() else [])
    assert recipe.name == path.stem or recipe.name == "resnet50"
    names = [item.name for item in recipe.recipes]
    assert names in (
        ["data_pipeline", "mixed_precision", "xla"],
        ["data_pipeline", "mixed_precision", "xla", "distribution"],
        ["data_pipeline", "mixed_precision", "fused_layers", "xla"],  # resnet.yaml: ResNet-50's 53 of each
    )
    assert recipe.report.formats == ("html", "markdown", "json")
    assert set(recipe.to_dict()) == {
        "name",
        "description",
        "runtime",
        "model",
        "data",
        "train",
        "recipes",
        "profile",
        "report",
    }


def test_defaults_are_filled_in(tmp_path):
    recipe = load_recipe(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA))
    resolved = recipe.to_dict()
    assert resolved["train"] == {
        "optimizer": "adam",
        "learning_rate": 0.001,
        "loss": "sparse_categorical_crossentropy",
        "metrics": ["accuracy"],
        "epochs": 1,
        "steps_per_epoch": None,
        "batch_size": 4,
        "seed": 0,
        "checkpoint_every_steps": 100,
    }
    assert resolved["profile"] == {"steps": 20, "warmup_steps": 5, "logdir": None, "tune_budget_seconds": 120.0}
    assert resolved["report"] == {"formats": ["html", "markdown", "json"], "price_per_hour": None}
    assert resolved["recipes"] == "default"
    assert resolved["runtime"] == {  # TensorFlow's own
        "gpu_memory_growth": None,
        "gpu_memory_limit_bytes": None,
        "gpu_thread_mode": None,
        "gpu_thread_count": None,
    }
    assert resolved["model"] == {
        "name": "small_cnn",
        "input_shape": [64, 64, 3],
        "classes": 5,
        "filters": [32, 64, 128],
        "dropout": 0.2,
    }
    assert resolved["data"]["examples"] == 16 and resolved["data"]["seed"] == 0
    assert resolved["name"] == "recipe"


def test_keras_applications_default_to_no_weights_so_nothing_is_downloaded(tmp_path):
    recipe = load_recipe(write(tmp_path, "model: {name: MobileNetV2}\n" + TINY_DATA))
    assert recipe.model.kwargs["weights"] is None
    assert "name" not in recipe.model.kwargs  # keras' own `name` argument is shadowed by model.name
    explicit = load_recipe(write(tmp_path, "model: {name: MobileNetV2, weights: imagenet}\n" + TINY_DATA))
    assert explicit.model.kwargs["weights"] == "imagenet"


def test_scientific_notation_without_a_dot_is_a_float(tmp_path):
    # PyYAML follows YAML 1.1, where `1e-3` is the string '1e-3'.
    recipe = load_recipe(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "train: {learning_rate: 1e-3}\n"))
    assert recipe.train.learning_rate == 0.001


def test_overrides_are_parsed_as_yaml_and_may_create_sections(tmp_path):
    path = write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla: {jit_compile: true}\n")
    recipe = load_recipe(
        path,
        overrides=[
            "train.epochs=3",
            "data.image_size=[4, 6]",
            "profile.steps=4",
            "recipes.0.xla.jit_compile=false",
            "report.price_per_hour=1.5",
        ],
    )
    assert recipe.train.epochs == 3
    assert recipe.data.kwargs["image_size"] == [4, 6]
    assert recipe.profile.steps == 4
    assert recipe.recipes[0].jit_compile is False
    assert recipe.report.price_per_hour == 1.5
    assert recipe.where("train", "epochs") == "--set train.epochs=3"
    assert recipe.where("recipes", 0, "xla", "jit_compile") == "--set recipes.0.xla.jit_compile=false"
    assert recipe.where("model", "name") == f"{path}, line 1"


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.epochs", "expected key.path=value"),
        ("=3", "expected key.path=value"),
        ("train..epochs=3", "expected key.path=value"),
        ("train.epochs=[1, 2", "the value is not valid YAML"),
        ("recipes.3.xla=null", "recipes is a list of 1 items; expected an index from 0 to 0, received '3'"),
        ("model.name.first=x", "model.name is \"small_cnn\", not a mapping, so it has no key 'first'"),
        (
            "train.epochs=-2",
            "train.epochs: -2 is out of range; expected an integer >= 0 and <= 2,147,483,647 (--set train.epochs=-2).",
        ),
        ("train.epocs=2", "Did you mean 'epochs'? Valid: optimizer, learning_rate"),
        ("train.learning_rate=.nan", "train.learning_rate: NaN is out of range; expected a number > 0"),
        ("bogus.key=1", "unknown section 'bogus' (received bogus: {\"key\": 1}). Valid: name"),
        ("profile.logdir=/etc/passwd", "profile.logdir: /etc/passwd is a file, not a directory"),
    ],
)
def test_override_errors_name_the_option(tmp_path, override, message):
    path = write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes: [xla]\n")
    assert message in load_error(path, overrides=[override])


@pytest.mark.parametrize("override", ["bogus.key=1", "profile.logdir=/etc/passwd"])
def test_what_only_an_option_wrote_is_blamed_on_the_option_not_on_the_file(tmp_path, override):
    path = write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA)
    assert load_error(path, overrides=[override]).endswith(f"(--set {override}).")


def test_parse_override_keeps_strings_with_equals_signs():
    assert parse_override("data.path=/data/a=b") == (("data", "path"), "/data/a=b")
    assert parse_override("train.steps_per_epoch=") == (("train", "steps_per_epoch"), None)


ERRORS = [
    # (file text, the key line (1-based) the message must name, a fragment of the message)
    (  # a recipe file's data is a tfopt.data source: said before anything runs, not once the run measures
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - data_pipeline:\n      cache: sometimes\n",
        5,
        "data_pipeline: cache='sometimes' does not apply to a tfopt.data source",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train:\n  epocs: 3\n",
        4,
        "train.epocs: unknown key of train 'epocs' (received epocs: 3). Did you mean 'epochs'?",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train:\n  epochs: three\n",
        4,
        'train.epochs: "three" is a string; expected an integer >= 0',
    ),
    ("model: {name: small_cnn}\n" + TINY_DATA + "train:\n  epochs: 2.5\n", 4, "is a number; expected an integer"),
    ("model: {name: small_cnn}\n" + TINY_DATA + "train:\n  epochs: true\n", 4, "is a boolean; expected an integer"),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train:\n  learning_rate: 0\n",
        4,
        "train.learning_rate: 0 is out of range; expected a number > 0",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "report:\n  formats: [json, pdf]\n",
        4,
        "report.formats: 'pdf' is not one of html, markdown, json",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "profile:\n  tune_budget_seconds: 0\n",
        4,
        "profile.tune_budget_seconds: 0 is out of range; expected a number > 0",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train:\n  checkpoint_every_steps: 0\n",
        4,
        "train.checkpoint_every_steps: 0 is out of range; expected an integer >= 1",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "profle: {steps: 3}\n",
        3,
        "profle: unknown section 'profle' (received profle: {\"steps\": 3}). Did you mean 'profile'?",
    ),
    (
        "model:\n  name: small_cnn\n  filterz: [8]\n" + TINY_DATA,
        3,
        "model.filterz: unknown argument of model small_cnn 'filterz' (received filterz: [8]). Did you mean 'filters'?",
    ),
    (
        "model:\n  name: small_cnn\n  filters: [4, x]\n  dropout: 0.1\n" + TINY_DATA,
        3,
        "model.filters: expected a list of one or more positive integers; received [4, 'x']",
    ),
    ("model:\n  name: text_transformer\n  dropout: 7\n" + TINY_DATA, 3, "model.dropout: expected a rate in [0, 1)"),
    ("model:\n  name: ResNet5\n" + TINY_DATA, 2, "Unknown model 'ResNet5'. Did you mean 'ResNet50'?"),
    (
        "model: {name: small_cnn}\ndata:\n  source: image_foldr\n",
        3,
        "data.source: unknown data source \"image_foldr\". Did you mean 'image_folder'?",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla\n  - mixed_precisio: {}\n",
        5,
        "recipes[1]: Unknown recipe 'mixed_precisio'. Did you mean 'mixed_precision'?",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - mixed_precision:\n      policy: fp16\n",
        5,
        "mixed_precision: policy='fp16' is not a policy",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla:\n      jit: true\n",
        5,
        "recipes[0].xla.jit: xla: unknown setting 'jit' (received jit: True). Did you mean 'jit_compile'?",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla\n  - mixed_precision\n  - xla\n",
        6,
        "appears twice",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train: {optimizer: adamm}\n",
        3,
        "train.optimizer: 'adamm' is not a keras.optimizers name. Did you mean 'adam'?",
    ),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "train: {batch_size: 8}\n",
        3,
        "train.batch_size: 8 differs from data.batch_size: 4",
    ),
    (
        "model: {name: small_cnn}\nmodel: {name: small_cnn}\n" + TINY_DATA,
        2,
        "key model appears twice (first on line 1)",
    ),
    ("model: {name: small_cnn}\n" + TINY_DATA + "name: my run\n", 3, 'name: "my run" cannot name a run directory'),
    ("model:\n  name: !!python/name:os.system\n" + TINY_DATA, 2, "could not determine a constructor for the tag"),
    (
        "model: !!python/object/apply:os.system [echo]\n" + TINY_DATA,
        1,
        "the tag !!python/object/apply:os.system is not allowed",
    ),
    ("model: {name: small_cnn\n" + TINY_DATA, 2, "is not a valid recipe file: while parsing a flow mapping"),
    (TINY_DATA, 1, "The recipe has no `model:` section; it is required"),
    ("- model\n- data\n", 1, "A recipe file must be a mapping of sections"),
    (
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes: everything\n",
        3,
        'recipes: received "everything"; expected a list of recipe items',
    ),
    ("model: {name: small_cnn}\n" + TINY_DATA + "yes: 1\n", 3, "is a boolean, expected a string"),
]


@pytest.mark.parametrize("text, line, fragment", ERRORS, ids=[fragment[:40] for _, _, fragment in ERRORS])
def test_errors_name_the_line_the_key_and_the_fix(tmp_path, text, line, fragment):
    path = write(tmp_path, text)
    message = load_error(path)
    assert fragment in message
    assert f"{path}, line {line}" in message


def test_missing_unreadable_and_empty_files(tmp_path):
    assert "does not exist" in load_error(tmp_path / "nope.yaml")
    assert load_error(tmp_path).endswith("is a directory; expected a YAML recipe file (none is in it).")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "recipe.yaml").write_text("name: a run's resolved recipe\n")
    assert load_error(tmp_path / "run").endswith(f"expected a YAML recipe file, such as {tmp_path}/run/recipe.yaml.")
    assert "is empty" in load_error(write(tmp_path, "# nothing but a comment\n"))
    (tmp_path / "latin1.yaml").write_bytes("model: {name: caf\xe9}\n".encode("latin-1"))
    assert "is not UTF-8" in load_error(tmp_path / "latin1.yaml")


def test_alias_bombs_are_rejected(tmp_path):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for name, previous in zip("bcde", "abcd"):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 10)}]")
    assert "more than 100000 YAML nodes" in load_error(write(tmp_path, "\n".join(lines) + "\n"))


def test_anchors_and_merge_keys_are_plain_yaml_that_works(tmp_path):
    path = write(
        tmp_path,
        """\
        model: {name: small_cnn}
        data: &data {source: synthetic, kind: image, examples: 16, image_size: [8, 8]}
        train:
          <<: {epochs: 3, seed: 7}
          seed: 1
    """,
    )
    recipe = load_recipe(path)
    assert (recipe.train.epochs, recipe.train.seed) == (3, 1)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("recipes: default\n", "default"),
        ("recipes: auto\n", "auto"),
        ("recipes: []\n", ()),
        ("recipes:\n", ()),
        ("recipes: [xla]\n", ("xla",)),
        ("recipes:\n  - xla:\n", ("xla",)),
        ("recipes:\n  - xla: {}\n  - data_pipeline: {cache: none}\n", ("xla", "data_pipeline")),
    ],
)
def test_recipe_item_forms(tmp_path, text, expected):
    recipes = load_recipe(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + text)).recipes
    assert (recipes if isinstance(recipes, str) else tuple(recipe.name for recipe in recipes)) == expected


def test_paths_in_the_file_are_relative_to_it_and_options_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub", "model: {name: small_cnn}\n" + TINY_DATA + "profile: {logdir: logs}\n")
    monkeypatch.chdir(tmp_path)
    assert load_recipe(path).profile.logdir == os.fspath(tmp_path / "sub" / "logs")
    assert load_recipe(path, overrides=["profile.logdir=here"]).profile.logdir == os.fspath(tmp_path / "here")


def test_model_import_paths_are_found_next_to_the_recipe_and_their_arguments_checked(tmp_path):
    write(tmp_path, "def build(units, *, activation='relu'):\n    return None\n", name="recipe_file_models.py")
    base = "model:\n  name: recipe_file_models:build\n"
    recipe = load_recipe(write(tmp_path, base + "  units: 3\n" + TINY_DATA))
    assert recipe.model.kwargs == {"units": 3, "activation": "relu"}
    assert "needs the argument(s) units" in load_error(write(tmp_path, base + TINY_DATA))
    message = load_error(write(tmp_path, base + "  units: 3\n  activaton: tanh\n" + TINY_DATA))
    assert "Did you mean 'activation'?" in message and ", line 4)" in message
    message = load_error(write(tmp_path, "model:\n  name: recipe_file_models:biuld\n" + TINY_DATA))
    assert "has no attribute 'biuld'" in message and "Did you mean 'build'?" in message


def test_data_source_errors_point_at_the_argument(tmp_path):
    message = load_error(
        write(
            tmp_path,
            """\
        model: {name: small_cnn}
        data:
          source: synthetic
          kind: video
    """,
        )
    )
    assert "kind='video' is not a kind of synthetic data" in message and ", line 4)" in message
    message = load_error(
        write(tmp_path, f"model: {{name: small_cnn}}\ndata: {{source: image_folder, path: {tmp_path}/none}}\n")
    )
    assert "image_folder" in message and ", line 2)" in message


def test_data_source_errors_point_at_the_setting_they_are_about_whatever_the_message_says(tmp_path):
    (tmp_path / "empty").mkdir()
    message = load_error(
        write(
            tmp_path,
            """\
        model: {name: small_cnn}
        data:
          source: image_folder
          image_size: [8, 8]
          path: empty
    """,
        )
    )
    # The message never says "path": the source's DataError names the setting.
    assert "has no class folders" in message and not re.search(r"\bpath\b", message)
    assert ", line 5)" in message
    np.savez(tmp_path / "arrays.npz", features=np.zeros((4, 2), "float32"), y=np.arange(4))
    message = load_error(write(tmp_path, "model: {name: small_cnn}\ndata:\n  source: numpy\n  x: arrays.npz\n"))
    # About x_key, which the file leaves to its default: the error points at the section that would hold it.
    assert "has no array named 'x'" in message and ", line 2)" in message
    (tmp_path / "unconverted").mkdir()
    message = load_error(write(tmp_path, "model: {name: small_cnn}\ndata:\n  source: tfrecord\n  path: unconverted\n"))
    assert "holds no tfopt_manifest.json" in message and ", line 4)" in message  # the manifest's error names `path`


@pytest.mark.parametrize(
    "item, fragment",
    [
        ("  - distribution:\n      strategy: horovod\n      devices: [/gpu:0]\n", "devices is only used"),
        (
            "  - batch_size:\n      min_batch_size: 64\n      max_batch_size: 32\n",
            "1 <= min_batch_size <= max_batch_size",
        ),
    ],
)
def test_recipe_errors_point_at_the_setting_to_change_not_the_first_one_named(tmp_path, item, fragment):
    # Both messages name the setting on line 5 too; the error's `setting` is the one on line 6.
    message = load_error(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n" + item))
    assert fragment in message and ", line 6)" in message


def test_a_clash_points_at_the_later_of_the_two_clashing_items(tmp_path, monkeypatch):
    monkeypatch.setattr(
        MixedPrecision, "clash", lambda self, other: "not without distribution" if other.name == "xla" else None
    )
    path = write(
        tmp_path,
        "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla\n  - mixed_precision\n  - distribution\n",
    )
    message = load_error(path)
    # The message names distribution (line 6) too; the clash is between lines 4 and 5.
    assert "xla and mixed_precision cannot be combined: not without distribution" in message
    assert f"{path}, line 5)" in message


def test_save_resolved_round_trips(tmp_path, monkeypatch):
    monkeypatch.setenv("TFOPT_DATA_DIR", os.fspath(tmp_path / "datasets"))
    path = write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes: [xla, mixed_precision]\n")
    recipe = load_recipe(path, overrides=["train.epochs=2"])
    saved = save_resolved(recipe, tmp_path / "resolved.yaml")
    again = load_recipe(saved)
    assert again.to_dict() == recipe.to_dict()
    assert saved.read_text().startswith("# Resolved by tfopt")
    assert yaml.safe_load(saved.read_text())["train"]["epochs"] == 2
    assert sorted(item.name for item in tmp_path.iterdir()) == ["recipe.yaml", "resolved.yaml"]


def test_save_resolved_never_leaves_half_a_file(tmp_path, monkeypatch):
    recipe = load_recipe(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA))
    target = tmp_path / "resolved.yaml"
    target.write_text("earlier run\n")

    def failing_replace(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError):
        save_resolved(recipe, target)
    assert target.read_text() == "earlier run\n"
    assert sorted(item.name for item in tmp_path.iterdir()) == ["recipe.yaml", "resolved.yaml"]


def test_recipe_item_settings_reads_one_item_with_defaults_and_its_line(tmp_path):
    path = write(
        tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - xla\n  - distribution: {strategy: auto}\n"
    )
    settings = recipe_item_settings(read_recipe(path), "distribution")
    assert settings["strategy"] == "auto" and settings["communication_timeout_seconds"] > 0  # defaults filled in
    assert recipe_item_settings(read_recipe(path), "grad_accum") is None
    overridden = read_recipe(path, overrides=["recipes.1.distribution.communication_timeout_seconds=5"])
    assert recipe_item_settings(overridden, "distribution")["communication_timeout_seconds"] == 5
    bad = write(
        tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - distribution:\n      warmup_steps: -1\n"
    )
    with pytest.raises(RecipeFileError, match=r"warmup_steps=-1: expected an integer >= 0 .*line 5\)"):
        recipe_item_settings(read_recipe(bad), "distribution")


def test_the_runtime_section_is_read_without_tensorflow_and_checked_with_its_lines(tmp_path):
    path = write(
        tmp_path,
        "runtime:\n  gpu_memory_growth: false\n  gpu_memory_limit_bytes: 1073741824\n"
        "  gpu_thread_mode: gpu_private\n  gpu_thread_count: 3\n"
        "model: {name: small_cnn}\n" + TINY_DATA,
    )
    settings = {"gpu_memory_growth": False, "gpu_memory_limit_bytes": 2**30, "gpu_thread_mode": "gpu_private"}
    assert runtime_settings(read_recipe(path)) == RuntimeSection(**settings, gpu_thread_count=3)
    assert load_recipe(path).to_dict()["runtime"] == {**settings, "gpu_thread_count": 3}
    assert runtime_settings(read_recipe(write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA))) == RuntimeSection()
    clash = write(
        tmp_path,
        "runtime:\n  gpu_memory_growth: true\n  gpu_memory_limit_bytes: 1073741824\n"
        "model: {name: small_cnn}\n" + TINY_DATA,
    )
    with pytest.raises(RecipeFileError, match=r"exclude each other.*line 2\)"):
        runtime_settings(read_recipe(clash))
    with pytest.raises(
        RecipeFileError, match=r'runtime.gpu_memory_growth: "yes" is a string; expected true or false or null'
    ):
        runtime_settings(read_recipe(path, ["runtime.gpu_memory_growth='yes'"]))
    typo = write(tmp_path, "runtime:\n  gpu_thread_mode: private\nmodel: {name: small_cnn}\n" + TINY_DATA, "typo.yaml")
    with pytest.raises(
        RecipeFileError,
        match=r"runtime.gpu_thread_mode: 'private' is not one of global, gpu_private, gpu_shared. Did you mean "
        r"'gpu_private'\? \(.*typo.yaml, line 2\)\.$",
    ):
        runtime_settings(read_recipe(typo))
    counted = write(tmp_path, "runtime:\n  gpu_thread_count: 3\nmodel: {name: small_cnn}\n" + TINY_DATA, "count.yaml")
    with pytest.raises(RecipeFileError, match=r"gpu_thread_count: 3 needs threads of the GPUs' own.*line 2\)"):
        runtime_settings(read_recipe(counted))
    with pytest.raises(RecipeFileError, match=r"gpu_thread_count: 3 needs threads.*count.yaml, line 2\)"):
        runtime_settings(read_recipe(counted, ["runtime.gpu_thread_mode=global"]))  # global counts no threads
    old_style = write(tmp_path, "model: {name: small_cnn}\n" + TINY_DATA + "recipes:\n  - gpu_memory: {growth: true}\n")
    with pytest.raises(RecipeFileError, match=r"not a recipe.*runtime: \{gpu_memory_growth: true\}.*line 4\)"):
        load_recipe(old_style)


def test_the_command_line_parses_the_file_once_per_run(tmp_path, monkeypatch):
    from tfopt.cli import commands
    from tfopt.recipe_file import loader

    path = write(tmp_path, "runtime: {gpu_memory_growth: true}\nmodel: {name: small_cnn}\n" + TINY_DATA)
    parses = []
    real_read_yaml = loader.read_yaml
    monkeypatch.setattr(loader, "read_yaml", lambda *args: parses.append(args[1]) or real_read_yaml(*args))
    monkeypatch.setattr("tfopt.runtime.configure_gpu_memory", lambda **settings: [])
    args = commands.build_parser().parse_args(["run", str(path), "--set", "train.epochs=2"])
    recipe = commands._load(args, start=True)
    assert parses == [str(path)] and recipe.train.epochs == 2


def test_absurdly_deep_nesting_is_a_recipe_error_not_a_crash(tmp_path):
    path = write(tmp_path, "model: " + "[" * 3000 + "]" * 3000 + "\n")
    assert "nests its values thousands of levels deep" in load_error(path)


def test_a_recipe_named_by_something_else_than_a_path_is_refused():
    with pytest.raises(RecipeFileError, match=r"named by a path .*not a NoneType"):
        load_recipe(None)


def test_a_shape_from_yaml_reaches_the_model_as_the_tuple_keras_compares_with(tmp_path):
    """YAML and the data give lists; keras.applications with imagenet weights compares `input_shape` with a tuple
    and refused [96, 96, 3] ("input_shape should be (96, 96, 3)")."""
    import dataclasses

    import keras

    from tfopt.run.model import create_model, prepare

    recipe = prepare(load_recipe(write(tmp_path, "model: {name: MobileNetV2}\n" + TINY_DATA)))
    received = {}

    def builder(**kwargs):
        received.update(kwargs)
        return keras.Sequential([keras.Input(kwargs["input_shape"]), keras.layers.Flatten(), keras.layers.Dense(2)])

    create_model(dataclasses.replace(recipe, model=dataclasses.replace(recipe.model, builder=builder)))
    assert received["input_shape"] == (8, 8, 3) and isinstance(received["input_shape"], tuple)
