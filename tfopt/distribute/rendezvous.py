"""Before a worker joins its multi-worker cluster, it sees every peer started, within a deadline.

TensorFlow's join (creating a MultiWorkerMirroredStrategy) waits in C++ until every task of the cluster has
registered, holding Python's lock (`TFE_EnableCollectiveOps`, TensorFlow 2.21): a peer that never starts
leaves the process hanging with no deadline and deaf to SIGTERM. So each worker first answers on its own
cluster port with a greeting, and asks each peer's port until every one answers, either with that greeting
(started, waiting here too) or as a gRPC server (TensorFlow's: it has joined already). Then it closes its
greeting, and TensorFlow binds the port. This wait runs in Python: it says whom it waits for and until when,
ends at its deadline with an error naming each missing task and its address, and ends at once on SIGTERM or
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from tfopt.errors import DistributionError
from tfopt.waiting import announce, first_reply, is_grpc

GREETING = b"tfopt-up\n"  # as long as the frame header a joined peer's gRPC server answers with
SETTING = "distribution.start_timeout_seconds"
# TensorFlow's multi-worker collectives run over the chief and worker tasks (an evaluator stays apart).
_COORDINATED_JOBS = ("chief", "worker")
_POLL_SECONDS = 0.2
_ASK_SECONDS = 2.0  # how long one peer may take to answer one question, within the deadline


def await_peers(cluster: Mapping[str, Sequence[str]], task_type: str, task_index: int, timeout_seconds: float) -> None:
    """Returns once every other chief and worker task of `cluster` answers on its port.

    Args:
        cluster: Job name to "host:port" addresses, as in TF_CONFIG.
        task_type: This process's job ("chief" or "worker"; any other job does not wait).
        task_index: This process's index in its job.
        timeout_seconds: The deadline (`distribution.start_timeout_seconds`).

    Raises:
        DistributionError: A peer did not answer in time (each named with its address and what its port did),
            or this worker's own port is taken by another process.
    """
    if task_type not in _COORDINATED_JOBS:
        return
    peers = {
        f"{job} {index}": address
        for job in _COORDINATED_JOBS
        for index, address in enumerate(cluster.get(job, ()))
        if (job, index) != (task_type, task_index)
    }
    if not peers:
        return
    own = cluster[task_type][task_index]
    with _greeting(own, f"{task_type} {task_index}"):
        listed = ", ".join(f"{name} at {address}" for name, address in peers.items())
        deadline = announce(f"the other workers to start ({listed})", timeout_seconds, SETTING)
        missing = dict.fromkeys(peers, "")
        while True:
            for name in list(missing):
                silence = _silence(peers[name], min(_ASK_SECONDS, max(deadline - time.monotonic(), 0.01)))
                if silence:
                    missing[name] = silence
                else:
                    del missing[name]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise DistributionError(
                    f"{task_type} {task_index} waited {timeout_seconds:g} s ({SETTING}) for the other workers to "
                    "start, and "
                    + ", ".join(f"{name} at {peers[name]} did not ({why})" for name, why in missing.items())
                    + ". Start each with the same cluster in TF_CONFIG and its own task, check that the addresses "
                    "reach them, or raise the setting where they start slowly."
                )
            time.sleep(_POLL_SECONDS)


def _silence(address: str, timeout_seconds: float) -> str:
    """Why the peer at `address` has not started, in words; "" where it answers as a peer does."""
    try:
        reply = first_reply(address, timeout_seconds)
    except TimeoutError:
        return "its port accepts connections but nothing answers"
    except ConnectionRefusedError:
        return "nothing listens on its port"
    except OSError as error:
        return f"{error.strerror or error}"
    if reply == GREETING or is_grpc(reply):
        return ""
    return "what answers on its port is neither a tfopt worker nor a TensorFlow server"


@contextlib.contextmanager
def _greeting(address: str, name: str) -> Iterator[None]:
    """Answers GREETING on `address`'s port (every interface, as TensorFlow's server binds it) in the block."""
    port = int(address.rpartition(":")[2])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does, so it can take the port next
    try:
        listener.bind(("", port))
    except OSError as error:
        listener.close()
        taken = error.errno == errno.EADDRINUSE
        raise DistributionError(
            f"{name}'s port {port} ({address} in TF_CONFIG) "
            + (
                f"is taken: another process listens on it (`ss -ltnp 'sport = :{port}'` shows which). Stop it, "
                "or give this task another port in every worker's TF_CONFIG."
                if taken
                else f"cannot be listened on ({error.strerror or error}). Give this task another port in every "
                "worker's TF_CONFIG."
            )
        ) from None
    listener.listen()
    listener.settimeout(_POLL_SECONDS)
    stop = threading.Event()
    answering = threading.Thread(target=_answer, args=(listener, stop), name="tfopt-rendezvous", daemon=True)
    answering.start()
    try:
        yield
    finally:
        stop.set()
        answering.join()
        listener.close()


def _answer(listener: socket.socket, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        with connection:
            connection.settimeout(_ASK_SECONDS)
            with contextlib.suppress(OSError):
                connection.sendall(GREETING)
                while connection.recv(64):  # the asker closes first, so the port is left with no TIME_WAIT
                    pass
