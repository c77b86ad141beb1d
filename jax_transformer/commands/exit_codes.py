"""The wrapper every command goes through: its outcome becomes one line and an exit code.

    0    done
    1    the run itself failed (RunFailed: e.g. training diverged, parity failed)
    2    bad input: any InputError (config, checkpoint, tokenizer, corpus, port,
         translate and training settings) or an OSError on a path the user gave
    130  stopped by SIGINT (Ctrl-C)    } 128 + the signal number, as a shell reports it;
    143  stopped by SIGTERM            } the last line on stderr says what was saved
    141  its output was closed (`| head -1`): it ends quietly, as a Unix tool that
         SIGPIPE ends (128 + SIGPIPE)

Library code raises and never exits; only this wrapper prints `error: ...` on
stderr. It imports no JAX, so `--help` and torch-only commands stay light.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, Sequence

from jax_transformer.train.runtime.signals import Interrupted, exit_at_once, set_stop_handlers
from transformer_core.errors import InputError, RunFailed


def run(main: Callable[[Sequence[str] | None], int | None],
        argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)` and turn its outcome into an exit code; SIGINT and SIGTERM stop
    it at once (jax_transformer.train.runtime.signals) unless `main` handles them itself.

    After a stop (Interrupted) the stop handlers stay in place: the process is on its
    way out, and a signal sent again while it shuts down (JAX and orbax take seconds)
    exits with the stop's code instead of being killed by the default handler."""
    previous = set_stop_handlers(exit_at_once())
    stopped = False
    try:
        return main(argv) or 0
    except BrokenPipeError:
        quiet_stdout()
        return 128 + signal.SIGPIPE
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


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered for a closed pipe says nothing either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
