"""How a process meets SIGINT (Ctrl-C) and SIGTERM (schedulers, preemptible machines).

By default a command stops at once with one line saying so: every file a command
writes is written whole (a temporary file, then a rename), so there is nothing
to finish. It exits rather than raising, because Python drops an exception
raised inside a garbage collector callback or a __del__, and the signal would
be lost. train.py defers the stop to the end of the current step instead
(jax_transformer.train.runtime.interrupts) and reports it with `Interrupted`, which the
command layer turns into exit code 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Called once, with the signal number, before `exit_at_once` exits: a distributed run
# tells its other processes there that this one stops (train.distributed.together).
BEFORE_EXIT_AT_ONCE: list[Callable[[int], None]] = []


class Interrupted(Exception):
    """A stop, handled: the message says what was kept; exits 128 + the signal number."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.exit_code = 128 + signum


def write_from_handler(line: str) -> None:
    """One line on stderr from a signal handler: os.write, not print, because the signal
    may have interrupted a print to stderr, and a reentrant print raises."""
    os.write(sys.stderr.fileno(), f"\n{line}\n".encode())


def exit_at_once(message: str = "stopped") -> Callable[[int, object], None]:
    """A signal handler: print '<SIGNAL>: <message>', call BEFORE_EXIT_AT_ONCE's hooks
    (each once: a signal sent again while one runs exits at once) and exit 128 + the
    signal number."""
    def handler(signum: int, frame) -> None:
        write_from_handler(f"{signal.Signals(signum).name}: {message}")
        while BEFORE_EXIT_AT_ONCE:
            BEFORE_EXIT_AT_ONCE.pop()(signum)
        os._exit(128 + signum)
    return handler


def set_stop_handlers(handler) -> dict:
    """Send SIGINT and SIGTERM to `handler` (or a {signum: handler} dict, as returned);
    returns the handlers they had. Main thread only (Python delivers signals there):
    elsewhere it does nothing and returns {}."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = handler if isinstance(handler, dict) else dict.fromkeys(STOP_SIGNALS, handler)
    return {signum: signal.signal(signum, h) for signum, h in handlers.items()}


@contextlib.contextmanager
def signal_handlers(handler) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` inside the block."""
    previous = set_stop_handlers(handler)
    try:
        yield
    finally:
        set_stop_handlers(previous)
