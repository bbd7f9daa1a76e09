"""The notebooks run top to bottom, offline, on this machine's CPU, as committed.

Each notebook has one cell tagged "parameters" that reads `TFOPT_NOTEBOOK_SMOKE`: with it set to 1 (as
here) the notebook runs the same code on tiny sizes. The kernel is "python3", which jupyter_client
starts with the interpreter running these tests (it replaces a kernelspec's bare `python` by
`sys.executable`), so a notebook sees the venv's tfopt and TensorFlow; `test_kernel_runs_this_python`
holds it to that.

Notebooks are committed without outputs (diffs stay readable and no stale numbers are shown as if
current). Executed copies are only kept in pytest's temporary directory.

The install cell does nothing on a local kernel, so its Colab/Kaggle branch is tested apart: its code runs
in this process with the platform faked and `subprocess.run` recorded, so no pip and no network.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need nbformat: pip install -e '.[dev]'")
nbclient = pytest.importorskip("nbclient", reason="notebook tests need nbclient: pip install -e '.[dev]'")
from nbclient.exceptions import CellExecutionError  # noqa: E402

NOTEBOOK_DIR = pathlib.Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
KERNEL_NAME = "python3"
CELL_TIMEOUT_SECONDS = 600


def execute(notebook, workdir, **env):
    """Runs every cell in a fresh kernel started in `workdir`, with TFOPT_NOTEBOOK_SMOKE=1 and `env`.

    Returns the executed notebook; raises nbclient's CellExecutionError at the first failing cell.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    client = nbclient.NotebookClient(
        notebook, kernel_name=KERNEL_NAME, timeout=CELL_TIMEOUT_SECONDS, resources={"metadata": {"path": str(workdir)}}
    )
    environment = {**os.environ, "TFOPT_NOTEBOOK_SMOKE": "1", "TF_CPP_MIN_LOG_LEVEL": "2", **env}
    environment.pop("MPLBACKEND", None)  # the inline backend must draw the plots into the outputs
    environment.pop("COLAB_RELEASE_TAG", None)
    environment.pop("KAGGLE_KERNEL_RUN_TYPE", None)
    return client.execute(env=environment)


def text_of(notebook):
    """All stream and plain-text outputs of the executed notebook, cell by cell."""
    texts = []
    for cell in notebook.cells:
        parts = []
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                parts.append(output.text)
            elif "data" in output:
                parts.append(output.data.get("text/plain", ""))
        texts.append("".join(parts))
    return texts


def outputs_with(notebook, mime):
    return [
        output.data[mime]
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if "data" in output and mime in output.data
    ]


def test_there_are_notebooks():
    assert {path.name for path in NOTEBOOKS} >= {"quickstart.ipynb", "data_pipeline.ipynb", "recipes.ipynb"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.stem)
