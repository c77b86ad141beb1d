"""The base class of every error a user's input can cause, and how such errors (and the
lines a command prints) list and count things.

Each concern has its own subclass (ConfigError, CheckpointError, TokenizerError,
CorpusError, PortError, TranslateError, TrainError), most beside the code that
raises them; TrainError lives here because train/'s runtime raises it too, below the
settings. Library code raises them and never exits. The command-line wrapper (jax_transformer.commands.exit_codes)
prints any InputError as `error: ...` on stderr and exits with code 2, a
RunFailed with code 1.
"""

from __future__ import annotations

from typing import Iterable


class InputError(ValueError):
    """Bad input (a flag, a file, a config value); the message says which and why."""


class TrainError(InputError):
    """A training run cannot start as asked (settings, work directory, environment)."""


class RunFailed(RuntimeError):
    """A run that started well could not finish (exit code 1); the message says why."""


def listing(items: Iterable[str], limit: int = 10) -> str:
    """'a, b, c' for at most `limit` items, then '(+N more)'."""
    items = list(items)
    text = ", ".join(items[:limit])
    return text + (f" (+{len(items) - limit} more)" if len(items) > limit else "")


def counted(count: int, noun: str) -> str:
    """'1 evaluation', '2 evaluations': `count` and `noun`, plural unless one."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
