"""tf.data service servers: one per command (`tfopt-recipe data-service ...`), or a cluster on this host.

The servers are TensorFlow's own (`tf.data.experimental.service.DispatchServer` and `WorkerServer`); tfopt
starts them, says what they serve, and stops them. Two uses:

* `serve_dispatcher` and `serve_worker` run one server in the foreground until SIGTERM or Ctrl-C, as a
  Kubernetes pod or a Slurm task would (docs/data-service.md). They say where they serve, then every
  `report_seconds` what they hold (workers registered, tasks running), the process's CPU use and the bytes
  the host sent; TensorFlow's own lines (a worker registered) show with TF_CPP_MIN_LOG_LEVEL=0. A worker
  whose heartbeats stop for `worker_timeout_seconds` is dropped by the dispatcher, so that clients stop
  waiting for it (TensorFlow's default, 10 minutes, outlasts a pod's restart elsewhere).
* `LocalCluster` is a dispatcher in this process and N worker processes on 127.0.0.1 (each
  `python -m tfopt.cli data-service worker`), for one host with spare cores and for tests. No worker
  outlives it: `close()` (also at interpreter exit) stops them, and each asks the kernel for SIGTERM when
  this process dies (`PR_SET_PDEATHSIG`), after which its stop lasts `STOP_SECONDS` at most. Addressed at
  127.0.0.1, the servers listen on every interface all the same: TensorFlow binds them to all addresses
  (`[::]`), and neither `DispatcherConfig` nor `WorkerConfig` takes one to bind to. A worker that dies while
  it runs is started again at the same address, the tf.data service's own recovery: the client reconnects
  and the job goes on, without the elements the dead worker had taken and not delivered (dynamic sharding
  visits each at most once), or, a single worker, from the start of its pass.

Signals while TensorFlow holds the process: TensorFlow 2.21's servers keep the GIL through two calls that
can wait for ever, a worker's registration (retried until a dispatcher answers) and `stop()` (a worker
serving a job joins its pipeline threads, which wait on the job: those of a job whose dispatcher died retry
their split requests for an hour). No Python signal handler runs meanwhile, nor tfopt-recipe's own
watcher (`tfopt.cli.interrupt`), which needs the GIL too. So a worker first waits for its dispatcher to
answer from Python (`answer_timeout_seconds`, then an error that says so); during both calls SIGTERM,
SIGINT and SIGHUP end the process at once (the kernel's default action); and a stop that has not returned
after `STOP_SECONDS` ends the process (faulthandler's watchdog, a thread that needs no GIL: exit code 1,
Python's stack on stderr).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from tfopt.distribute.launcher import free_ports, signals_deferred, stop_processes, terminate_with_parent
from tfopt.errors import DistributionError
from tfopt.waiting import announce, first_reply, is_grpc

_log = logging.getLogger("tfopt")

LOOPBACK = "127.0.0.1"
READY = "serving"  # the word a worker's first tfopt line carries once its server is up
# A worker whose heartbeats stop for this long is lost to the dispatcher; its restart reconnects sooner. Jobs
# no client reads any more (a measurement round's, an epoch's abandoned iterator) are dropped as soon.
_WORKER_TIMEOUT_MS = 5_000
# A worker slot started again this many times gives up: one that dies whatever happens (memory, a port taken)
# would otherwise take the training cores for its start-ups forever.
MAX_RESTARTS = 3
# How often a worker tells the dispatcher it lives. Stopping a worker waits out the heartbeat in progress, so
# TensorFlow's default of seconds would make every stop that slow.
HEARTBEAT_MS = 100
_POLL_SECONDS = 0.5
# How long a server's stop may take before the process ends without it: a worker's takes well under a second
# (a heartbeat), and Kubernetes and Slurm wait 30 s before SIGKILL.
STOP_SECONDS = 5.0
# How long a worker waits for its dispatcher to answer by default: as long as a training process does
# (data_service.answer_timeout_seconds).
_DISPATCHER_ANSWER_SECONDS = 10.0
_STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def serve_dispatcher(
    port: int,
    *,
    work_dir: str | None = None,
    worker_timeout_seconds: float = 30.0,
    report_seconds: float = 30.0,
    say: Callable[[str], None] = print,
) -> None:
    """Runs a dispatcher on `port` until interrupted; with `work_dir`, its journal survives a restart.

    Raises:
        DistributionError: The port is taken (the message names it and `--port`).
    """
    from tensorflow.data.experimental import service

    with _serving_on(port):
        server = service.DispatchServer(
            service.DispatcherConfig(
                port=port,
                protocol="grpc",
                work_dir=work_dir,
                fault_tolerant_mode=work_dir is not None,
                worker_timeout_ms=int(worker_timeout_seconds * 1000),
            )
        )
    say(
        f"tf.data service dispatcher {READY} at grpc://{_host()}:{port}"
        + (
            f", journal in {work_dir} (restarts keep registered datasets and jobs)"
            if work_dir
            else ", no journal (a restart forgets its datasets and jobs: pass --work-dir to keep them)"
        )
    )
    _run_until_stopped(server, report_seconds, say, "dispatcher")


def serve_worker(
    dispatcher: str,
    *,
    port: int = 0,
    address: str | None = None,
    answer_timeout_seconds: float = _DISPATCHER_ANSWER_SECONDS,
    report_seconds: float = 30.0,
    say: Callable[[str], None] = print,
) -> None:
    """Runs a worker for `dispatcher` ("host:port") until interrupted.

    Args:
        dispatcher: The dispatcher's host:port (a grpc:// prefix is accepted).
        port: The port to serve on; 0 picks a free one. A restarted worker that keeps its port is
            reconnected to by clients.
        address: The host:port clients reach this worker at; by default this host's name and the port.
        answer_timeout_seconds: How long to wait for the dispatcher to answer before failing (it may be
            starting too).

    Raises:
        DistributionError: The port is taken (the message names it and `--port`), or no dispatcher answered
            within `answer_timeout_seconds`.
    """
    from tensorflow.data.experimental import service

    dispatcher = dispatcher.removeprefix("grpc://")
    port = port or free_ports(1)[0]
    address = address or f"{_host()}:{port}"
    with _serving_on(port):
        say(
            f"tf.data service worker at {address} registering with the dispatcher at {dispatcher} (waiting up "
            f"to {answer_timeout_seconds:g} s for it to answer)"
        )
        _await_dispatcher(dispatcher, answer_timeout_seconds)
        with _signals_end_process():  # registering: TensorFlow retries in C++, holding the GIL
            server = service.WorkerServer(
                service.WorkerConfig(
                    dispatcher_address=dispatcher,
                    worker_address=address,
                    port=port,
                    protocol="grpc",
                    heartbeat_interval_ms=HEARTBEAT_MS,
                )
            )
    say(f"tf.data service worker {READY} at {address} for the dispatcher at {dispatcher}")
    _run_until_stopped(server, report_seconds, say, f"worker {address}")


def _await_dispatcher(dispatcher: str, timeout_seconds: float) -> None:
    """Returns once a gRPC server answers at `dispatcher`, asking again every `_POLL_SECONDS` (a dispatcher
    started at the same time may not listen yet); in Python, where SIGTERM and Ctrl-C end the wait.

    Raises:
        DistributionError: None answered within `timeout_seconds`, or what answers is not a gRPC server.
    """
    deadline = announce(
        f"the tf.data service dispatcher at {dispatcher} to answer", timeout_seconds, "--dispatcher-timeout"
    )
    while True:
        try:
            reply = first_reply(dispatcher, max(deadline - time.monotonic(), _POLL_SECONDS))
        except TimeoutError:
            why = "it accepted the connection and did not answer"
        except OSError as error:
            why = error.strerror or str(error)
        else:
            if is_grpc(reply):
                return
            raise DistributionError(
                f"data_service: what answers at {dispatcher} is not a gRPC server (its first reply is not "
                "HTTP/2). Check --dispatcher: it should be a tf.data service dispatcher's host:port."
            )
        if time.monotonic() >= deadline:
            raise DistributionError(
                f"data_service: no dispatcher answered at {dispatcher} within {timeout_seconds:g} s ({why}). "
                "Start it (tfopt-recipe data-service dispatcher --port PORT), correct --dispatcher, or wait "
                "longer with --dispatcher-timeout."
            )
        time.sleep(_POLL_SECONDS)


@contextlib.contextmanager
def _serving_on(port: int) -> Iterator[None]:
    """Starts a server in the block, saying in words where `port` is taken: gRPC says only "Could not start
    gRPC server" (and logs its reason past tfopt's output), so the port is tried first, and a server that
    fails anyway (another process took the port meanwhile) is said the same way."""
    taken = _taken(port)
    if taken is None:
        try:
            yield
            return
        except RuntimeError as error:
            if "Could not start gRPC server" not in str(error):
                raise
            taken = "gRPC could not bind it"
    raise DistributionError(
        f"Port {port} is taken ({taken}): another process listens on it. Choose another with --port, or stop "
        f"that process (`ss -ltnp 'sport = :{port}'` shows which)."
    )


def _taken(port: int) -> str | None:
    """Why `port` cannot be listened on, as the server would (every interface), or None where it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: a closing socket does not count
        try:
            probe.bind(("", port))
        except OSError as error:
            return error.strerror
    return None


