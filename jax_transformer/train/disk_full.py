"""A full disk under a training run: one line that says so, not a storm of tracebacks.

When the disk fills, each writer fails its own way: Python's files (metrics.jsonl,
eval.json, the export) raise OSError ENOSPC; tensorstore, which writes orbax's
arrays, raises ValueError("RESOURCE_EXHAUSTED: Error writing ..."). Orbax's
background threads log each failure with its traceback (absl's logger), asyncio
logs every failed write task again ("Task exception was never retrieved"), reads
in flight report `Event loop is closed` as unraisable errors, and then the error
is raised in the main thread: over a thousand lines. `quiet_echoes()` drops those
echoes, and only those (records whose error is a full disk); `is_disk_full` tells
the error the run itself gets, which TrainingRun turns into one DiskFull line.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import warnings
from pathlib import Path

from jax_transformer.train.checkpoints import (CHECKPOINTS, Checkpointer, complete_steps,
                                               drop_failed_restore_echoes)
from transformer_core.errors import RunFailed

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; disk quota exceeded
# What tensorstore says (its errors are not OSErrors) and what OSError prints.
FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
ECHOING_LOGGERS = ("absl", "asyncio")  # orbax's background threads; unretrieved tasks


class DiskFull(RunFailed):
    """The disk under the work directory filled up (exit code 1)."""


def says_disk_full(text: str) -> bool:
    """Whether an error message tells of a full disk (OSError's, or tensorstore's
    RESOURCE_EXHAUSTED on a write)."""
    return any(full in text for full in FULL_TEXTS) or (
        "RESOURCE_EXHAUSTED" in text and "writing" in text.lower())


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or while handling, is a full
    disk: OSError ENOSPC / EDQUOT, or tensorstore's RESOURCE_EXHAUSTED on a write."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (isinstance(error, OSError) and error.errno in FULL_ERRNOS) or says_disk_full(
                str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


class _DropDiskFullEchoes(logging.Filter):
    """Drops the records that report a full disk; once the run has stopped on one
    (`stopped`), every record: what orbax's abandoned save threads say while the
    process exits ("cannot schedule new futures after shutdown") is that failure's echo."""

    run_stopped = False

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (self.run_stopped or is_disk_full(error)
                    or says_disk_full(record.getMessage()))


_FILTER = _DropDiskFullEchoes()


def quiet_echoes() -> None:
    """Drop the background reports of a full disk (see the module's text) for the rest
    of the process: they come while the run goes and after it ends, and the run says
    it in one line. Other records of those loggers, and other errors, still show."""
    drop_failed_restore_echoes()
    _FILTER.run_stopped = False  # a new run (in this process) shows what it meets
    for name in ECHOING_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def stopped(workdir: Path, checkpointer: Checkpointer | None) -> DiskFull:
    """The error that ends a run the full disk stopped: it says so, where, and which
    checkpoint a resume starts from. Saves still in flight are waited for first (they
    fail too), and what orbax's threads still report as the process exits is dropped."""
    _FILTER.run_stopped = True
    if checkpointer is not None:
        with contextlib.suppress(Exception):  # the same full disk, reported by the run
            checkpointer.wait()
    # Orbax's write coroutines the failure left unawaited are collected at exit, each a
    # RuntimeWarning ("coroutine ... was never awaited"): the run has said what happened.
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)
    steps = complete_steps(workdir)
    saved = (f"the newest complete checkpoint, step {steps[-1]} in {workdir / CHECKPOINTS}, "
             "is intact: free space, then run the same command to resume from it" if steps
             else "no checkpoint was complete yet: free space, then run the same command")
    return DiskFull(f"the disk is full: no space left on the device holding {workdir}; {saved}")
