"""Step metrics read late, so the host never waits for the step it has just dispatched.

JAX dispatches a step and returns at once; reading its loss blocks until it is
done, and the devices then idle while the host builds and sends the next batch.
So the loop keeps each step's metrics on the devices and reads them in bulk
every --log-every steps, after the next step has been dispatched (at 1, each
step is read one step late), and all of them before an evaluation, a checkpoint
or the end: the non-finite check (TrainingDiverged) still comes before any
state is saved. Besides evaluations and checkpoints, these are the loop's only
reads of device values (tests/train/test_train.py watches them). The loop runs
no JAX op of its own between steps either: one would queue behind the step just
dispatched (a CPU device runs its programs in order), and the host would wait
for it. So the learning rate is computed in the step and read with the loss.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import jax

from jax_transformer.train.runtime.process_clock import process_seconds
from transformer_core.errors import RunFailed


class TrainingDiverged(RunFailed):
    """The loss or the gradient norm became non-finite."""


class StepMetrics(NamedTuple):
    step: int
    loss: float
    grad_norm: float
    lr: float  # the learning rate the update used
    tokens: int
    tokens_per_s: float  # over the steps read together
    elapsed: float  # seconds from the loop's start to the step's start (before its dispatch)


class LateMetrics:
    """The metrics of the steps dispatched but not yet read."""

    def __init__(self, log_every: int, started: float):
        self.log_every, self.started = log_every, started
        self.pending = []  # (step, device metrics, tokens, seconds at its start)
        self.last_read = started  # time.time() of the last read
        # process_seconds() when the loop's first step was read, so done: at --log-every
        # 1, right after the second step's dispatch
        self.first_step_done = None

    def add(self, step: int, metrics: dict, tokens: int, began: float) -> None:
        """Step `step`'s device metrics; `began`: the time.time() the loop started it."""
        self.pending.append((step, metrics, tokens, began - self.started))

    def due(self) -> bool:
        """Whether --log-every steps wait behind the newest one."""
        return len(self.pending) > self.log_every

    def read(self, all_steps: bool = False) -> list[StepMetrics]:
        """The pending steps' metrics (all but the newest, or all of them), checked
        finite: TrainingDiverged names the first step that is not."""
        taken = self.pending if all_steps else self.pending[:-1]
        self.pending = [] if all_steps else self.pending[-1:]
        if not taken:
            return []
        values = jax.device_get([(m["loss"], m["grad_norm"], m["lr"]) for _, m, _, _ in taken])
        now = time.time()
        if self.first_step_done is None:
            self.first_step_done = process_seconds()
        rate = sum(tokens for _, _, tokens, _ in taken) / max(now - self.last_read, 1e-9)
        self.last_read = now
        read = []
        for (step, _, tokens, elapsed), (loss, grad_norm, lr) in zip(taken, values):
            loss, grad_norm = float(loss), float(grad_norm)
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                raise TrainingDiverged(f"loss {loss} / gradient norm {grad_norm} at step "
                                       f"{step}: stopping")
            read.append(StepMetrics(step, loss, grad_norm, float(lr), tokens, rate, elapsed))
        return read
