"""Signals stop a command within seconds: SIGTERM and SIGHUP as Ctrl-C does, also while TensorFlow holds
the main thread.

Python runs a signal's handler only between the main thread's bytecodes, and TensorFlow's C++ keeps that
thread for as long as an XLA compilation, a long step or a wait on tf.data takes: a run on an H100 sent
SIGTERM while it measured ResNet-50 said "interrupted" and ended 43 s later, where Kubernetes and Slurm give
30 s or less before SIGKILL. CPython's own C handler also writes the signal's number to the wakeup file
descriptor at once, whatever the main thread does. A watcher thread reading it gives the main thread
`GRACE_SECONDS` to see the signal. One that saw it raises `RunInterrupted` (while a run drives TensorFlow,
a training loop at the end of its step: `tfopt.training.stopping`) and cleans up (a checkpoint of the steps
trained, workers stopped and waited for, the lock released) within `CLEANUP_SECONDS` more; where none did,
the watcher says the interruption itself and ends the process.

What such a stop keeps: tfopt writes its outputs atomically (a temporary file renamed over the old one)
and TensorFlow writes a checkpoint's index last, so every file is the old one or the new one; the run
directory's lock goes with the process; worker and server processes ask the kernel for SIGTERM when their
parent dies. What it loses: the steps since the last periodic checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tfopt.errors import RunInterrupted

GRACE_SECONDS = 3.0
CLEANUP_SECONDS = 20.0
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_interrupt(farewell: Callable[[str], int]) -> Iterator[None]:
    """SIGTERM and SIGHUP raise `RunInterrupted` in the main thread, Ctrl-C's SIGINT KeyboardInterrupt (a
    signal the process ignores, as under `nohup` or `&`, stays ignored); the signals after it (a second Ctrl-C
    too) are the same interruption, which they do not cut short. Where the main thread has not seen the signal
    `GRACE_SECONDS` after it, or has not ended the block `CLEANUP_SECONDS` after that, `farewell(name)` reports
    it and the process exits with the code it returns. Main thread only (as `signal.signal`)."""
    # Lists, which take no lock: a handler runs inside itself when signals come in a burst (a parent killed with
    # SIGKILL sends its death signal once for each of its threads), and an Event's lock, held by the outer run,
    # deadlocked the inner one. `interrupted`: a signal came (one interruption, raised at once or at a step's
    # end); `seen`: the main thread raised it.
    interrupted: list[str] = []
    seen: list[str] = []

    def interrupt(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if interrupted:
            return  # one interruption: its cleanup runs to its end, and the watcher bounds it
        interrupted.append(name)
        if _stopping() is not None and _stopping().deferred(name):
            return  # taken at a training step's end, or by the watcher
        seen.append(name)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise RunInterrupted(name)

    handled = [signum for signum in STOPPING_SIGNALS if signal.getsignal(signum) is not signal.SIG_IGN]
    previous = {signum: signal.signal(signum, interrupt) for signum in handled}
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    previous_wakeup = signal.set_wakeup_fd(wakeup_write, warn_on_full_buffer=False)
    ended = threading.Event()

    def watch() -> None:
        while received := os.read(wakeup_read, 1):
            if ended.is_set():
                return
            if received[0] not in handled:
                continue
            if ended.wait(GRACE_SECONDS):
                return
            # Asked after the grace, not when the byte came: the watcher reads it before the main thread's
            # handler has run, and a main thread that saw the signal gets its cleanup time.
            cleaning_up = bool(seen) or (_stopping() is not None and _stopping().taken())
            if cleaning_up and ended.wait(CLEANUP_SECONDS):
                return
            name = signal.Signals(received[0]).name
            # The report must not hold the exit up: stderr may be a full pipe the main thread is writing to.
            deadline = threading.Timer(1.0, os._exit, args=(128 + received[0],))
            deadline.daemon = True
            deadline.start()
            code = farewell(name)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    watcher = threading.Thread(target=watch, name="tfopt-signal-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        # Handlers first: a signal from here on goes where it went before, never into the lines below.
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(previous_wakeup)
        ended.set()
        os.write(wakeup_write, b"\0")  # wakes the watcher, which sees the block ended
        watcher.join()
        os.close(wakeup_read)
        os.close(wakeup_write)


def _stopping() -> Any:
    """`tfopt.training.stopping` where a run imported it (it imports Keras: a command that never trains
    does not pay for it here)."""
    return sys.modules.get("tfopt.training.stopping")
