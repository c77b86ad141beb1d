"""The training run behind train.py: data, model, loop, checkpoints, evaluation, export.

The task (--task) decides the corpus, the architecture and the final evaluation:
translation.py (sentence pairs, encoder-decoder) or language_model.py (lines,
decoder-only); the rest is shared.

Resuming: a work directory that holds checkpoints is resumed from the latest
one with the same settings, tokenizer, data order and dropout stream, so the
losses continue exactly as in an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from jax_transformer import cli
from jax_transformer.cli import RunFailed
from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.batching import (PackedBatches, fitting_row_shape, positions_needed,
                                           train_tokenizer)
from jax_transformer.model import build_model
from jax_transformer.train import (compiling, evaluation, interrupts, language_model, plots,
                                   translation)
from jax_transformer.train.checkpoints import Checkpointer
from jax_transformer.train.settings import (DataSettings, ModelSettings, TrainError, TrainSettings,
                                            recorded)
from jax_transformer.train.step import Trainer, make_optimizer, paper_schedule
from jax_transformer.train.tensorboard import TENSORBOARD_DIR
from jax_transformer.train.workdir import (METRICS_FILE, MetricsLog, check_run_settings,
                                           open_workdir, write_text_atomically)
from transformer_core.checkpoint_dir import CONFIG_FILE, TOKENIZER_FILE, write_atomically
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import Tokenizer, TokenizerError


TASKS = {"translate": translation, "lm": language_model}


class TrainingDiverged(RunFailed):
    """The loss or the gradient norm became non-finite."""


def log(message: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stderr)


def load_corpus(data: DataSettings, seed: int) -> dict[str, list]:
    """{"train", "dev", "test"}: sentence pairs (translate) or lines of text (lm)."""
    return TASKS[data.task].load_splits(data, seed, log)


def run(data_settings: DataSettings, model_settings: ModelSettings,
        settings: TrainSettings) -> dict:
    """Train (or resume) in `settings.workdir`, then export and evaluate; returns eval.json's
    contents plus "train_seconds". `settings.time_budget` counts from here."""
    run_started = time.monotonic()
    if settings.distributed:
        jax.distributed.initialize()
    compiling.use_compilation_cache(settings.compile_cache)
    compiling.CompileCounter.start()
    primary = jax.process_index() == 0  # writes the run's files and holds the workdir lock
    workdir, lock = open_workdir(settings.workdir) if primary else (Path(settings.workdir), None)
    try:
        return run_in(workdir, primary, data_settings, model_settings, settings, run_started)
    finally:
        if lock is not None:
            lock.release()


def run_in(workdir: Path, primary: bool, data_settings: DataSettings,
           model_settings: ModelSettings, settings: TrainSettings, run_started: float) -> dict:
    """`run`, inside the locked work directory; `run_started` is its time.monotonic()."""
    checkpointer = Checkpointer(workdir, keep=settings.keep)
    resuming = checkpointer.latest_step() is not None
    check_run_settings(workdir, recorded(data_settings, model_settings, settings), resuming,
                       primary)

    splits = load_corpus(data_settings, settings.seed)
    tokenizer = load_tokenizer(workdir, splits["train"], data_settings, settings.seed, resuming)
    data = make_batches(splits, tokenizer, data_settings, settings.seed)

    config_path = workdir / CONFIG_FILE
    if resuming and config_path.exists():
        config = TransformerConfig.from_json(config_path)
    else:
        config = model_settings.config(tokenizer.vocab_size, data_settings.max_len,
                                       data_settings.architecture)
        if primary:
            write_atomically(config_path, config.to_json)
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[settings.dtype]
    model = build_model(config, rngs=nnx.Rngs(settings.seed), dtype=dtype,
                        param_dtype=jnp.float32)
    schedule = paper_schedule(config.d_model, settings.warmup, settings.lr_scale)
    trainer = Trainer(model, make_optimizer(schedule, settings.clip_norm),
                      settings.label_smoothing)
    num_params = sum(p.size for p in jax.tree.leaves(trainer.initial_state.params))
    layers = (f"{config.num_encoder_layers}+{config.num_decoder_layers}"
              if config.architecture == "encoder_decoder" else config.num_decoder_layers)
    log(f"model: {config.architecture}, {num_params / 1e6:.2f}M parameters, d_model "
        f"{config.d_model}, {layers} layers, {settings.dtype} "
        f"compute, {jax.device_count()} {jax.devices()[0].platform} device(s)")

    started = time.time()
    state, report = train(trainer, schedule, checkpointer, data, settings, data_settings,
                          resuming, run_started)
    train_seconds = time.time() - started
    with cli.signal_handlers(cli.exit_at_once(
            f"stopped during the final export and evaluation; training is saved at step "
            f"{int(state.step)}; run the same command to finish them")):
        summary = finish(TASKS[data_settings.task], settings, workdir, trainer, state,
                         tokenizer, splits, data, report)
    summary["train_seconds"] = round(train_seconds, 1)
    checkpointer.close()
    return summary


def load_tokenizer(workdir: Path, examples, data: DataSettings, seed: int,
                   resuming: bool) -> Tokenizer:
    """The run's tokenizer: trained once on the training pairs (or lines), reused on
    resume."""
    path = workdir / TOKENIZER_FILE
    if resuming and path.exists():
        tokenizer = Tokenizer(path)
    else:
        try:
            tokenizer = train_tokenizer(examples, path, vocab_size=data.vocab_size,
                                        model_type=data.tokenizer_type, seed=seed)
        except TokenizerError as e:
            raise TrainError(f"--vocab-size {data.vocab_size}: {e}") from None
    log(f"tokenizer: {tokenizer.vocab_size} pieces -> {path}")
    return tokenizer


def make_batches(splits, tokenizer: Tokenizer, data: DataSettings,
                 seed: int) -> dict[str, PackedBatches]:
    """Every split packed into rows of one shape, which holds the longest sentences of
    every split: one batch shape for training and evaluation. A language model's
    lines are targets without a source: rows of source length 0."""
    encoded = {}
    for split, examples in splits.items():
        src_ids, tgt_ids, report = TASKS[data.task].encode(tokenizer, examples, data.max_len)
        if report.skipped:
            log(f"{split}: {report}")
        encoded[split] = src_ids, tgt_ids

    def needed(side: int):  # positions every example of every split needs on that side
        if encoded["train"][side] is None:
            return None
        return np.concatenate([positions_needed(ids[side]) for ids in encoded.values()])

    row_shape = fitting_row_shape(needed(0), needed(1), data.max_len)
    batches = {split: PackedBatches(src_ids, tgt_ids, data.max_tokens, [row_shape],
                                    batch_multiple=jax.device_count(),
                                    shuffle=split == "train", seed=seed)
               for split, (src_ids, tgt_ids) in encoded.items()}
    fill = batches["train"].fill()
    log(f"train batches: shapes (rows, source length, target length) "
        f"{', '.join(map(str, batches['train'].shapes()))}; {fill['batches']} per epoch; "
        f"{fill['real_fraction']:.1%} of token slots hold real tokens; "
        f"{fill['tgt_tokens_per_batch']:,.0f} real target tokens per batch "
        f"({fill['tgt_tokens_per_batch'] / data.max_tokens:.0%} of --max-tokens)")
    return batches


def train(trainer: Trainer, schedule, checkpointer: Checkpointer,
          data: dict[str, PackedBatches], settings: TrainSettings, data_settings: DataSettings,
          resuming: bool, run_started: float):
    """The loop: steps up to `settings.steps`, or until `settings.time_budget` seconds
    after `run_started` (time.monotonic()) have passed; metrics, evaluations,
    checkpoints. Returns the final state, saved, and the run's report (batches,
    compiling, speed, what stopped it). SIGINT/SIGTERM: the step finishes and is
    saved (jax_transformer.train.interrupts), then cli.Interrupted says so."""
    compiled_before = compiling.CompileCounter.snapshot()
    state = trainer.initial_state
    batches = data["train"].iterator()
    if resuming:
        state, data_state = checkpointer.restore_newest_intact(state, warn=log)
        set_data_position(batches, data_state, data_settings, int(state.step))
        log(f"resumed from step {int(state.step)} ({checkpointer.manager.directory})")
    start_step = int(state.step)
    # Opened before compiling, so that once "compiled in" is printed a stop is deferred
    # to the end of a step (and saved) without a gap.
    workdir = Path(settings.workdir)
    metrics_log = MetricsLog(workdir / METRICS_FILE, start_step, enabled=jax.process_index() == 0,
                             tensorboard=workdir / TENSORBOARD_DIR if settings.tensorboard
                             else None)
    programs = trainer.programs(state, data["train"].shapes(), settings.accumulate)
    with cli.signal_handlers(cli.exit_at_once(
            f"stopped while compiling, before step {int(state.step) + 1}; saved checkpoints "
            "are intact; run the same command to resume")):
        log(f"compiling {len(programs)} programs ahead of time ("
            + (f"cache {settings.compile_cache})" if settings.compile_cache else "no cache)"))
        ahead_seconds = compiling.compile_ahead(programs, log)
    real_tokens = 0
    started = time.time()
    seconds_before_training = time.monotonic() - run_started
    deadline = (run_started + settings.time_budget if settings.time_budget is not None
                else None)
    last_saved = start_step if resuming else None
    progress = tqdm(total=settings.steps, initial=start_step, desc="train", unit="step",
                    disable=settings.quiet or jax.process_index() != 0, dynamic_ncols=True)
    with interrupts.deferred_stops(deadline) as stops, progress, contextlib.closing(metrics_log):
        compiled = compiling.CompileCounter.since(compiled_before)  # said once stops are deferred
        log(f"compiled in {ahead_seconds:.1f} s: {compiled['programs']} programs compiled, "
            f"{compiled['cache_hits']} loaded from the cache")
        if start_step < settings.steps:  # at the first step these programs train
            metrics_log.write(step=start_step + 1, compile_seconds=round(ahead_seconds, 2))
        while int(state.step) < settings.steps and not stops.agreed():
            step_started = time.time()
            micro_batches = [trainer.shard_batch(next(batches))
                             for _ in range(settings.accumulate)]
            if settings.accumulate == 1:
                state, metrics = trainer.train_step(state, micro_batches[0])
            else:
                state, metrics = trainer.accumulate(state, micro_batches)
            step = int(state.step)
            loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                checkpointer.wait()
                where = (f"the last good checkpoint is step {last_saved} in "
                         f"{checkpointer.manager.directory}" if last_saved is not None
                         else "no checkpoint was written")
                raise TrainingDiverged(f"loss {loss} / gradient norm {grad_norm} at step "
                                       f"{step}: stopping; {where}")
            tokens = int(metrics["tokens"])
            real_tokens += tokens
            lr = float(schedule(step - 1))
            tokens_per_s = tokens / max(time.time() - step_started, 1e-9)
            metrics_log.write(step=step, loss=loss, lr=lr, grad_norm=grad_norm,
                              tokens=tokens, tokens_per_s=round(tokens_per_s, 1),
                              elapsed=round(time.time() - started, 3))
            progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}",
                                 tok_s=f"{tokens_per_s:,.0f}")
            progress.update(1)
            if step % settings.eval_every == 0 or step == settings.steps:
                dev = evaluation.heldout_loss(trainer, state, data["dev"])
                metrics_log.write(step=step, dev_loss=dev["loss"],
                                  dev_perplexity=dev["perplexity"])
                log(f"step {step}: train loss {loss:.4f}, dev loss {dev['loss']:.4f}, "
                    f"dev perplexity {dev['perplexity']:.3f}")
            if step % settings.checkpoint_every == 0 or step == settings.steps:
                checkpointer.save(state, batches.get_state())
                last_saved = step
        if stops.out_of_time:
            log(f"--time-budget {settings.time_budget:g} s spent: stopping after step "
                f"{int(state.step)}")
        if int(state.step) != last_saved:  # stopped by a signal or the budget between checkpoints
            checkpointer.save(state, batches.get_state())
        checkpointer.wait()
    if stops.signum is not None:
        raise cli.Interrupted(f"{signal.Signals(stops.signum).name}: saved step "
                              f"{int(state.step)} in {checkpointer.manager.directory}; run the "
                              "same command to resume", stops.signum)
    fill = data["train"].fill()
    report = {"batch_shapes": data["train"].shapes(),
              "real_token_fraction": round(fill["real_fraction"], 4),
              "tgt_tokens_per_batch": round(fill["tgt_tokens_per_batch"], 1),
              "compile_ahead_seconds": round(ahead_seconds, 2),
              "compiled": compiling.CompileCounter.since(compiled_before),
              "steps": int(state.step) - start_step,
              "tgt_tokens_per_s": round(real_tokens / max(time.time() - started, 1e-9), 1),
              "seconds_before_training": round(seconds_before_training, 3),
              "stopped_by": "time_budget" if stops.out_of_time else "steps",
              "peak_device_memory_bytes": (jax.local_devices()[0].memory_stats()
                                           or {}).get("peak_bytes_in_use")}
    log(f"trained {report['steps']} steps at {report['tgt_tokens_per_s']:,.0f} real target "
        f"tokens/s; compiling: {report['compiled']}")
    return state, report


def set_data_position(batches, data_state: dict, data_settings: DataSettings,
                      step: int) -> None:
    """Put the batch iterator where checkpoint `step` left it, or say what changed."""
    try:
        batches.set_state(data_state)
    except CorpusError as e:
        corpus = ("the built-in corpus (its flags)" if data_settings.builtin else
                  "--columns-path" if data_settings.columns_path else
                  "--text-path" if data_settings.text_path else "--src-path / --tgt-path")
        raise TrainError(f"the training data differ from those of checkpoint {step}: {e}. Was "
                         f"{corpus} changed? Restore it, or use a new --workdir") from None


def finish(task, settings: TrainSettings, workdir: Path, trainer: Trainer, state,
           tokenizer: Tokenizer, splits, data, report: dict) -> dict:
    """Export the model, evaluate on the held-out sets (the `task` module decodes the
    test set), write eval.json (with this process's training `report`) and the figures."""
    model = trainer.model(state)
    if jax.process_index() == 0:
        model.save_pretrained(workdir / "export", tokenizer=tokenizer.path)
        log(f"exported {workdir / 'export'} (config.json, model.safetensors, tokenizer.model)")

    results = {"step": int(state.step), "training": report}
    for split in ("dev", "test"):
        results[split] = evaluation.heldout_loss(trainer, state, data[split])
    started = time.time()
    decoded = task.evaluate_test(model, tokenizer, splits["test"], settings, log)
    results["decoding"], results["samples"] = decoded["decoding"], decoded["samples"]
    results["test"].update(decoded["test"])
    results["test"]["decode_seconds"] = round(time.time() - started, 1)
    if jax.process_index() != 0:
        return results

    write_text_atomically(workdir / "eval.json", json.dumps(results, indent=2) + "\n")
    plots.loss_curve(workdir / "metrics.jsonl", workdir / "loss.png")
    if results["samples"]:
        task.attention_figure(model, tokenizer, results["samples"][0], workdir / "attention.png")
    return results
