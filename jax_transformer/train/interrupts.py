"""SIGINT and SIGTERM during training: finish the step, save, stop.

Inside `deferred_stops()` the first signal only records a request; the training
loop looks at it between steps, so the checkpoint it then saves holds a model
and a data position that belong together, and metrics.jsonl has every line up
to that step. A second signal exits at once (`cli.exit_at_once`): the step is
abandoned, the newest checkpoint on disk is the last one saved (orbax renames
a checkpoint into place only when it is complete), and a resume drops the
metrics past it. On several hosts, all processes stop after the same step.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from jax_transformer import cli


class StopRequests:
    """The signal handler of `deferred_stops`: the first signal is a request, the second exits."""

    def __init__(self):
        self.signum: int | None = None  # the first signal received
        self.exit_at_once = cli.exit_at_once(
            "received again: stopped at once, without saving this step; run the same command "
            "to resume from the newest checkpoint")

    def handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            self.exit_at_once(signum, frame)
        self.signum = signum
        cli.write_from_handler(f"{signal.Signals(signum).name}: stopping after this step, once "
                               "it is saved (send it again to stop at once without saving)")

    def agreed(self) -> bool:
        """Whether to stop now: any process received a signal (a collective on several hosts)."""
        requested = self.signum is not None
        if jax.process_count() > 1:
            requested = bool(np.any(multihost_utils.process_allgather(np.array(requested))))
        return requested


@contextlib.contextmanager
def deferred_stops() -> Iterator[StopRequests]:
    requests = StopRequests()
    with cli.signal_handlers(requests.handle):
        yield requests
