"""A training run: the job behind train.py, from its settings to eval.json.

    run(settings, init)   set up the process, open the work directory, then
                          prepare()               the corpus, the tokenizer, the trainer:
                                                  a loop.PreparedRun
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
import numpy as np

from jax_transformer.data.prepared.directory import SPLITS, Prepared
from jax_transformer.train import disk_full, distributed, export, finetune, loop
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.inputs import (batch_multiple, log, make_batches, prepared_corpus,
                                          run_tokenizer)
from jax_transformer.train.loop import PreparedRun
from jax_transformer.train.records.report import state_bytes
from jax_transformer.train.records.workdir import open_workdir
from jax_transformer.train.runtime import (compiling, cpu_devices, host_memory, jax_variables,
                                           sharding, signals)
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.resume import (FINGERPRINT, check_run_settings,
                                                   recorded_settings)
from jax_transformer.train.settings.training import TrainSettings, default_compile_cache
from jax_transformer.train.step import Trainer, build_trainer, layers_scanned
from jax_transformer.train.tasks import TASKS
from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import CONFIG_FILE, write_atomically
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer


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


def prepare(settings: RunSettings, init: finetune.InitDir | None, workdir: Path,
            primary: bool, checkpointer: Checkpointer, *, compile_cache: str | None,
            started_at: float) -> PreparedRun:
    """Check the settings against a resumed run's; prepare the corpus (or reuse its
    preparation), and build the batches, the model and its trainer."""
    train, resumed_step = settings.train, checkpointer.latest_step()
    resuming = resumed_step is not None
    if init is None and train.init_from:
        init = finetune.read_init_dir(train.init_from)
        finetune.check_settings(settings, init)
    recorded = recorded_settings(settings)
    if init is not None:
        recorded[FINGERPRINT] = finetune.fingerprint(init.directory)
        log(f"fine-tuning {init.directory} (fingerprint {recorded[FINGERPRINT]})")
    check_run_settings(workdir, recorded, resuming, primary)
    data, tokenizer, special_ids = prepare_data(settings, init, workdir, resumed_step, primary,
                                                recorded.get(FINGERPRINT))
    config = model_config(settings, init, workdir, resuming, primary, tokenizer)
    saved = checkpointer.data_state() if resuming else None
    vocab_sizes = config.src_vocab_size, config.tgt_vocab_size  # the ids the model embeds
    batches = make_batches({split: data.sides(split, vocab_sizes) for split in SPLITS},
                           settings.data, train.seed, special_ids,
                           {split: data.fingerprint(split) for split in SPLITS},
                           batch_multiple(saved))
    weights = None
    if init is not None and not resuming:  # a resume restores its own weights
        _, tensors = checkpoint_dir.load_dir(init.directory)
        weights = {k: v.astype(np.float32) for k, v in tensors.items()}
    trainer = build_trainer(config, train, weights)
    log_model(config, trainer, train)
    return PreparedRun(settings=settings, task=TASKS[settings.data.task], workdir=workdir,
                       primary=primary, started_at=started_at, compile_cache=compile_cache,
                       checkpointer=checkpointer, resuming=resuming, init=init, data=data,
                       tokenizer=tokenizer, batches=batches, trainer=trainer)


def prepare_data(settings: RunSettings, init: finetune.InitDir | None, workdir: Path,
                 resumed_step: int | None, primary: bool, init_fingerprint: str | None
                 ) -> tuple[Prepared, Tokenizer, tuple[int, int, int]]:
    """The prepared corpus and the tokenizer (fine-tuning: the checkpoint's own, never
    a new one), and the special ids (pad, bos, eos) the batches use."""
    if init is None:
        data = prepared_corpus(workdir, settings, resumed_step, primary)
        tokenizer = run_tokenizer(workdir, data, resumed_step is not None, primary)
        return data, tokenizer, (PAD_ID, BOS_ID, EOS_ID)
    codes = finetune.language_codes(settings)
    tokenizer = finetune.install_tokenizer(init, workdir, codes, primary)
    log(f"tokenizer: {init.directory}'s ({type(tokenizer).__name__}: "
        f"{', '.join(finetune.tokenizer_files(init.directory))})"
        + (" {} -> {}".format(*codes) if any(codes) else ""))
    data = prepared_corpus(workdir, settings, resumed_step, primary, tokenizer,
                           f"{init_fingerprint} {codes}")
    return data, tokenizer, (init.config.pad_id, init.config.bos_id, init.config.eos_id)


def model_config(settings: RunSettings, init: finetune.InitDir | None, workdir: Path,
                 resuming: bool, primary: bool, tokenizer: Tokenizer) -> TransformerConfig:
    """A resumed run's config.json; else the new one (from --init-from's and the model
    flags, or the flags alone), written to the work directory."""
    config_path = workdir / CONFIG_FILE
    if resuming and config_path.exists():
        return TransformerConfig.from_json(config_path)
    data_settings, model_settings, _ = settings
    if init is not None:
        config = finetune.run_config(init.config, model_settings)
    else:
        config = model_settings.config(tokenizer.vocab_size, data_settings.max_len,
                                       data_settings.architecture)
    if primary:
        write_atomically(config_path, config.to_json)
    return config


def log_model(config: TransformerConfig, trainer: Trainer, settings: TrainSettings) -> None:
    """The model's line: architecture, size, layers, dtype, devices; with --fsdp, the
    share of the state each device holds."""
    num_params = sum(p.size for p in jax.tree.leaves(trainer.initial_state.params))
    layers = (f"{config.num_encoder_layers}+{config.num_decoder_layers}"
              if config.architecture == "encoder_decoder" else config.num_decoder_layers)
    scan = " (scanned)" if layers_scanned(settings) else ""
    log(f"model: {config.architecture}, {num_params / 1e6:.2f}M parameters, d_model "
        f"{config.d_model}, {layers} layers{scan}, {settings.dtype} compute, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s)")
    if settings.fsdp > 1:
        held = {k: v / 2**20 for k, v in state_bytes(trainer.initial_state).items()}
        log(f"--fsdp {settings.fsdp}: each device holds {held['device_state_bytes']:,.1f} "
            f"MiB of the {held['state_bytes']:,.1f} MiB of parameters and Adam moments")


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
