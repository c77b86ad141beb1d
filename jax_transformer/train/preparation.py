"""A run prepared: PreparedRun, what the loop (loop.py) and the final evaluation
(export.py) read, and prepare(), which builds it in an opened work directory.

    prepare(...)   the settings checked against a resumed run's (run_args.json); the
                   corpus prepared (or its preparation reused) and the tokenizer; the
                   model's config, the batches, the trainer
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from jax_transformer.data.batches.packed import PackedBatches
from jax_transformer.data.prepared.directory import SPLITS, Prepared
from jax_transformer.train import finetune
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.inputs import (batch_multiple, log, make_batches, prepared_corpus,
                                          run_tokenizer)
from jax_transformer.train.records.report import state_bytes
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.resume import (FINGERPRINT, check_run_settings,
                                                   recorded_settings)
from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.step import Trainer, build_trainer, layers_scanned
from jax_transformer.train.tasks import TASKS, Task
from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import CONFIG_FILE, write_atomically
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer


@dataclasses.dataclass(frozen=True)
class PreparedRun:
    """One run, prepared in its work directory: what the loop and the final evaluation
    read."""
    settings: RunSettings
    task: Task  # TASKS[--task]
    workdir: Path
    primary: bool  # process 0: writes the run's files, holds the lock
    started_at: float  # time.monotonic() when the run began: --time-budget counts from it
    compile_cache: str | None  # the persistent compilation cache in use, if any
    checkpointer: Checkpointer
    resuming: bool  # the work directory holds checkpoints
    init: finetune.InitDir | None  # --init-from's checkpoint directory
    data: Prepared  # the prepared corpus
    tokenizer: Tokenizer
    batches: dict[str, PackedBatches]  # per split
    trainer: Trainer
    start_scores: dict | None = None  # fine-tuning: the starting model's evaluation


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
