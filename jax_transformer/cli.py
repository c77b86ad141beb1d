"""The wrapper every command line goes through: errors become one line and an exit code.

    0    done
    1    the run itself failed (RunFailed: e.g. training diverged)
    2    bad input: any InputError (config, checkpoint, tokenizer, corpus, port,
         translate and training settings) or an OSError on a path the user gave
    130  stopped by SIGINT (Ctrl-C)    } 128 + the signal number, as a shell reports it;
    143  stopped by SIGTERM            } the last line on stderr says what was saved

SIGINT and SIGTERM (what schedulers and preemptible machines send) stop a
command at once with a message: every file a command writes is written whole
(a temporary file, then a rename), so there is nothing to finish. It exits
rather than raising, because Python drops an exception raised inside a garbage
collector callback or a __del__, and the signal would be lost. train.py defers
the stop to the end of the current step instead (jax_transformer.train.interrupts).
Library code raises and never exits; only this wrapper prints `error: ...` on
stderr. It imports no JAX, so `--help` and torch-only commands stay light.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator, Sequence

from transformer_core.errors import InputError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunFailed(RuntimeError):
    """A run that started well could not finish (exit code 1); the message says why."""


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
    """A signal handler: print '<SIGNAL>: <message>' and exit 128 + the signal number."""
    def handler(signum: int, frame) -> None:
        write_from_handler(f"{signal.Signals(signum).name}: {message}")
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


def run(main: Callable[[Sequence[str] | None], int | None],
        argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)` and turn its outcome into an exit code.

    After a stop (Interrupted) the stop handlers stay in place: the process is on its
    way out, and a signal sent again while it shuts down (JAX and orbax take seconds)
    exits with the stop's code instead of being killed by the default handler."""
    previous = set_stop_handlers(exit_at_once())
    stopped = False
    try:
        return main(argv) or 0
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        stopped = True
        print(e, file=sys.stderr)
        return e.exit_code
    finally:
        if not stopped:
            set_stop_handlers(previous)
