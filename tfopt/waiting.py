"""Waiting on another process or host: a line when the wait begins, a deadline, and an answer checked.

Every wait of tfopt's on something outside its process (a peer worker starting, a tf.data service
dispatcher answering, a worker process saying it serves, the chief registering the shared pipeline) says
what it waits for, where and until when, and names the setting that sets its deadline, here and in the error
that ends it. The waits poll from Python, so a SIGTERM or Ctrl-C ends them at once.

An open port is not an answer: a host that accepts connections and never replies (a stopped process whose
socket still listens, a firewall) would leave a gRPC client waiting on its first request for ever. So
`first_reply` speaks the first step of HTTP/2, which gRPC runs on: the client's connection preface, to which
any gRPC server replies at once with a SETTINGS frame.
"""

from __future__ import annotations

import logging
import socket
import time

_log = logging.getLogger("tfopt")

# The HTTP/2 client connection preface (RFC 9113, section 3.4) and an empty SETTINGS frame.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HTTP2_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 0x4
REPLY_BYTES = 9  # an HTTP/2 frame header: length (3 bytes), type (1), flags (1), stream (4)


def announce(what: str, timeout_seconds: float, setting: str) -> float:
    """Says that a wait for `what` begins and until when `setting` lets it last; returns its deadline
    (on `time.monotonic`'s clock)."""
    until = time.strftime("%H:%M:%S", time.localtime(time.time() + timeout_seconds))
    _log.info("waiting for %s, until %s (%s)", what, until, setting)
    return time.monotonic() + timeout_seconds


def first_reply(address: str, timeout_seconds: float) -> bytes:
    """The first `REPLY_BYTES` bytes that the server at `address` ("host:port", grpc:// allowed) sends back
    to an HTTP/2 client's greeting.

    Raises:
        TimeoutError: It accepted the connection and did not answer within `timeout_seconds`.
        ConnectionError: It closed the connection before answering.
        OSError: Nothing could be connected to (refused, unknown host, unreachable).
    """
    host, _, port = address.removeprefix("grpc://").rpartition(":")
    deadline = time.monotonic() + timeout_seconds
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_seconds) as connection:
        connection.sendall(_HTTP2_PREFACE + _HTTP2_EMPTY_SETTINGS)
        reply = b""
        while len(reply) < REPLY_BYTES:
            connection.settimeout(max(deadline - time.monotonic(), 0.001))
            received = connection.recv(REPLY_BYTES - len(reply))
            if not received:
                raise ConnectionError("it closed the connection without a word")
            reply += received
    return reply


def is_grpc(reply: bytes) -> bool:
    """Whether `first_reply`'s bytes are a gRPC (HTTP/2) server's: a SETTINGS frame's header."""
    return len(reply) == REPLY_BYTES and reply[3] == _HTTP2_SETTINGS