def test_committed_without_outputs_and_with_a_parameters_cell(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.outputs for cell in code_cells] == [[] for _ in code_cells], "clear the outputs before committing"
    assert {cell.execution_count for cell in code_cells} == {None}
    assert notebook.metadata.kernelspec.name == KERNEL_NAME
    parameters = [cell for cell in code_cells if "parameters" in cell.metadata.get("tags", [])]
    assert len(parameters) == 1 and parameters[0] is code_cells[0], "the first code cell is the parameters cell"
    assert 'os.environ.get("TFOPT_NOTEBOOK_SMOKE") == "1"' in parameters[0].source


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Each notebook executed once (lazily), shared by the checks of its outputs."""
    runs = {}

    def run(name):
        if name not in runs:
            workdir = tmp_path_factory.mktemp(name.replace(".", "_"))
            runs[name] = (execute(nbformat.read(NOTEBOOK_DIR / name, as_version=4), workdir), workdir)
        return runs[name]

    return run


def test_quickstart(executed):
    notebook, workdir = executed("quickstart.ipynb")
    text = "\n".join(text_of(notebook))
    assert "local Jupyter: nothing installed" in text
    summary = re.search(
        r"([\d.]+) -> ([\d.]+) examples/s \(([\d.]+)x \[([\d.]+)-([\d.]+)\][^)]*\) on [^;]+; "
        r".*input efficiency \S+ -> \S+",
        text,
    )
    assert summary, "tfopt.apply's summary line is missing"
    before, after, speedup, low, high = (float(value) for value in summary.groups())
    assert before > 0 and after > 0 and low <= speedup <= high  # the median of the rounds, inside their range
    # The chosen plan is explained for every recipe, and the T4/A100/TPU decisions are the documented ones.
    assert re.search(r"dtype policy '(mixed_bfloat16|mixed_float16|float32)', because ", text)
    runtimes = ("Colab T4", "Kaggle P100", "Kaggle 2x T4", "Colab A100", "Colab TPU v2-8")
    rows = {
        name: line[len(name) :].split()
        for line in text.splitlines()
        for name in runtimes
        if line.startswith(name + " ")
    }
    assert rows == {  # dtype policy, XLA, strategy, global batch (the notebook's batch is 32)
        "Colab T4": ["mixed_float16", "True", "one_device", "32"],
        "Kaggle P100": ["float32", "True", "one_device", "32"],
        "Kaggle 2x T4": ["mixed_float16", "True", "mirrored", "64"],
        "Colab A100": ["mixed_bfloat16", "True", "one_device", "32"],
        "Colab TPU v2-8": ["mixed_bfloat16", "True", "tpu", "256"],
    }
    # The report rendered inline (HTML with its figures) and was saved.
    html = "\n".join(outputs_with(notebook, "text/html"))
    assert "<h1>tfopt report</h1>" in html and html.count("data:image/png;base64,") >= 2
    assert (workdir / "tfopt-report.html").read_text().startswith("<!DOCTYPE html>")
    accuracy = re.search(r"accuracy after 1 epoch\(s\): ([\d.]+) \(chance is 0\.20\)", text)
    assert accuracy and 0.0 <= float(accuracy.group(1)) <= 1.0


def test_data_pipeline(executed):
    notebook, _ = executed("data_pipeline.ipynb")
    text = "\n".join(text_of(notebook))
    verified = json.loads(re.search(r"verified: (\{.*\})", text).group(1).replace("'", '"'))
    assert verified["num_examples"] == 5 * 16 and verified["num_shards"] == 8 and verified["bytes"] > 0
    assert re.search(r"damaged copy rejected: .*part-00003\.tfrecord", text)
    rows = re.findall(
        r"^(naive|naive \+ data_pipeline|TFRecord \+ optimized|compute-only ceiling) +([\d.]+) +",
        text,
        flags=re.MULTILINE,
    )
    assert [name for name, _ in rows] == [
        "naive",
        "naive + data_pipeline",
        "TFRecord + optimized",
        "compute-only ceiling",
    ]
    assert all(float(rate) > 0 for _, rate in rows)
    assert len(outputs_with(notebook, "image/png")) == 1, "the comparison plot is missing"


def test_recipes(executed):
    notebook, workdir = executed("recipes.ipynb")
    text = "\n".join(text_of(notebook))
    assert "my_cnn.yaml: valid." in text
    assert re.search(r"exit code 2: .*mixed_precison.*mixed_precision", text), "the typo was not reported"
    cli_summary = re.search(r"my_cnn: [\d.]+ -> [\d.]+ examples/s \(([\d.]+)x", text)
    assert cli_summary and float(cli_summary.group(1)) > 0
    assert (workdir / "runs" / "cli" / "recipe.yaml").is_file() and (
        workdir / "runs" / "python" / "report.md"
    ).is_file()
    rows = re.findall(
        r"^\| (baseline only|data_pipeline|mixed_precision|default) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+)x \|",
        "\n".join(outputs_with(notebook, "text/markdown")),
        flags=re.MULTILINE,
    )
    assert [row[0] for row in rows] == ["baseline only", "data_pipeline", "mixed_precision", "default"]
    for _, before, after, speedup in rows:
        assert float(speedup) == pytest.approx(float(after) / float(before), abs=0.01)
    assert len(outputs_with(notebook, "image/png")) == 1


def test_a_failing_cell_fails_the_run(tmp_path):
    """A broken copy of the quickstart: the run stops at the broken cell and reports it as a failure."""
    notebook = nbformat.read(NOTEBOOK_DIR / "quickstart.ipynb", as_version=4)
    broken = nbformat.v4.new_code_cell('raise ValueError("deliberately broken cell")')
    notebook.cells.insert(3, broken)
    with pytest.raises(CellExecutionError, match="deliberately broken cell"):
        execute(notebook, tmp_path)
    # Nothing after the broken cell ran.
    later = [cell for cell in notebook.cells[4:] if cell.cell_type == "code"]
    assert [cell.execution_count for cell in later] == [None] * len(later)


def test_kernel_runs_this_python(tmp_path):
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(
                "import os, sys, tfopt\nprint(sys.executable)\nprint(os.environ['TFOPT_NOTEBOOK_SMOKE'])\n"
                "print(tfopt.__file__)"
            )
        ]
    )
    lines = text_of(execute(notebook, tmp_path))[0].split()
    assert os.path.realpath(lines[0]) == os.path.realpath(sys.executable)
    assert lines[1] == "1"
    assert pathlib.Path(lines[2]).resolve().is_relative_to(pathlib.Path(__file__).resolve().parents[1])


INSTALL_HEADING = "## Install (Colab and Kaggle only)"
PLATFORM_VARIABLES = ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "TFOPT_SOURCE")


def install_cell(path):
    """The code cell after the notebook's install heading."""
    cells = nbformat.read(path, as_version=4).cells
    headings = [index for index, cell in enumerate(cells) if cell.source.startswith(INSTALL_HEADING)]
    assert len(headings) == 1, f"{path.name}: one markdown cell starting {INSTALL_HEADING!r}"
    cell = cells[headings[0] + 1]
    assert cell.cell_type == "code"
    return cell.source


