"""Every environment variable tfopt reads is held to what it must be, and its error names it: read directly, and
as a user meets it, in a `tfopt-recipe` command started with the variable set."""

import pathlib
import subprocess
import sys

import pytest

from tests.processes import child_environment
from tfopt.distribute.environment import detect_environment
from tfopt.environment_variables import MOST_CHARACTERS, directory, integer, text
from tfopt.errors import EnvironmentVariableError
from tfopt.recipe_file.reader import MOST_BYTES

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_DATA = "model: {name: small_cnn, filters: [4]}\ndata: {source: image_folder, batch_size: 4}\n"
TINY = (
    "model: {name: small_cnn, filters: [4]}\n"
    "data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}\n"
)


def test_integer_reads_numbers_and_names_the_variable_otherwise():
    assert integer("N", default=3, environ={}) == 3
    assert integer("N", default=3, environ={"N": ""}) == 3  # `N=` unsets, as shells write it
    assert integer("N", default=3, environ={"N": " 7 "}) == 7
    with pytest.raises(EnvironmentVariableError, match=r"N='-1' is below 0: expected an integer >= 0") as raised:
        integer("N", default=3, environ={"N": "-1"})
    assert raised.value.variable == "N"
    with pytest.raises(EnvironmentVariableError, match=r"N='2.5' is not an integer.*unset N"):
        integer("N", default=3, environ={"N": "2.5"})


def test_text_refuses_a_value_no_setting_needs():
    assert text("X", environ={"X": "a" * MOST_CHARACTERS}) == "a" * MOST_CHARACTERS
    with pytest.raises(EnvironmentVariableError, match="X holds 65,537 characters"):
        text("X", environ={"X": "a" * (MOST_CHARACTERS + 1)})


def test_directory_is_made_and_every_unusable_path_named(tmp_path):
    made = directory("D", purpose="things", environ={"D": str(tmp_path / "new" / "dir")})
    assert made == tmp_path / "new" / "dir" and made.is_dir()
    assert directory("D", purpose="things", environ={}) is None
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    cases = {
        str(tmp_path / "file"): "is a file: expected a directory tfopt can write things into",
        str(tmp_path / "dangling"): f"is a link to {str(tmp_path / 'gone')!r}, which does not exist",
        str(tmp_path / "file" / "below"): "cannot be made (Not a directory)",
        str(tmp_path) + "/\ud800": "cannot be encoded for the file system",  # a YAML "\ud800" escape, say
    }
    for value, problem in cases.items():
        with pytest.raises(EnvironmentVariableError) as raised:
            directory("D", purpose="things", environ={"D": value})
        assert problem in str(raised.value) and str(raised.value).startswith("The environment variable D="), value


@pytest.mark.parametrize(
    ("environ", "words"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "four"}, "SLURM_NTASKS='four' is not an integer"),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_PROCID": "-1"}, "SLURM_PROCID='-1' is below 0"),
        ({"HOROVOD_SIZE": "2", "HOROVOD_RANK": "one"}, "HOROVOD_RANK='one' is not an integer"),
        ({"TF_CONFIG": '{"cluster": ["127.0.0.1:1"], "task": {}}'}, "TF_CONFIG's cluster is a list"),
        ({"TF_CONFIG": '{"cluster": {"worker": "127.0.0.1:1"}, "task": {}}'}, "TF_CONFIG's cluster.worker is"),
        ({"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1"]}, "task": {}}'}, "'127.0.0.1' is not host:port"),
        (
            {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": "x"}}'},
            "TF_CONFIG's task.index is 'x'",
        ),
        ({"TF_CONFIG": '{"cluster": {"worker": ["h:1"]}, "task": "worker"}'}, "TF_CONFIG's task is a str"),
    ],
    ids=["slurm-tasks", "slurm-procid", "horovod-rank", "cluster-list", "workers-str", "no-port", "index", "task"],
)
def test_cluster_variables_are_checked_where_they_are_read(environ, words):
    with pytest.raises(EnvironmentVariableError) as raised:
        detect_environment(environ)
    assert words in str(raised.value)


def run_cli(tmp_path, recipe, environ, *extra, command="validate"):
    (tmp_path / "recipe.yaml").write_text(recipe)
    return subprocess.run(
        [sys.executable, "-m", "tfopt.cli", command, str(tmp_path / "recipe.yaml"), *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**child_environment(), **environ},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("command", "recipe", "variable", "value", "words"),
    [
        ("validate", DEFAULT_DATA, "TFOPT_DATA_DIR", "{file}", "TFOPT_DATA_DIR='{file}' is a file"),
        ("run", TINY, "TF_CONFIG", '{"cluster": {"worker": ["h"]}, "task": {}}', "'h' is not host:port"),
        ("run", TINY, "SLURM_NTASKS", "many", "SLURM_NTASKS='many' is not an integer"),
    ],
    ids=["data-dir-a-file", "tf-config", "slurm"],
)
def test_a_command_names_the_variable_in_one_paragraph(tmp_path, command, recipe, variable, value, words):
    (tmp_path / "afile").write_text("x")
    value = value.replace("{file}", str(tmp_path / "afile"))
    environ = {variable: value, **({"SLURM_JOB_ID": "1"} if variable.startswith("SLURM") else {})}
    out = ["--out", str(tmp_path / "run")] if command == "run" else []
    finished = run_cli(tmp_path, recipe, environ, *out, command=command)
    assert finished.returncode == 2, finished.stderr
    assert not (tmp_path / "run").exists()  # nothing was started
    assert words.replace("{file}", str(tmp_path / "afile")) in finished.stderr
    assert "Traceback" not in finished.stderr and "may be a bug" not in finished.stderr
    assert len(finished.stderr.strip().splitlines()) == 1


def test_set_values_meet_the_limits_of_recipe_files(tmp_path):
    laughs = "[" + ", ".join(f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 8)) + "]"
    cases = {
        f"data.examples=[&l0 [1, 1, 1, 1, 1, 1, 1, 1, 1], {laughs[1:]}": "expands to more than 100000 YAML nodes",
        "data.examples=" + "[" * 5000 + "]" * 5000: "nests its values thousands of levels deep",
        "data.examples={a: 1, a: 2}": "key a appears twice",
        "data.examples=" + "1" * (MOST_BYTES + 1): "longer than the 100,000 bytes a recipe file may hold",
    }
    for option, words in cases.items():
        finished = run_cli(tmp_path, TINY, {}, "--set", option)
        assert finished.returncode == 2, (option[:40], finished.stderr)
        assert words in finished.stderr and "--set data.examples" in finished.stderr, (option[:40], finished.stderr)
        assert "Traceback" not in finished.stderr


def test_nothing_here_reads_the_environment_directly():
    """Every variable tfopt reads goes through tfopt.environment_variables (or a parser that names it)."""
    allowed = {
        "tfopt/environment_variables.py",
        "tfopt/cli/quiet_start.py",  # TF_CPP_MIN_LOG_LEVEL: any value is TensorFlow's to read
        "tfopt/runtime.py",  # TF_FORCE_GPU_ALLOW_GROWTH: TensorFlow's own, read as TensorFlow reads it
        "tfopt/run/directory.py",  # tfopt's own lock marker, set by tfopt for its child processes
    }
    readers = [
        str(path.relative_to(REPO))
        for path in (REPO / "tfopt").rglob("*.py")
        if ("os.environ.get(" in path.read_text() or "os.getenv(" in path.read_text())
        and str(path.relative_to(REPO)) not in allowed
    ]
    assert readers == []
