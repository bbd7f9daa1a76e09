"""Looking at this machine's processes from tests that start and stop them (Linux /proc)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def child_environment(**overrides: str) -> dict[str, str]:
    """This process' environment for a child Python, with this checkout first on PYTHONPATH and what was
    there kept (on the GPU machine TensorFlow itself comes through PYTHONPATH)."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **overrides}


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its parent to reap it counts as gone)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: list[int], seconds: float = 30.0) -> list[int]:
    """Waits up to `seconds` for the processes to end; returns those still alive."""
    deadline = time.monotonic() + seconds
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def processes_with(*words: str) -> list[int]:
    """The live processes whose command line holds every word as one of its arguments."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit() and alive(int(entry.name)):
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if all(word.encode() in command for word in words):
                found.append(int(entry.name))
    return found


def kill_all(process: subprocess.Popen, pids: list[int]) -> None:
    """Leaves nothing a test started running: `process` and the other processes `pids` (SIGKILL)."""
    process.kill()
    process.wait(timeout=30)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_waiting(command: list[str], *, env: dict[str, str], sigterm_once=None) -> tuple[int, str, float | None]:
    """Runs a command that waits on something that never comes; with `sigterm_once` (a function saying whether
    it waits yet), sends it SIGTERM once it waits. Returns its exit code, its stderr, and the seconds from the
    signal to its end (None without a signal). Nothing it started outlives the call."""
    import sys

    run = subprocess.Popen(
        [sys.executable, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    signal_sent = None
    try:
        if sigterm_once is not None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and run.poll() is None and not sigterm_once():
                time.sleep(0.2)
            signal_sent = time.monotonic()
            run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
        run.wait(timeout=30)
    return run.returncode, err, None if signal_sent is None else time.monotonic() - signal_sent
