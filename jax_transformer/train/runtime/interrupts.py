"""SIGINT and SIGTERM during training: finish the step, save, stop.

Inside `deferred_stops()` the first signal only records a request; the training
loop looks at it between steps, so the checkpoint it then saves holds a model
and a data position that belong together, and metrics.jsonl has every line up
to that step. A time budget (--time-budget) stops the run the same way once its
deadline has passed, and --patience once it has run out (train.selection). A second
signal exits at once (`signals.exit_at_once`): the step is abandoned, the newest
checkpoint on disk is the last one saved (orbax renames a checkpoint into place only
when it is complete), and a resume drops the metrics past it. On several hosts, all
processes stop after the same step, without waiting for the devices: process 0
decides through JAX's coordination service (train.runtime.peers).
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Iterator

import jax

from jax_transformer.train.runtime import peers, signals

TIME = "time"  # the stop request of a process past --time-budget's deadline
PATIENCE = "patience"  # process 0's request once --patience has run out
STOP_SIGNALS = {signal.Signals(signum).name: signum for signum in signals.STOP_SIGNALS}


class StopRequests:
    """The signal handler of `deferred_stops`: the first signal is a request, the second
    exits. Passing the `deadline` (time.monotonic()) is a request too."""

    def __init__(self, deadline: float | None = None):
        self.signum: int | None = None  # the first signal received
        self.deadline = deadline
        self.out_of_time = False  # set by agreed(): some process passed the deadline
        self.early = None  # PATIENCE once this process asked to stop early
        self.stopped_early = False  # set by agreed(): the run stops early
        self.exit_at_once = signals.exit_at_once(
            "received again: stopped at once, without saving this step; run the same command "
            "to resume from the newest checkpoint")

    def handle(self, signum: int, frame) -> None:
        if self.signum is not None:
            self.exit_at_once(signum, frame)
        self.signum = signum
        signals.write_from_handler(f"{signal.Signals(signum).name}: stopping after this step, "
                                   "once it is saved (send it again to stop at once without "
                                   "saving)")

    def stop_early(self) -> None:
        """Ask to stop after this step (--patience ran out)."""
        self.early = PATIENCE

    def agreed(self, step: int) -> bool:
        """Whether to stop after `step`: this process received a signal, passed the
        deadline or asked to stop early; on several hosts, any process did, and every
        process gets process 0's answer for this step (train.runtime.peers.agree), so all stop
        after the same step."""
        request = (signal.Signals(self.signum).name if self.signum is not None else
                   TIME if self.deadline is not None and time.monotonic() >= self.deadline
                   else self.early)
        if jax.process_count() > 1:
            request = peers.agree(step, request)
        if request in STOP_SIGNALS:  # a peer's signal stops this process as its own would
            self.signum = STOP_SIGNALS[request]
        self.out_of_time, self.stopped_early = request == TIME, request == PATIENCE
        return request is not None

    def stopped_by(self) -> str:
        """eval.json's "stopped_by": what ended the training (a signal raises instead)."""
        return "time_budget" if self.out_of_time else PATIENCE if self.stopped_early else "steps"


@contextlib.contextmanager
def deferred_stops(deadline: float | None = None) -> Iterator[StopRequests]:
    requests = StopRequests(deadline)
    with signals.signal_handlers(requests.handle):
        yield requests
