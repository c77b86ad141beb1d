"""A training run's work directory: one run at a time, files that are whole or absent.

    WORKDIR/train.lock       held (flock) by the run using the directory
    WORKDIR/run_args.json    the settings a resume must repeat
    WORKDIR/metrics.jsonl    one JSON object per line, appended as the run goes
    WORKDIR/tensorboard/     the same numbers as TensorBoard scalars (tensorboard.py)

The lock is an OS file lock (the `filelock` package), so the kernel releases it
when its process ends, however it ends: a crashed or killed run never leaves
the directory locked. Files other than metrics.jsonl are written to a temporary
file and renamed, so a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import filelock

from jax_transformer.train import run_args
from jax_transformer.train.settings import RESUMABLE_CHANGES, RunSettings, TrainError
from jax_transformer.train.tensorboard import TensorBoardLog
from transformer_core.checkpoint_dir import write_atomically

LOCK_FILE = "train.lock"
RUN_ARGS_FILE = "run_args.json"
METRICS_FILE = "metrics.jsonl"


def recorded_settings(settings: RunSettings) -> dict:
    """What run_args.json holds: every setting a resumed run must repeat, flat."""
    values = {**dataclasses.asdict(settings.data), **dataclasses.asdict(settings.model),
              **dataclasses.asdict(settings.train)}
    return {k: v for k, v in values.items() if k not in RESUMABLE_CHANGES}


def open_workdir(path: str | os.PathLike) -> tuple[Path, filelock.BaseFileLock]:
    """Create the work directory if needed and lock it for this run; release the
    returned lock when the run ends. Refuses a file, or a directory another run holds."""
    workdir = Path(path)
    if workdir.exists() and not workdir.is_dir():
        raise TrainError(f"--workdir {workdir} is a file, not a directory")
    workdir.mkdir(parents=True, exist_ok=True)
    lock = filelock.FileLock(workdir / LOCK_FILE, timeout=0)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise TrainError(f"--workdir {workdir} is in use by another train.py run (it holds "
                         f"{workdir / LOCK_FILE}); wait for it to end or choose another "
                         "--workdir") from None
    return workdir, lock


def write_text_atomically(path: Path, text: str) -> None:
    """Write `path` whole or not at all (checkpoint_dir.write_atomically)."""
    write_atomically(path, lambda tmp: tmp.write_text(text))


def check_run_settings(workdir: Path, settings: dict, resuming: bool,
                       primary: bool = True) -> None:
    """Record the settings of a new run (`recorded_settings`; the `primary` process
    writes them); refuse to resume one with other settings."""
    path = workdir / RUN_ARGS_FILE
    if resuming:
        saved = run_args.upgrade(read_run_settings(path))
        check_init_from(workdir, saved.get(FINGERPRINT), settings.get(FINGERPRINT))
        changed = sorted(k for k in settings if saved.get(k) != settings[k])
        if changed:
            detail = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)!r} -> {settings[k]!r}"
                               for k in changed)
            raise TrainError(f"{workdir} holds a run with other settings ({detail}); "
                             "resume with the same flags or use a new --workdir")
    elif primary:
        write_text_atomically(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")


def read_run_settings(path: Path) -> dict:
    """A resumed run's run_args.json, which must be there and hold a JSON object: without
    it the checkpoints' settings are unknown, and a resume with other model flags would
    record them as the run's."""
    if not path.exists():
        raise TrainError(f"{path.parent} holds checkpoints but no {path.name} (the settings "
                         "they were trained with); restore it or use a new --workdir")
    try:
        saved = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TrainError(f"{path} is not valid JSON ({e}); restore it or use a new "
                         "--workdir") from None
    if not isinstance(saved, dict):
        raise TrainError(f"{path} holds {json.dumps(saved)[:40]}, not a JSON object of "
                         "settings; restore it or use a new --workdir")
    return saved


def metrics_step(path: Path, number: int, line: str) -> int | None:
    """The step of line `number` of metrics.jsonl: None for a blank line or one a crash cut
    short (not JSON, dropped with a warning); a TrainError for JSON that is not a record."""
    try:
        record = json.loads(line) if line else None
    except json.JSONDecodeError:
        print(f"warning: {path}: dropped line {number}, which is not JSON (a "
              f"write cut short): {line[:80]!r}", file=sys.stderr)
        return None
    if record is not None and not (isinstance(record, dict) and type(record.get("step")) is int):
        raise TrainError(f"{path}: line {number} is not a metrics record (an object with an "
                         f"integer \"step\"): {line[:80]!r}; delete or mend it")
    return None if record is None else record["step"]


class MetricsLog:
    """metrics.jsonl, appended a line at a time, and TensorBoard scalars of the same
    records when `tensorboard` names their directory. On resume, lines past the
    restored step are dropped, so the file reads as if the run had never stopped; so
    is a line a crash cut short (with a warning). TensorBoard drops them itself
    (tensorboard.py). Only the `enabled` process (process 0) writes either."""

    def __init__(self, path: Path, resume_step: int, enabled: bool = True,
                 tensorboard: Path | None = None):
        self.path, self.enabled = path, enabled
        if not enabled:  # another host's process: process 0 keeps the log
            return
        kept = []
        if resume_step and path.exists():
            for number, line in enumerate(path.read_text().split("\n"), start=1):
                step = metrics_step(path, number, line)
                if step is not None and step <= resume_step:
                    kept.append(line)
        write_text_atomically(path, "".join(line + "\n" for line in kept))
        self.file = path.open("a", buffering=1)
        self.tensorboard = (TensorBoardLog(tensorboard, resume_step + 1) if tensorboard
                            else None)

    def write(self, **record) -> None:
        if self.enabled:
            self.file.write(json.dumps(record) + "\n")
            if self.tensorboard:
                self.tensorboard.write(record)

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            if self.tensorboard:
                self.tensorboard.close()


FINGERPRINT = "init_from_fingerprint"  # run_args.json: the --init-from checkpoint's digest


def check_init_from(workdir: Path, saved: str | None, given: str | None) -> None:
    """A resumed run starts from the checkpoint directory it started from (its
    fingerprint, train.finetune.fingerprint), or from none if it trained from scratch."""
    if saved == given:
        return
    if given is None:
        raise TrainError(f"{workdir} holds a fine-tuning run (--init-from a checkpoint with "
                         f"fingerprint {saved}): resume it with the same --init-from DIR")
    if saved is None:
        raise TrainError(f"{workdir} holds a run trained from scratch; fine-tune in a new "
                         "--workdir")
    raise TrainError(f"--init-from holds another checkpoint (fingerprint {given}) than the "
                     f"one the run in {workdir} started from ({saved}): resume with that "
                     "one, or fine-tune in a new --workdir")
