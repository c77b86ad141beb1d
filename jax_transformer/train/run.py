"""A training run: the job behind train.py, from its settings to eval.json.

    run(settings, init)   set up the process, open the work directory, then
                          preparation.prepare()   the corpus, the tokenizer, the trainer
                          loop.train()            the steps, evaluations, checkpoints
                          export.export_and_evaluate()   WORKDIR/export, eval.json

The task (--task, train.tasks) decides the corpus, the architecture and the final
evaluation; the rest is shared. Resuming: a work directory that holds
checkpoints is resumed from the latest one with the same settings, tokenizer,
data order and dropout stream, so the losses continue exactly as in an
uninterrupted run. Fine-tuning (--init-from DIR, train.finetune): the model, its
weights and its tokenizer come from DIR, and the starting model is evaluated before
the first step (WORKDIR/start_eval.json, eval.json's "start").
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import jax

from jax_transformer.train import disk_full, distributed, export, finetune, loop
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.inputs import log
from jax_transformer.train.preparation import PreparedRun, prepare
from jax_transformer.train.records.workdir import open_workdir
from jax_transformer.train.runtime import (compiling, cpu_devices, host_memory, jax_variables,
                                           sharding, signals)
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.training import TrainSettings, default_compile_cache


def run(settings: RunSettings, init: finetune.InitDir | None = None) -> dict:
    """Train (or resume), then export and evaluate; returns eval.json's contents plus
    "train_seconds". `init`: --init-from's directory as the command read and checked it
    (else the run reads and checks it). A full disk, or a checkpoints directory that
    refuses writes, is one DiskFull or WritesRefused error (exit 1) that says so,
    where, and which checkpoint a resume starts from (disk_full.py). --distributed:
    this process joins the others first, and ends with them (train.distributed)."""
    started_at = time.monotonic()  # --time-budget counts from here
    train = settings.train
    disk_full.quiet_echoes(Path(train.workdir))
    distributed.check_environment(train)
    cpu_devices.split_cpu(train.cpu_devices, settings.data.fewest_rows)
    host_memory.keep_freed_memory()
    if train.distributed:
        distributed.initialize(train)
    jax_variables.start_backends()
    sharding.check_fsdp(train.fsdp, jax.device_count())  # before the corpus is read
    if not train.distributed:
        return run_in_workdir(settings, init, started_at)
    with distributed.together(train, lambda: distributed.resume_hint(Path(train.workdir))):
        return run_in_workdir(settings, init, started_at)


def run_in_workdir(settings: RunSettings, init: finetune.InitDir | None,
                   started_at: float) -> dict:
    """The compilation cache, the work directory (locked by process 0) and its
    checkpointer; then prepare, train, export and evaluate. The checkpointer is closed
    and the lock released on an error too: orbax's background work (cleaning up
    unfinished saves, saving) must end before the interpreter does, or it prints
    tracebacks. Then a full disk or a refused write is one line (disk_full.disk_fault)."""
    train, workdir = settings.train, Path(settings.train.workdir)
    checkpointer = None  # once opened: disk_fault waits for its saves
    try:
        with contextlib.ExitStack() as cleanup:
            compile_cache = compiling.use_compilation_cache(
                None if compile_cache_unsafe(train) else train.compile_cache, warn=log,
                default=default_compile_cache())
            compiling.CompileCounter.start()
            primary = jax.process_index() == 0  # writes the run's files, holds the lock
            if primary:
                _, lock = open_workdir(workdir)
                cleanup.callback(lock.release)
            checkpointer = cleanup.enter_context(Checkpointer(
                workdir, keep=train.keep, clean_up=True, best=train.keep_best))
            prepared = prepare(settings, init, workdir, primary, checkpointer,
                               compile_cache=compile_cache, started_at=started_at)
            return train_export_evaluate(prepared)
    except Exception as error:
        fault = disk_full.disk_fault(workdir, checkpointer, error)
        if fault is None:
            raise
        raise fault from None


def compile_cache_unsafe(settings: TrainSettings) -> bool:
    """Whether this run's programs must not come from the compilation cache, and if
    so, a line in the log that says why: with --fsdp on the CPU, a step that XLA:CPU
    (jaxlib 0.10.2) loads from the cache can deadlock in its devices' collectives
    until XLA aborts the process (docs/training.md, --fsdp)."""
    if settings.fsdp == 1 or settings.compile_cache is None or jax.default_backend() != "cpu":
        return False
    log("compilation cache: off, as with --no-compile-cache: with --fsdp on the CPU, "
        "programs loaded from it can deadlock (docs/training.md)")
    return True


def train_export_evaluate(prepared: PreparedRun) -> dict:
    """A fine-tuning run's starting model evaluated, the loop, then the export and the
    final evaluation: eval.json's contents plus "train_seconds"."""
    if prepared.init is not None:
        prepared = dataclasses.replace(prepared, start_scores=export.evaluate_start(prepared))
    started = time.time()
    state, report, dev_scores = loop.train(prepared)
    train_seconds = time.time() - started
    with signals.signal_handlers(signals.exit_at_once(
            f"stopped during the final export and evaluation; training is saved at "
            f"step {int(state.step)}; run the same command to finish them")):
        summary = export.export_and_evaluate(prepared, state, report, dev_scores)
    summary["train_seconds"] = round(train_seconds, 1)
    return summary
