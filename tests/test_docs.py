"""The examples in README.md and docs/ run: Python snippets execute, YAML snippets load as recipes, commands parse.

- Every ```python block of a page runs, in order, in one namespace per page (like a notebook), from a
  temporary directory. The namespace starts with what the pages say their snippets assume: `tfopt`,
  `keras`, `tf`, `np`, a tiny compiled CNN `model` and a small batched `dataset` of 16x16 images with
  labels (`make_model()` makes a fresh model). A block that cannot run here (several hosts, a GPU)
  is fenced as ```python no-run: <why>``` and the reason is required.
- Every ```yaml block is a recipe file or a part of one: a part is laid over a small complete recipe and
  the result must load with `tfopt.recipe_file.load_recipe`, as `tfopt-recipe validate` does.
- Every `tfopt-recipe ...` line of a ```bash block must parse with the command's own argument parser.
- Every relative link between the pages points at a file that exists.
"""

import pathlib
import re
import shlex

import pytest
import yaml

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
DOCS = REPOSITORY / "docs"
PAGES = [REPOSITORY / "README.md", *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
BASE_RECIPE = {
    "name": "docs_snippet",
    "model": {"name": "small_cnn", "filters": [8]},
    "data": {"source": "synthetic", "kind": "image", "batch_size": 8},
    "train": {"epochs": 0},
}
# A figure names the machine as `tfopt.hardware.detect().describe()` writes it, not "a 2-core CPU" everywhere.
MEASURED_ON = re.compile(r"measured on (.{0,100})", re.IGNORECASE)
HARDWARE = re.compile(r"CPU: [^,]+, \d+ cores|\d+x [^(]+ \(cc \d+\.\d+|TPU: \d+ cores")
# What may stand between "measured on" and the machine: a few words opening a parenthesis, e.g. "measured on
# this project's machine (CPU: ...", never a sentence.
NAMED_MACHINE = re.compile(r"[^.;:]{0,40}?(?:" + HARDWARE.pattern + ")")
# A card without figures says so instead of naming a machine.
NOT_MEASURED = "Not measured: "
CARDS = (
    "mixed_precision",
    "xla",
    "data_pipeline",
    "tfrecord",
    "distribution",
    "batch_size",
    "grad_accum",
    "data_service",
    "fused_layers",
    "steps_per_execution",
)


def blocks(page, language):
    """(info string, code, line number) of each fenced block of `language` on a page."""
    text = page.read_text()
    return [
        (match.group(1).strip(), match.group(2), text[: match.start()].count("\n") + 1)
        for match in FENCE.finditer(text)
        if match.group(1).strip().split(" ")[0] == language
    ]


def page_id(page):
    return str(page.relative_to(REPOSITORY))


def test_every_recipe_has_a_method_card_and_the_guides_exist():
    assert {path.stem for path in (DOCS / "recipes").glob("*.md")} >= set(CARDS)
    assert (DOCS / "reading-the-report.md").is_file() and (DOCS / "troubleshooting.md").is_file()
    for name in CARDS:
        text = (DOCS / "recipes" / f"{name}.md").read_text()
        assert MEASURED_ON.search(" ".join(text.split())) or NOT_MEASURED in text, (
            f"{name}.md: say which hardware its numbers were measured on, or '{NOT_MEASURED}<why>' where it has none"
        )
        for heading in ("## When it helps", "## When it hurts", "## Use it", "## Interactions", "## References"):
            assert heading in text, f"{name}.md lacks the section {heading!r}"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_figure_names_the_machine_it_was_measured_on(page):
    for measured in MEASURED_ON.findall(" ".join(page.read_text().split())):
        assert NAMED_MACHINE.match(measured), (
            f"{page_id(page)}: 'measured on {measured[:60]}...' names no machine as tfopt.hardware.detect().describe() "
            "writes it (CPU: <model>, <n> cores / <n>x <GPU> (cc ...) / TPU: ...)"
        )


def test_the_machine_pattern_takes_describe_and_rejects_vague_claims():
    assert NAMED_MACHINE.match("this project's machine (CPU: AMD EPYC, 2 cores with bf16 instructions")
    assert NAMED_MACHINE.match("1x NVIDIA H100 80GB HBM3 (cc 9.0, 79.1 GiB); CPU: Intel Xeon, 16 cores")
    for vague in (
        "this project's 2-core CPU (TF 2.21)",
        "an H100 host, the tf.data guide's case",
        "a GPU. Nothing else: CPU: AMD EPYC, 2 cores",
    ):
        assert not NAMED_MACHINE.match(vague), vague


def test_the_hardware_pattern_is_what_describe_writes():
    from tests.conftest import FAKE_HARDWARE

    for hardware in FAKE_HARDWARE.values():
        assert HARDWARE.match(hardware.describe()), hardware.describe()


def make_model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(5, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def snippet_namespace():
    import keras
    import numpy as np
    import tensorflow as tf

    import tfopt

    rng = np.random.default_rng(0)
    images = rng.random((128, 16, 16, 3), dtype=np.float32)
    labels = rng.integers(0, 5, 128).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(16)
    return {
        "__name__": "__docs__",
        "tfopt": tfopt,
        "keras": keras,
        "tf": tf,
        "np": np,
        "model": make_model(),
        "dataset": dataset,
        "make_model": make_model,
    }


SNIPPET_PAGES = [page for page in PAGES if blocks(page, "python") or blocks(page, "yaml")]


def _merge(base, part):
    """`part`'s sections over `base`'s; a data section replaces the base's whole (another source)."""
    merged = dict(base)
    for key, value in part.items():
        mergeable = key != "data" and isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = {**base[key], **value} if mergeable else value
    return merged


def check_yaml(code, where, directory):
    """Loads a YAML snippet as a recipe (laid over BASE_RECIPE when it is only a part of one)."""
    from tfopt.recipe_file import load_recipe

    part = yaml.safe_load(code)
    assert isinstance(part, dict), f"{where}: a YAML snippet is a recipe file or a part of one (a mapping)"
    recipe = part if {"model", "data"} <= set(part) else _merge(BASE_RECIPE, part)
    path = directory / "snippet.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    loaded = load_recipe(path)
    if isinstance(part.get("recipes"), list):
        assert len(loaded.recipes) == len(part["recipes"]), where


@pytest.mark.parametrize("page", SNIPPET_PAGES, ids=page_id)
def test_snippets_run(page, tmp_path, monkeypatch):
    """The page's Python blocks in order, then its YAML blocks, in one directory (YAML may name files
    the Python wrote, as a reader following the page would have them)."""
    monkeypatch.chdir(tmp_path)
    for variable in ("TF_GPU_THREAD_MODE", "TF_GPU_THREAD_COUNT"):  # snippets set them: put back after the test
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    namespace = snippet_namespace()
    for info, code, line in blocks(page, "python"):
        where = f"{page_id(page)}:{line}"
        if info.startswith("python no-run"):
            assert re.match(r"python no-run: \S", info), f"{where}: say why it cannot run here"
            compile(code, where, "exec")  # it must still be valid Python
            continue
        exec(compile(code, where, "exec"), namespace)
    for _, code, line in blocks(page, "yaml"):
        check_yaml(code, f"{page_id(page)}:{line}", tmp_path)


COMMANDS = [
    pytest.param(command, id=f"{page_id(page)}:{line}")
    for page in PAGES
    for _, code, line in blocks(page, "bash")
    for command in code.splitlines()
    if command.startswith("tfopt-recipe ")
]


@pytest.mark.parametrize("command", COMMANDS)
def test_commands_parse(command):
    from tfopt.cli import build_parser

    arguments = shlex.split(command.split(" #")[0])[1:]
    parsed = build_parser().parse_args(arguments)
    assert parsed.handler is not None


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page_id(page)} links to missing {target}"