def _run_until_stopped(server, report_seconds: float, say: Callable[[str], None], name: str) -> None:
    """Blocks until a signal ends the process (tfopt-recipe turns SIGTERM into KeyboardInterrupt), saying
    every `report_seconds` what the server holds, how busy this process was and what the host sent."""
    import psutil

    process = psutil.Process()
    process.cpu_percent()
    sent = psutil.net_io_counters().bytes_sent
    try:
        while True:
            time.sleep(report_seconds)
            now = psutil.net_io_counters().bytes_sent
            say(
                f"{name}: {_holding(server)}, {process.cpu_percent() / 100:.2f} cores busy, the host sent "
                f"{(now - sent) / report_seconds / 2**20:.1f} MiB/s over the last {report_seconds:.0f} s"
            )
            sent = now
    finally:
        _stop(server)
        say(f"{name} stopped")


def _stop(server) -> None:
    """`server.stop()`, or the end of the process `STOP_SECONDS` after it began: TensorFlow's stop holds the
    GIL, so only a watchdog that needs none can end a stop that hangs (faulthandler's: Python's stack on
    stderr, exit code 1). A second signal meanwhile ends the process at once."""
    with _signals_end_process():
        faulthandler.dump_traceback_later(STOP_SECONDS, exit=True, file=sys.__stderr__)
        try:
            server.stop()
        finally:
            faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def _signals_end_process() -> Iterator[None]:
    """SIGTERM, SIGINT and SIGHUP take the kernel's default action in the block, ending the process at once:
    for TensorFlow calls that hold the GIL while they wait, when no Python handler can run. Signals the
    process ignores stay ignored. Outside the main thread it changes nothing: Python runs handlers in the
    main thread, which is then free to run them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handlers = {signum: signal.getsignal(signum) for signum in _STOPPING_SIGNALS}
    ended = [signum for signum, handler in handlers.items() if handler not in (signal.SIG_IGN, None)]
    for signum in ended:
        signal.signal(signum, signal.SIG_DFL)
    try:
        yield
    finally:
        for signum in ended:
            signal.signal(signum, handlers[signum])


def _holding(server) -> str:
    """What a server holds: the workers registered with a dispatcher, the tasks a worker runs (TF's own
    counters; private, so a TensorFlow without them says less)."""
    for counter, unit in (("_num_workers", "workers registered"), ("_num_tasks", "tasks running")):
        if hasattr(server, counter):
            return f"{getattr(server, counter)()} {unit}"
    return "running"


def _host() -> str:
    import socket

    return socket.gethostname()


class LocalCluster:
    """A dispatcher in this process and `workers` worker processes on 127.0.0.1, stopped by `close()`.

    Attributes:
        target: The dispatcher's "grpc://127.0.0.1:port", what `tf.data.experimental.service` takes.
        restarts: (worker address, exit code) of each worker that died and was started again.

    Example:
        >>> with LocalCluster(workers=1) as cluster:  # doctest: +SKIP
        ...     data = data.apply(tf.data.experimental.service.distribute("distributed_epoch", cluster.target))
    """

    def __init__(self, workers: int, *, env: dict[str, str] | None = None, start_timeout_seconds: float = 120.0):
        from tensorflow.data.experimental import service

        if workers < 1:
            raise ValueError(f"workers must be at least 1, received {workers}")
        dispatcher_port, *self._ports = free_ports(workers + 1)
        self._dispatcher = service.DispatchServer(
            service.DispatcherConfig(
                port=dispatcher_port,
                protocol="grpc",
                worker_timeout_ms=_WORKER_TIMEOUT_MS,
                job_gc_check_interval_ms=_WORKER_TIMEOUT_MS,
                job_gc_timeout_ms=_WORKER_TIMEOUT_MS,
            )
        )
        self.address = f"{LOOPBACK}:{dispatcher_port}"
        self.target = f"grpc://{self.address}"
        self.restarts: list[tuple[str, int]] = []
        self._start_timeout_seconds = start_timeout_seconds
        self._env = {**(os.environ if env is None else env), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._workers: list[_WorkerProcess] = []
        self._given_up: set[int] = set()
        atexit.register(self.close)
        try:
            with self._lock:
                for port in self._ports:  # one by one, so that close() stops those started before a failure
                    self._workers.append(self._start(port))
            self._await_ready(self._workers, self.worker_addresses)
        except BaseException:
            self.close()
            raise
        threading.Thread(target=self._supervise, name="tfopt-data-service", daemon=True).start()
        _log.info(
            "data_service: dispatcher at %s, %d worker processes at %s",
            self.target,
            workers,
            ", ".join(self.worker_addresses),
        )

    @property
    def worker_addresses(self) -> list[str]:
        return [f"{LOOPBACK}:{port}" for port in self._ports]

    @property
    def worker_pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self._workers]

    def _await_ready(self, workers: list[_WorkerProcess], addresses: list[str]) -> None:
        deadline = announce(
            f"tf.data service worker process{'es' if len(workers) > 1 else ''} at {', '.join(addresses)} to serve",
            self._start_timeout_seconds,
            _START_SETTING,
        )
        for worker, address in zip(workers, addresses):
            worker.await_ready(deadline, address, self._start_timeout_seconds)

    def _start(self, port: int) -> _WorkerProcess:
        command = [
            sys.executable,
            "-m",
            "tfopt.cli",
            "data-service",
            "worker",
            "--dispatcher",
            self.address,
            "--port",
            str(port),
            "--address",
            f"{LOOPBACK}:{port}",
        ]
        return _WorkerProcess(
            subprocess.Popen(
                command,
                env=self._env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
                preexec_fn=terminate_with_parent(os.getpid()),  # noqa: PLW1509 - prctl only, no locks
            )
        )

    def _supervise(self) -> None:
        while not self._closed.wait(_POLL_SECONDS):
            started = []
            with self._lock:
                if self._closed.is_set():
                    return
                for index, worker in enumerate(self._workers):
                    code = worker.process.poll()
                    if code is None or index in self._given_up:
                        continue
                    address = self.worker_addresses[index]
                    if sum(1 for restarted, _ in self.restarts if restarted == address) >= MAX_RESTARTS:
                        self._given_up.add(index)
                        _log.error(
                            "data_service: the worker at %s exited (code %s) after %d restarts and is not "
                            "started again; training goes on with the other workers, if any (with none it "
                            "waits for one: stop it and leave data_service out)",
                            address,
                            code,
                            MAX_RESTARTS,
                        )
                        continue
                    self.restarts.append((address, code))
                    _log.warning(
                        "data_service: the worker at %s exited (code %s) and is started again at the same address. "
                        "With several workers (dynamic sharding, each element at most once) the elements it had "
                        "taken and not yet delivered are missing from this pass: at most the batches its pipeline "
                        "held ready and the one it was making. A single worker serves the pass again from its "
                        "start: the epoch keeps its steps, the elements before the restart come twice",
                        address,
                        code,
                    )
                    self._workers[index] = self._start(self._ports[index])
                    started.append((self._workers[index], address))
            for worker, address in started:
                try:
                    self._await_ready([worker], [address])
                except DistributionError as error:
                    if not self._closed.is_set():  # else it was stopped while it started
                        _log.error("%s", error)

    def close(self) -> None:
        """Stops the workers (SIGTERM, then SIGKILL) and the dispatcher; safe to call more than once."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock, signals_deferred():  # a second Ctrl-C or SIGTERM must not cut the stopping short
            stop_processes([worker.process for worker in self._workers])
        self._dispatcher.stop()
        atexit.unregister(self.close)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class _WorkerProcess:
    """A worker process, its output handed on to tfopt's debug log, and whether it has said it serves."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self._ready = threading.Event()
        self._lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.rstrip()
            self._lines = [*self._lines[-19:], line]
            if READY in line:
                self._ready.set()
            _log.debug("[data-service worker %d] %s", self.process.pid, line)

    def await_ready(self, deadline: float, address: str, timeout_seconds: float) -> None:
        """Returns once the worker says it serves; raises where it exits or `deadline` passes first."""
        while not self._ready.wait(_POLL_SECONDS):
            code = self.process.poll()
            if code is not None or time.monotonic() > deadline:
                self.process.kill()
                why = (
                    f"exited with code {code}"
                    if code is not None
                    else f"did not serve within {timeout_seconds:g} s ({_START_SETTING}: raise it on a busy host)"
                )
                raise DistributionError(
                    f"data_service: the tf.data service worker process for {address} {why}; its last lines:\n"
                    + "\n".join(self._lines)
                )


_START_SETTING = "data_service.start_timeout_seconds"
