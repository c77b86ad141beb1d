"""A disk that fails a training run's writes, full or refusing them: one line that
says so, not a storm of tracebacks.

When the disk fills, each writer fails its own way: Python's files (metrics.jsonl,
eval.json, the export) raise OSError ENOSPC; tensorstore, which writes orbax's
arrays, raises ValueError("RESOURCE_EXHAUSTED: Error writing ..."). Orbax's
background threads log each failure with its traceback (absl's logger), asyncio
logs every failed write task again ("Task exception was never retrieved"), reads
in flight report `Event loop is closed` as unraisable errors, and then the error
is raised in the main thread: over a thousand lines. `quiet_echoes()` drops those
echoes, and only those (records whose error is a full disk or a refused write);
`disk_fault` turns the error the run itself gets into one DiskFull or WritesRefused line.

A checkpoints directory that refuses writes (made read-only: `chattr +i`, a read-only
remount, its permissions) fails orbax's save where it makes the step's temporary
directory, a PermissionError that orbax's threads log three times before the main
thread gets it. The threads that would write the step's arrays wait for the signal
that the directory exists, which never comes, until orbax's coordination timeout
(300 s); the interpreter's exit waits for them, so train.py leaves at once after a
failed run (jax_transformer.commands.train).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import warnings
from pathlib import Path

from jax_transformer.train.checkpoints import (CHECKPOINTS, Checkpointer, UnreadableCheckpoint,
                                               complete_steps, drop_failed_restore_echoes)
from transformer_core.errors import RunFailed

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # no space left; disk quota exceeded
# What tensorstore says (its errors are not OSErrors) and what OSError prints.
FULL_TEXTS = ("No space left on device", "Disk quota exceeded")
REFUSED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
# tensorstore's status for a refused write, and what OSError prints for one.
REFUSED_TEXTS = ("PERMISSION_DENIED", "Permission denied", "Operation not permitted",
                 "Read-only file system")
ECHOING_LOGGERS = ("absl", "asyncio")  # orbax's background threads; unretrieved tasks


class DiskFull(RunFailed):
    """The disk under the work directory filled up (exit code 1)."""


class WritesRefused(RunFailed):
    """The checkpoints directory stopped taking writes mid-run (exit code 1)."""


def says_disk_full(text: str) -> bool:
    """Whether an error message tells of a full disk (OSError's, or tensorstore's
    RESOURCE_EXHAUSTED on a write)."""
    return any(full in text for full in FULL_TEXTS) or (
        "RESOURCE_EXHAUSTED" in text and "writing" in text.lower())


def chain(error: BaseException | None):
    """`error`, then each error it was raised from or while handling."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from or while handling, is a full
    disk: OSError ENOSPC / EDQUOT, or tensorstore's RESOURCE_EXHAUSTED on a write."""
    return any((isinstance(e, OSError) and e.errno in FULL_ERRNOS) or says_disk_full(str(e))
               for e in chain(error))


def refused_write(error: BaseException | None, directory: Path) -> BaseException | None:
    """The error in `error`'s chain that is a write refused under `directory` (absolute):
    OSError EACCES / EPERM / EROFS on a path in it, or tensorstore's PERMISSION_DENIED on
    a write naming one. None where there is none: a refused write elsewhere (a corpus
    file) is not the checkpoints' fault, and a checkpoint that cannot be read
    (UnreadableCheckpoint) says so itself."""
    for e in chain(error):
        if isinstance(e, UnreadableCheckpoint):
            return None
        if isinstance(e, OSError) and e.errno in REFUSED_ERRNOS:
            if e.filename and Path(os.fsdecode(e.filename)).absolute().is_relative_to(directory):
                return e
        elif (str(directory) in str(e) and "writing" in str(e).lower()
              and any(text in str(e) for text in REFUSED_TEXTS)):
            return e
    return None


class _DropWriteFaultEchoes(logging.Filter):
    """Drops the records that report a full disk, or a write refused under `directory`
    (the run's checkpoints); once the run has stopped on one (`run_stopped`), every
    record: what orbax's abandoned save threads say while the process exits ("cannot
    schedule new futures after shutdown") is that failure's echo."""

    run_stopped = False
    directory: Path | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        refused = self.directory is not None and refused_write(error, self.directory)
        return not (self.run_stopped or is_disk_full(error) or refused
                    or says_disk_full(record.getMessage()))


_FILTER = _DropWriteFaultEchoes()


def quiet_echoes(workdir: Path) -> None:
    """Drop the background reports of a full disk, or of writes refused under
    WORKDIR/checkpoints (see the module's text), for the rest of the process: they come
    while the run goes and after it ends, and the run says it in one line. Other
    records of those loggers, and other errors, still show."""
    drop_failed_restore_echoes()
    _FILTER.run_stopped = False  # a new run (in this process) shows what it meets
    _FILTER.directory = workdir.absolute() / CHECKPOINTS
    for name in ECHOING_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


def disk_fault(workdir: Path, checkpointer: Checkpointer | None,
               error: BaseException) -> RunFailed | None:
    """The error that ends a run `error` stopped, if it is a full disk (DiskFull) or a
    write refused under WORKDIR/checkpoints (WritesRefused): it says so, where, and which
    checkpoint a resume starts from; None for any other error. Saves still in flight are
    waited for first (they fail too), and what orbax's threads still report as the
    process exits is dropped."""
    refused = refused_write(error, workdir.absolute() / CHECKPOINTS)
    if refused is None and not is_disk_full(error):
        return None
    _FILTER.run_stopped = True
    if checkpointer is not None:
        with contextlib.suppress(Exception):  # the same fault, reported by the run
            checkpointer.wait()
    # Orbax's write coroutines the failure left unawaited are collected at exit, each a
    # RuntimeWarning ("coroutine ... was never awaited"): the run has said what happened.
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited",
                            category=RuntimeWarning)
    if refused is None:
        return DiskFull(f"the disk is full: no space left on the device holding {workdir}; "
                        f"{resume_from(workdir, 'free space')}")
    resume = resume_from(workdir, f"make {workdir} writable")
    return WritesRefused(f"writing a checkpoint was refused: {refusal(refused)} (is the work "
                         f"directory read-only?); {resume}")


def save_threads_waiting() -> bool:
    """Whether a run this process ran stopped on its disk (`disk_fault`), leaving threads
    the interpreter's exit waits for (not daemons): the writers of the save that failed,
    which wait minutes for orbax's timeout (see the module's text)."""
    return _FILTER.run_stopped and any(
        thread.is_alive() and not thread.daemon for thread in threading.enumerate()
        if thread is not threading.main_thread())


def refusal(error: BaseException) -> str:
    """What a refused write says: the OS's words and the path, or tensorstore's first
    line."""
    if isinstance(error, OSError):
        return f"{error.strerror}: {error.filename}"
    return str(error).split("\n")[0][:300]


def resume_from(workdir: Path, remedy: str) -> str:
    """Which checkpoint a run stopped by its disk resumes from, once `remedy` is done."""
    steps = complete_steps(workdir)
    if not steps:
        return f"no checkpoint was complete yet: {remedy}, then run the same command"
    return (f"the newest complete checkpoint, step {steps[-1]} in {workdir / CHECKPOINTS}, "
            f"is intact: {remedy}, then run the same command to resume from it")
