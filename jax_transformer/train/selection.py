"""Which steps a run evaluates and saves (Policy), when it stops early, and which model
it ends with: the best checkpoint by a dev metric (--keep-best), early stopping
(--patience), and what WORKDIR/export holds (--export last | best | average of the
last --average-last checkpoints).

The best checkpoint is orbax's own bookkeeping: every evaluation saves a checkpoint
with its dev metrics and its step, and the checkpoint manager keeps the newest --keep ones
plus the best one (`kept_checkpoints`). Patience counts evaluations in metrics.jsonl, which
a resumed run has up to its step, so a run stopped by it and run again stops at once.

One rule for ties, in both: the earliest best. An evaluation that only equals the best
is no improvement (Patience counts it against --patience, as Keras, Hugging Face's
Trainer and Marian count it), so the best is the first step that reached the score,
the model with fewer updates for the same result, and the step the patience line names
is the step --export best exports.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterable

import jax
import numpy as np
from orbax.checkpoint.checkpoint_managers import preservation_policy

from jax_transformer.train.records.workdir import metrics_records
from jax_transformer.train.settings.training import BEST_METRICS, TrainSettings
from jax_transformer.train.runtime import sharding
from transformer_core.averaging import ParameterMean
from transformer_core.errors import counted


def kept_checkpoints(keep: int, best: str | None) -> dict:
    """orbax.checkpoint.CheckpointManagerOptions' arguments that keep the newest `keep`
    checkpoints and, with `best`, the best one by that metric besides (of the
    checkpoints saved with metrics: those of evaluations)."""
    if best is None:
        return dict(max_to_keep=keep)
    lower_is_better = BEST_METRICS[best] == "min"

    def rank(metrics: dict) -> tuple:
        """The sort key orbax ranks by, the best last: the metric, then, among equal
        values, the earlier step (a checkpoint saved without its step ranks as step 0)."""
        step = metrics.get("step", 0)
        return metrics[best], step if lower_is_better else -step

    return dict(
        best_fn=rank, best_mode=BEST_METRICS[best],
        preservation_policy=preservation_policy.AnyPreservationPolicy([
            preservation_policy.LatestN(n=keep),
            preservation_policy.BestN(get_metric_fn=rank, reverse=lower_is_better, n=1,
                                      keep_checkpoints_without_metrics=False)]))


class Patience:
    """--patience: evaluations since --keep-best's metric last improved, counted from
    metrics.jsonl (a resumed run's, up to its step) on, or never spent where
    `metrics_file` is None (the processes other than process 0, which decides)."""

    def __init__(self, metric: str | None, patience: int | None, metrics_file: Path | None):
        self.metric, self.patience = metric, patience if metrics_file else None
        self.best, self.best_step, self.since = None, None, 0
        if self.patience is not None and metrics_file.exists():
            for _, record in metrics_records(metrics_file):
                if metric in record:
                    self.add(record["step"], record[metric])

    def add(self, step: int, value: float) -> None:
        """Count an evaluation: a new best only when strictly better (the earliest best
        stands on a tie)."""
        if self.best is None or (value < self.best if BEST_METRICS[self.metric] == "min"
                                 else value > self.best):
            self.best, self.best_step, self.since = value, step, 0
        else:
            self.since += 1

    def spent(self) -> bool:
        return self.patience is not None and self.since >= self.patience

    def reason(self) -> str:
        return (f"--patience {self.patience}: {self.metric} has not improved for "
                f"{counted(self.since, 'evaluation')} (best {self.best:.4g} at step "
                f"{self.best_step})")


class Policy:
    """When the loop evaluates and saves: every --eval-every and --checkpoint-every steps
    and at the last step; with --keep-best, every evaluation is saved with its scores,
    which --patience judges."""

    def __init__(self, settings: TrainSettings, metrics_file: Path | None):
        """`metrics_file`: metrics.jsonl, which process 0 (the one that decides
        --patience) passes; the others pass None."""
        self.settings = settings
        self.patience = Patience(settings.keep_best, settings.patience, metrics_file)

    def due(self, step: int) -> tuple[bool, bool]:
        """Whether `step` is evaluated, and whether it is saved."""
        settings = self.settings
        last = step == settings.steps
        evaluate = step % settings.eval_every == 0 or last
        save = (step % settings.checkpoint_every == 0 or last
                or evaluate and settings.keep_best is not None)
        return evaluate, save

    def judge(self, step: int, scores: dict) -> bool:
        """Count an evaluation's `scores` (--keep-best's metric among them); True once
        --patience has run out."""
        if self.settings.keep_best:
            self.patience.add(step, scores[self.settings.keep_best])
        return self.patience.spent()


def mean_params(restored: Iterable[tuple[int, object]]):
    """The element-wise mean (float64 sums, float32) of (step, parameter pytree) pairs of
    one structure, taken one at a time, as a pytree of numpy arrays in that structure."""
    mean, treedef = ParameterMean(), None
    for step, params in restored:
        flat, treedef = jax.tree_util.tree_flatten_with_path(params)
        mean.add({jax.tree_util.keystr(path): np.asarray(sharding.local_copy(leaf))
                  for path, leaf in flat}, f"checkpoint {step}")
        paths = [jax.tree_util.keystr(path) for path, _ in flat]
    means = mean.result()
    return jax.tree_util.tree_unflatten(treedef, [means[path] for path in paths])


def exported_state(export: str, state, checkpointer, average_last: int, params_sharding, log):
    """The state whose model the run exports and evaluates (--export), and what it is
    (eval.json's "export"): `state` itself, the best checkpoint's parameters in it, or
    the mean of the newest `average_last` checkpoints' (fewer where fewer were saved)."""
    checkpointer.wait()  # the final save is among the checkpoints
    best = checkpointer.best_step() if export == "best" else None
    if export == "last" or export == "best" and best is None:
        if export == "best":
            log("--export best: no checkpoint was saved with an evaluation's metrics; "
                "exporting the last model")
        return state, {"model": "last", "step": int(state.step)}
    if export == "best":
        params = checkpointer.restore(state, best)[0].params
        log(f"--export best: checkpoint {best}")
        return dataclasses.replace(state, params=params), {"model": "best", "step": best}
    steps = sorted(checkpointer.manager.all_steps())[-average_last:]
    params = mean_params((step, checkpointer.restore(state, step)[0].params) for step in steps)
    log(f"--export average: the mean of checkpoints {', '.join(map(str, steps))}")
    return (dataclasses.replace(state, params=sharding.place(params, params_sharding)),
            {"model": "average", "steps": steps})
