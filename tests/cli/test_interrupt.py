"""SIGTERM stops a command within seconds in every phase of a run, with what it made kept: the watcher's
deadline where TensorFlow holds the main thread, and `tfopt-recipe run` signalled while it measures,
profiles and trains, then resumed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.processes import REPO, child_environment
from tfopt.cli.interrupt import GRACE_SECONDS

# Kubernetes and Slurm send SIGKILL 30 s (or less) after SIGTERM; a run stops well inside that.
DEADLINE_SECONDS = 5.0

HELD_IN_TENSORFLOW = textwrap.dedent("""
    import sys
    import tensorflow as tf
    from tfopt.cli.interrupt import signals_interrupt

    def farewell(name):
        print(f"said: interrupted ({name})", flush=True)
        return 143

    with signals_interrupt(farewell):
        print("waiting", flush=True)
        if sys.argv[1] == "tensorflow":  # a C++ wait that never returns, as a long XLA compilation holds it
            tf.queue.FIFOQueue(1, tf.int32).dequeue()
        else:
            import time
            time.sleep(600)
""")


def _signalled_while_waiting(source: str, *arguments: str, signal_it=None) -> tuple[int, str, str, float]:
    """Runs `source`, and once it says "waiting", `signal_it(process)` (by default one SIGTERM). Returns its exit
    code, stdout, stderr and the seconds from its (last) signal to its end."""
    process = subprocess.Popen(
        [sys.executable, "-c", source, *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_environment(TF_CPP_MIN_LOG_LEVEL="3"),
    )
    try:
        assert process.stdout.readline().strip() == "waiting", process.stderr.read()[-2000:]
        (signal_it or (lambda waiting: waiting.send_signal(signal.SIGTERM)))(process)
        signalled = time.monotonic()
        code = process.wait(timeout=60)
        seconds = time.monotonic() - signalled
        out, err = process.communicate()
    finally:
        process.kill()
    return code, out, err, seconds


@pytest.mark.parametrize("held_in", ["tensorflow", "python"])
def test_sigterm_ends_a_command_within_the_deadline_wherever_the_main_thread_is(held_in):
    """Held in TensorFlow's C++, the main thread never sees the signal: the watcher reports it and ends the
    process after the grace period. In Python, the main thread raises RunInterrupted at once and the
    watcher stays silent."""

    def inside_the_wait(process):
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)

    code, out, err, seconds = _signalled_while_waiting(HELD_IN_TENSORFLOW, held_in, signal_it=inside_the_wait)
    assert seconds < DEADLINE_SECONDS
    if held_in == "tensorflow":
        assert code == 143 and out.strip() == "said: interrupted (SIGTERM)"
        assert seconds >= GRACE_SECONDS  # the main thread had its chance to clean up first
    else:
        assert code == 1 and out == "" and "RunInterrupted: SIGTERM" in err
        assert seconds < GRACE_SECONDS


CLEANING_UP = textwrap.dedent("""
    import time
    import tensorflow as tf
    from tfopt.cli.interrupt import GRACE_SECONDS, signals_interrupt
    from tfopt.errors import RunInterrupted

    def farewell(name):
        print(f"said: interrupted ({name})", flush=True)
        return 143

    try:
        with signals_interrupt(farewell):
            square = tf.random.normal([4000, 4000])
            tf.linalg.matmul(square, square)  # traced and warmed up
            try:
                print("waiting", flush=True)  # inside the try: the signal may come at the very next bytecode
                # A TensorFlow op of about half a second, out of Python: the watcher reads the signal first, and
                # the main thread sees it only once the op returns, well within the grace.
                tf.linalg.matmul(square, square).numpy()
                time.sleep(600)
            except RunInterrupted:
                time.sleep(GRACE_SECONDS + 2)  # stopping workers, writing a checkpoint: longer than the grace
                print("cleaned up", flush=True)
                raise
    except RunInterrupted:
        raise SystemExit(143)
""")


def test_a_main_thread_that_saw_the_signal_has_its_cleanup_time_past_the_grace():
    """The watcher reads the signal before the main thread's handler runs: it must ask whether the main
    thread saw it after the grace, or a cleanup longer than the grace (workers stopped under load) was cut
    short and the workers outlived the launcher."""
    code, out, err, _ = _signalled_while_waiting(CLEANING_UP)
    assert (code, out.strip()) == (143, "cleaned up"), err[-2000:]


BURST = textwrap.dedent("""
    import time
    from tfopt.cli.interrupt import signals_interrupt
    from tfopt.errors import RunInterrupted

    def farewell(name):
        print(f"said: interrupted ({name})", flush=True)
        return 1

    try:
        with signals_interrupt(farewell):
            try:
                print("waiting", flush=True)
                time.sleep(600)
            except RunInterrupted:
                time.sleep(1)  # stopping workers, writing a checkpoint
                print("cleaned up", flush=True)
                raise
    except RunInterrupted:
        raise SystemExit(143)
