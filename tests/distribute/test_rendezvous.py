"""A multi-worker worker sees its peers started before it joins them, within a deadline, deaf to no signal.

The peers here are threads of this process (the rendezvous runs in Python, without TensorFlow), silent
sockets, a real gRPC server, and a whole `tfopt-recipe run` whose peer never starts.
"""

import json
import signal
import socket
import threading
import time

import pytest

from tests.processes import child_environment, run_waiting
from tfopt.distribute.launcher import free_ports
from tfopt.distribute.rendezvous import GREETING, await_peers
from tfopt.errors import DistributionError
from tfopt.waiting import REPLY_BYTES


def addresses(count):
    return [f"127.0.0.1:{port}" for port in free_ports(count)]


def test_the_greeting_is_as_long_as_the_reply_a_grpc_server_gives():
    assert len(GREETING) == REPLY_BYTES


def test_workers_starting_at_different_times_all_see_each_other_then_tensorflow_takes_their_ports():
    """Each thread is a worker: it waits for its peers, then serves gRPC on its own port as TensorFlow's join
    does (a tf.data dispatcher here), which the workers still waiting take for "joined"."""
    import tensorflow as tf

    cluster = {"chief": addresses(1), "worker": addresses(2)}
    tasks = [("chief", 0), ("worker", 0), ("worker", 1)]
    errors, servers = [], []

    def join(task_type, index, delay):
        time.sleep(delay)
        try:
            await_peers(cluster, task_type, index, timeout_seconds=30)
            port = int(cluster[task_type][index].rpartition(":")[2])
            config = tf.data.experimental.service.DispatcherConfig(port=port)
            servers.append(tf.data.experimental.service.DispatchServer(config))
        except Exception as error:  # noqa: BLE001 - collected for the assertion below
            errors.append(error)

    threads = [threading.Thread(target=join, args=(*task, delay)) for task, delay in zip(tasks, (0, 1.0, 2.0))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for server in servers:
            server.stop()
    assert errors == [] and len(servers) == 3 and not any(thread.is_alive() for thread in threads)


def test_a_peer_already_joined_answers_as_a_grpc_server():
    import tensorflow as tf

    port = free_ports(1)[0]
    joined = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=port))
    try:
        await_peers({"worker": addresses(1) + [f"127.0.0.1:{port}"]}, "worker", 0, timeout_seconds=10)
    finally:
        joined.stop()


def test_a_peer_that_never_starts_ends_the_wait_at_its_deadline_naming_it():
    cluster = {"worker": addresses(3)}
    started = time.monotonic()
    with pytest.raises(DistributionError) as raised:
        await_peers(cluster, "worker", 1, timeout_seconds=1.5)
    waited = time.monotonic() - started
    assert waited >= 1.5 and waited < 10, waited
    assert str(raised.value) == (
        "worker 1 waited 1.5 s (distribution.start_timeout_seconds) for the other workers to start, and "
        f"worker 0 at {cluster['worker'][0]} did not (nothing listens on its port), "
        f"worker 2 at {cluster['worker'][2]} did not (nothing listens on its port). Start each with the same "
        "cluster in TF_CONFIG and its own task, check that the addresses reach them, or raise the setting where "
        "they start slowly."
    )


def test_a_peer_that_accepts_and_never_answers_is_not_taken_for_started():
    with socket.socket() as silent:  # the kernel accepts connections; nobody reads or writes
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        peer = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(
            DistributionError,
            match=f"worker 1 at {peer} did not \\(its port accepts connections but nothing answers\\)",
        ):
            await_peers({"worker": addresses(1) + [peer]}, "worker", 0, timeout_seconds=1)


def test_a_port_answering_something_else_is_named_as_such():
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        peer = f"127.0.0.1:{other.getsockname()[1]}"

        def answer_http():
            while True:
                try:
                    connection, _ = other.accept()
                except OSError:  # closed at the end of the test
                    return
                with connection:
                    connection.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        threading.Thread(target=answer_http, daemon=True).start()
        with pytest.raises(DistributionError, match="neither a tfopt worker nor a TensorFlow server"):
            await_peers({"worker": addresses(1) + [peer]}, "worker", 0, timeout_seconds=1)


def test_its_own_port_taken_names_the_port_and_tf_config():
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DistributionError) as raised:
            await_peers({"worker": [f"127.0.0.1:{port}", *addresses(1)]}, "worker", 0, timeout_seconds=5)
    assert str(raised.value).startswith(
        f"worker 0's port {port} (127.0.0.1:{port} in TF_CONFIG) is taken: another process listens on it"
    )


def test_tasks_outside_the_collective_and_lone_workers_do_not_wait():
    await_peers({"worker": addresses(2), "evaluator": addresses(1)}, "evaluator", 0, timeout_seconds=0.1)
    await_peers({"worker": addresses(1)}, "worker", 0, timeout_seconds=0.1)


LONELY_WORKER_RECIPE = """
model: {name: small_cnn, filters: [4]}
data: {source: synthetic, kind: image, examples: 16, image_size: [8, 8], batch_size: 4}
recipes: [{distribution: {strategy: multi_worker, start_timeout_seconds: SECONDS}}]
profile: {steps: 2, warmup_steps: 1}
"""


@pytest.mark.parametrize("ending", ["deadline", "sigterm"])
def test_a_run_whose_peer_never_starts_ends_by_itself_and_on_sigterm(tmp_path, ending):
    own, peer = addresses(2)
    seconds = 3 if ending == "deadline" else 600
    (tmp_path / "recipe.yaml").write_text(LONELY_WORKER_RECIPE.replace("SECONDS", str(seconds)))
    tf_config = json.dumps({"cluster": {"worker": [own, peer]}, "task": {"type": "worker", "index": 0}})
    code, err, ended_after_signal = run_waiting(
        ["-m", "tfopt.cli", "run", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run")],
        env=child_environment(TF_CONFIG=tf_config),
        sigterm_once=(lambda: _greets(own)) if ending == "sigterm" else None,
    )
    assert "Traceback" not in err and "may be a bug" not in err
    assert f"waiting for the other workers to start (worker 1 at {peer}), until " in err
    if ending == "deadline":
        assert code == 1, err
        assert (
            "worker 0 waited 3 s (distribution.start_timeout_seconds) for the other workers to start, and "
            f"worker 1 at {peer} did not (nothing listens on its port)"
        ) in err
    else:
        assert code == 128 + signal.SIGTERM, err
        assert ended_after_signal < 5
        assert "interrupted (SIGTERM)" in err


def _greets(address):
    """Whether a worker waits at `address` (it answers with the greeting)."""
    from tfopt.waiting import first_reply

    try:
        return first_reply(address, 1.0) == GREETING
    except OSError:
        return False
