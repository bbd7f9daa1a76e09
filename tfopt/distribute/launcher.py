"""Runs N training workers on this machine over 127.0.0.1, as a cluster of hosts would.

Each worker is the same command with its own TF_CONFIG (free loopback ports picked here), its output
prefixed with "[worker i]". The launcher never hangs on a dead worker: when one exits with an error,
the others get `failure_grace_seconds` to fail by themselves (tfopt's collective timeout makes them
raise a clear DistributionError), then they are stopped, and the launcher raises naming the worker that
failed first.

No worker outlives the launcher. Whatever ends the wait (an error, Ctrl-C, or a SIGTERM that the
caller turned into an exception, as `tfopt-recipe` does) stops every worker's process group: SIGTERM,
then SIGKILL. A launcher killed outright (SIGKILL) cannot clean up, so on Linux each worker asks the
kernel for a SIGTERM when its launcher dies (`PR_SET_PDEATHSIG`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from tfopt.errors import DistributionError

_POLL_SECONDS = 0.2
_TERMINATE_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """How every worker of a successful launch ended.

    Attributes:
        returncodes: Each worker's exit code, by worker index (all 0).
        tf_configs: The TF_CONFIG each worker was given, by worker index.
    """

    returncodes: tuple[int, ...]
    tf_configs: tuple[str, ...]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Picks `count` distinct free TCP ports on `host` (held open together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_tf_configs(num_workers: int) -> list[str]:
    """The TF_CONFIG of each of `num_workers` workers on 127.0.0.1, on free ports."""
    addresses = [f"127.0.0.1:{port}" for port in free_ports(num_workers)]
    return [
        json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}})
        for index in range(num_workers)
    ]


def launch_local_workers(
    argv: Sequence[str],
    num_workers: int,
    *,
    env: Mapping[str, str] | None = None,
    output: Callable[[str], None] | None = None,
    failure_grace_seconds: float = 60.0,
    timeout_seconds: float | None = None,
    pass_fds: Collection[int] = (),
) -> LaunchResult:
    """Starts `num_workers` copies of `argv` as one multi-worker cluster on this machine and waits.

    Args:
        argv: The command every worker runs, e.g. [sys.executable, "train.py"].
        num_workers: How many workers to start (at least 1).
        env: The environment to start from (default: this process's); TF_CONFIG is set per worker and
            TF_CPP_MIN_LOG_LEVEL defaults to 2.
        output: Receives each output line, prefixed "[worker i] "; default prints to stdout.
        failure_grace_seconds: After one worker fails, how long the others may take to fail (or finish)
            by themselves before they are stopped.
        timeout_seconds: Stops all workers and raises after this long; None waits as long as they run.
        pass_fds: File descriptors the workers inherit (e.g. a lock they hold while any of them lives).

    Returns:
        A `LaunchResult` when every worker exited with code 0.

    Raises:
        DistributionError: A worker failed (the message names the first one and its exit code) or the
            timeout expired.
        ValueError: num_workers < 1 or argv is empty.

    Example:
        >>> launch_local_workers([sys.executable, "-c", "print('hi')"], 2, output=lambda line: None)
        ... # doctest: +ELLIPSIS
        LaunchResult(returncodes=(0, 0), ...)
    """
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, received {num_workers}.")
    if not argv:
        raise ValueError("argv is empty: pass the command each worker runs, e.g. [sys.executable, 'train.py'].")
    output = output or _print_line
    configs = local_tf_configs(num_workers)
    base_env = dict(os.environ if env is None else env)
    base_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    base_env.setdefault("PYTHONUNBUFFERED", "1")
    lock = threading.Lock()
    workers, readers = [], []
    try:
        for config in configs:  # all started before any reader thread: no thread runs while one forks
            workers.append(
                subprocess.Popen(
                    list(argv),
                    env={**base_env, "TF_CONFIG": config},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                    pass_fds=tuple(pass_fds),
                    preexec_fn=terminate_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only, no locks
                )
            )
        for index, process in enumerate(workers):
            reader = threading.Thread(target=_forward, args=(process, index, output, lock), daemon=True)
            reader.start()
            readers.append(reader)
        failure = _wait(workers, failure_grace_seconds, timeout_seconds)
    finally:
        with signals_deferred():  # a second Ctrl-C or SIGTERM must not cut the stopping short
            stop_processes(workers)
        for reader in readers:
            reader.join(timeout=_TERMINATE_SECONDS)
    if failure:
        raise DistributionError(failure)
    return LaunchResult(tuple(process.returncode for process in workers), tuple(configs))


def _wait(workers: list[subprocess.Popen], grace_seconds: float, timeout_seconds: float | None) -> str | None:
    """Waits for all workers; returns why the launch failed, or None."""
    start = time.monotonic()
    first_failure: tuple[int, int, float] | None = None
    while True:
        codes = [process.poll() for process in workers]
        if first_failure is None:
            failed = [(index, code) for index, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                first_failure = (*failed[0], time.monotonic())
        if all(code is not None for code in codes):
            break
        now = time.monotonic()
        if first_failure is not None and now - first_failure[2] > grace_seconds:
            running = [index for index, code in enumerate(codes) if code is None]
            return (
                f"{_describe_failure(first_failure[0], first_failure[1])}; workers {running} were still "
                f"running {grace_seconds:.0f} s later and were stopped. Look above for the first "
                "worker's error; restart all workers to resume from the last checkpoint."
            )
        if timeout_seconds is not None and now - start > timeout_seconds:
            return f"The workers did not finish within timeout_seconds={timeout_seconds:.0f}; all were stopped."
        time.sleep(_POLL_SECONDS)
    if first_failure is not None:
        others = [f"worker {index}: exit code {code}" for index, code in enumerate(codes) if index != first_failure[0]]
        return (
            f"{_describe_failure(first_failure[0], first_failure[1])}; then {', '.join(others) or 'no others'}. "
            "Look above for the first worker's error; restart all workers to resume from the last checkpoint."
        )
    return None


def _describe_failure(index: int, code: int) -> str:
    if code < 0:
        return f"Worker {index} was killed by signal {signal.Signals(-code).name} (first failure)"
    return f"Worker {index} exited with code {code} (first failure)"


def stop_processes(workers: list[subprocess.Popen]) -> None:
    """Stops any worker (and its children) still running: SIGTERM, then SIGKILL."""
    for process in workers:
        if process.poll() is None:
            _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + _TERMINATE_SECONDS
    for process in workers:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Holds SIGINT, SIGTERM and SIGHUP back while the block runs (in the main thread; elsewhere Python
    delivers no signals anyway); they arrive, and their handlers run, when it ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def terminate_with_parent(parent: int) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send the worker SIGTERM when the launcher dies (Linux only; it
    runs in the child between fork and exec, so it calls only prctl and getppid)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)  # the worker's own session: its children go too


def _forward(process: subprocess.Popen, index: int, output: Callable[[str], None], lock: threading.Lock) -> None:
    for line in process.stdout:
        with lock:
            output(f"[worker {index}] {line.rstrip()}")


def _print_line(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
