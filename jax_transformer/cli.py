"""The wrapper every command line goes through: errors become one line and an exit code.

    0    done
    1    the run itself failed (RunFailed: e.g. training diverged)
    2    bad input: any InputError (config, checkpoint, tokenizer, corpus, port,
         translate and training settings) or an OSError on a path the user gave
    130  interrupted (Ctrl-C; Interrupted says what was saved)

Library code raises and never exits; only this wrapper prints `error: ...` on
stderr. It imports no JAX, so `--help` and torch-only commands stay light.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from transformer_core.errors import InputError


class RunFailed(RuntimeError):
    """A run that started well could not finish (exit code 1); the message says why."""


class Interrupted(Exception):
    """Ctrl-C, handled: the message says what was kept (exit code 130)."""


def run(main: Callable[[Sequence[str] | None], int | None],
        argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)` and turn its outcome into an exit code."""
    try:
        return main(argv) or 0
    except (InputError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Interrupted as e:
        print(e, file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
