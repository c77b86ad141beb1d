"""A training run's work directory: one run at a time, files that are whole or absent.

    WORKDIR/train.lock       held (flock) by the run using the directory
    WORKDIR/run_args.json    the settings a resume must repeat (train/settings/resume.py)
    WORKDIR/metrics.jsonl    one JSON object per line, appended as the run goes
    WORKDIR/tensorboard/     the same numbers as TensorBoard scalars (tensorboard.py)

The lock is an OS file lock (the `filelock` package), so the kernel releases it
when its process ends, however it ends: a crashed or killed run never leaves
the directory locked. Files other than metrics.jsonl are written to a temporary
file and renamed, so a crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator

import filelock

from jax_transformer.train.records.tensorboard import TensorBoardLog
from transformer_core.checkpoint_dir import write_atomically
from transformer_core.errors import TrainError

LOCK_FILE = "train.lock"
METRICS_FILE = "metrics.jsonl"


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


def metrics_record(path: Path, number: int, line: str) -> dict | None:
    """Line `number` of metrics.jsonl as a record: None for a blank line or one a crash cut
    short (not JSON, dropped with a warning); a TrainError naming the file and the line for
    JSON that is not a record: an object with an integer "step", every value a number."""
    try:
        record = json.loads(line) if line else None
    except json.JSONDecodeError:
        print(f"warning: {path}: dropped line {number}, which is not JSON (a "
              f"write cut short): {line[:80]!r}", file=sys.stderr)
        return None
    if record is None:
        return None
    if not (isinstance(record, dict) and type(record.get("step")) is int):
        raise TrainError(f"{path}: line {number} is not a metrics record (an object with an "
                         f"integer \"step\"): {line[:80]!r}; delete or mend it")
    for name, value in record.items():
        if type(value) not in (int, float):  # bool is an int in Python, not in JSON
            raise TrainError(f"{path}: line {number} is not a metrics record: its "
                             f"{json.dumps(name)} is {json.dumps(value)[:40]}, not a number; "
                             "delete or mend it")
    return record


def metrics_records(path: Path) -> Iterator[tuple[str, dict]]:
    """metrics.jsonl's records (metrics_record's checks), each with its line as written."""
    for number, line in enumerate(path.read_text().split("\n"), start=1):
        record = metrics_record(path, number, line)
        if record is not None:
            yield line, record


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
            kept = [line for line, record in metrics_records(path)
                    if record["step"] <= resume_step]
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