def run_install_cell(monkeypatch, source=None, platform="colab", installed=False, environment_source=None):
    """Runs quickstart's install cell here as a Colab/Kaggle/local kernel would, with pip recorded, not run.

    `source` replaces the cell's `TFOPT_SOURCE = ""` line, as a user edits it; `environment_source` is the
    TFOPT_SOURCE environment variable. Returns the commands the cell would have run.
    """
    code = install_cell(NOTEBOOK_DIR / "quickstart.ipynb")
    if source is not None:
        setting = 'TFOPT_SOURCE = ""  # @param {type:"string"}'
        assert setting in code
        code = code.replace(setting, f"TFOPT_SOURCE = {source!r}")
    for name in PLATFORM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    if platform == "colab":
        monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-20260101")
    elif platform == "kaggle":
        monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    if environment_source is not None:
        monkeypatch.setenv("TFOPT_SOURCE", environment_source)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: find_spec(name, *args) if installed or name != "tfopt" else None,
    )
    commands = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kwargs: commands.append((command, kwargs)))
    exec(compile(code, "install cell", "exec"), {"__name__": "__main__", "os": os})  # os: the parameters cell's
    return commands


def test_the_install_cells_are_the_same_in_every_notebook():
    """Each notebook stands alone on Colab, so each carries the cell; the copies must not drift apart."""
    cells = {path.name: install_cell(path) for path in NOTEBOOKS}
    assert len(set(cells.values())) == 1, f"the install cells differ: {sorted(cells)}"
    assert 'TFOPT_SOURCE = ""' in next(iter(cells.values())), "commit the cell with no source of your own"


def test_the_install_cell_without_a_source_says_what_to_set(monkeypatch):
    with pytest.raises(ValueError, match="Set TFOPT_SOURCE") as raised:
        run_install_cell(monkeypatch, platform="colab")
    message = str(raised.value)
    for example in (
        'TFOPT_SOURCE = "git+https://github.com/<owner>/tfopt"',
        '"/content/tfopt-0.1.0-py3-none-any.whl"',
        '"/kaggle/input/<dataset>/tfopt-0.1.0-py3-none-any.whl"',
    ):
        assert example in message
    with pytest.raises(ValueError, match="Set TFOPT_SOURCE"):
        run_install_cell(monkeypatch, platform="kaggle", environment_source="  ")


def test_the_install_cell_installs_from_the_repository_with_the_profile_extra(monkeypatch, capsys):
    url = "git+https://github.com/someone/tfopt@main"
    commands = run_install_cell(monkeypatch, platform="kaggle", environment_source=url)
    assert commands == [([sys.executable, "-m", "pip", "install", "-q", f"tfopt[profile] @ {url}"], {"check": True})]
    assert f"kaggle: installed tfopt from {url}" in capsys.readouterr().out


def test_the_install_cell_installs_an_uploaded_wheel(monkeypatch, tmp_path):
    wheel = tmp_path / "tfopt-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    commands = run_install_cell(monkeypatch, source=str(wheel), platform="colab")
    assert [command[-1] for command, _ in commands] == [f"tfopt[profile] @ {wheel.as_uri()}"]
    # The environment variable wins over the cell's value; a wheel's URL is used as it is.
    url = "https://example.org/releases/tfopt-0.1.0-py3-none-any.whl"
    commands = run_install_cell(monkeypatch, source=str(wheel), environment_source=url)
    assert [command[-1] for command, _ in commands] == [f"tfopt[profile] @ {url}"]


def test_the_install_cell_requirements_are_what_pip_parses():
    """pip reads each requirement as tfopt with the profile extra at that URL: never the bare name `tfopt`."""
    requirements = pytest.importorskip("packaging.requirements")
    for url in ("git+https://github.com/someone/tfopt@v0.1.0", "file:///content/tfopt-0.1.0-py3-none-any.whl"):
        requirement = requirements.Requirement(f"tfopt[profile] @ {url}")
        assert (requirement.name, requirement.extras, requirement.url) == ("tfopt", {"profile"}, url)


def test_the_install_cell_rejects_what_pip_would_misread(monkeypatch, tmp_path):
    missing = tmp_path / "tfopt-0.1.0-py3-none-any.whl"
    with pytest.raises(FileNotFoundError, match=r"no such file\. Upload the wheel first"):
        run_install_cell(monkeypatch, source=str(missing))
    for source in ("https://github.com/someone/tfopt", "tfopt", "tfopt[profile]"):
        with pytest.raises(ValueError, match=r"is neither a git URL nor a wheel\. .*git\+ prefix"):
            run_install_cell(monkeypatch, source=source)


def test_the_install_cell_installs_nothing_where_tfopt_is_there(monkeypatch, capsys):
    assert run_install_cell(monkeypatch, platform="colab", installed=True) == []
    assert "colab: tfopt is already installed" in capsys.readouterr().out
    assert run_install_cell(monkeypatch, platform="local") == []  # no source needed on a local kernel
    assert "local Jupyter: nothing installed" in capsys.readouterr().out