""")


def test_a_burst_of_signals_is_one_interruption_with_its_cleanup():
    """A parent killed with SIGKILL sends its children their death signal once for each of its threads as they
    end: a worker got SIGTERM three times at once, its handler ran inside itself and deadlocked on a lock its
    outer run held. The burst is one interruption: the cleanup runs once, to its end, and the process ends
    within the deadline."""

    def burst(process):
        until = time.monotonic() + 0.5  # signals coalesce while pending: these come while it handles them
        while time.monotonic() < until:
            process.send_signal(signal.SIGTERM)

    code, out, err, seconds = _signalled_while_waiting(BURST, signal_it=burst)
    assert (code, out.strip()) == (143, "cleaned up"), err[-2000:]
    assert seconds < DEADLINE_SECONDS


DEFERRED_BURST = textwrap.dedent("""
    import os, signal, time
    from tfopt.cli.interrupt import signals_interrupt
    from tfopt.errors import RunInterrupted
    from tfopt.training.stopping import stops_at_step_ends

    try:
        with signals_interrupt(lambda name: 1):
            try:
                with stops_at_step_ends():  # training: the first signal is taken at the step's end
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.1)
            except RunInterrupted:
                os.kill(os.getpid(), signal.SIGTERM)  # the burst's next, while the checkpoint is written
                time.sleep(0.5)
                print("cleaned up", flush=True)
                raise
    except RunInterrupted:
        raise SystemExit(143)
""")


def test_a_burst_of_signals_taken_at_a_training_steps_end_is_one_interruption_too():
    """The first signal of the burst is deferred to the step's end; the next ones must not cut the cleanup
    (the checkpoint of the steps trained) short either."""
    finished = subprocess.run(
        [sys.executable, "-c", DEFERRED_BURST], capture_output=True, text=True, env=child_environment(), timeout=120
    )
    assert (finished.returncode, finished.stdout.strip()) == (143, "cleaned up"), finished.stderr[-2000:]


RECIPE = (
    "model: {name: small_cnn, filters: [4]}\n"
    "data: {source: synthetic, kind: image, examples: 64, image_size: [16, 16], batch_size: 4}\n"
    "recipes: [data_pipeline, {xla: {jit_compile: true}}]\n"
    "profile: {steps: 20, warmup_steps: 2}\n"
    "train: {epochs: 2, steps_per_epoch: 2000, checkpoint_every_steps: 100000}\n"
)


def _run(*arguments) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tfopt.cli", "run", *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=child_environment(TF_CPP_MIN_LOG_LEVEL="2"),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "line",
    [
        "  measuring 3 setups side by side (2 warm-up + 20 steps each)",  # XLA compiles the third's step
        "  profiling before (2 warm-up + 20 steps under the TF Profiler)",
        "tfopt-recipe: training 2 epoch(s)",
    ],
    ids=["measuring_and_compiling", "profiling", "training"],
)
def test_sigterm_in_each_phase_of_a_run_stops_it_within_seconds_with_nothing_lost(tmp_path, line):
    """Signalled as a phase begins, the run ends within the deadline with exit code 143. Stopped before any
    output it leaves no run directory behind; else it says how to resume, and resumed it finishes. While
    training, it keeps the steps trained in a checkpoint of its own (the periodic ones are 100,000 steps
    apart), from which the resumed run goes on."""
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    run_dir = tmp_path / "run"
    process = _run(tmp_path / "recipe.yaml", "--out", run_dir)
    try:
        seen = []
        for said in process.stderr:
            seen.append(said.rstrip("\n"))
            if seen[-1] == line:
                break
        assert seen and seen[-1] == line, "\n".join(seen)[-3000:]
        time.sleep(0.1 if line.startswith("  ") else 1.0)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=60)
        seconds = time.monotonic() - signalled
        rest = process.stderr.read()
    finally:
        process.kill()
    assert seconds < DEADLINE_SECONDS and code == 143, rest[-3000:]
    said = rest.strip().splitlines()[-1]
    if not run_dir.exists():  # stopped before its first output: it made nothing to resume
        assert said == "tfopt-recipe: interrupted (SIGTERM)." and not line.startswith("tfopt-recipe: training")
        return
    assert said == (
        f"tfopt-recipe: interrupted (SIGTERM). The outputs so far are in {run_dir}; "
        f"`tfopt-recipe run {tmp_path / 'recipe.yaml'} --out {run_dir} --resume` continues the run."
    )
    assert not [path for path in run_dir.rglob("*") if ".tmp" in path.name]
    # A stop is taken at the end of a step, timed, profiled or trained (or ends the process after the grace
    # period): signalled as profiling begins, the run ends at a profiled step (it went on to train, then stopped),
    # this capture's or, where its steps were done already, the next one's.
    if "profiling" in line:
        assert "tfopt-recipe: training" not in rest, rest[-3000:]
    stopped_at = None
    if (run_dir / "checkpoints" / "checkpoint").exists():
        newest = (run_dir / "checkpoints" / "checkpoint").read_text().split('"')[1]
        stopped_at = int(newest.rsplit("-", 1)[1])
        assert 0 < stopped_at < 4000 and stopped_at % 2000  # mid-epoch: the interruption's own checkpoint
    if line.startswith("tfopt-recipe: training"):
        assert stopped_at is not None
    resumed = _run(tmp_path / "recipe.yaml", "--out", run_dir, "--resume", "--quiet")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-3000:]
    training = json.loads((run_dir / "training.json").read_text())
    assert training["complete"] and training["global_step"] == 4000
    assert training["resumed_from_step"] == (stopped_at or 0)


def test_the_interruption_message_goes_below_the_bars_an_interrupted_fit_left_open(capsys):
    """Keras ends no callback when fit raises: the tqdm bars are closed before the message, not drawn over it."""
    import argparse
    import io

    from tqdm import tqdm

    from tfopt.cli.commands import _report_interrupt

    screen = io.StringIO()
    bar = tqdm(total=10, file=screen)
    bar.update(3)
    code = _report_interrupt(KeyboardInterrupt(), argparse.Namespace(file="recipe.yaml"))
    assert code == 128 + signal.SIGINT and bar.disable  # closed: tqdm disables a bar it has closed
    assert "interrupted (SIGINT)" in capsys.readouterr().err
