"""The training run behind train.py: data, model, loop, checkpoints, evaluation, export.

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

from jax_transformer import cli, translate
from jax_transformer.cli import RunFailed
from jax_transformer.data import corpora
from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.batching import (PackedBatches, encode_pairs, fitting_row_shape,
                                           positions_needed,
                                           train_tokenizer)
from jax_transformer.model import Transformer
from jax_transformer.train import compiling, evaluation, interrupts, plots
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


class TrainingDiverged(RunFailed):
    """The loss or the gradient norm became non-finite."""


def log(message: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stderr)


def load_corpus(data: DataSettings, seed: int) -> dict[str, list[tuple[str, str]]]:
    if data.builtin:
        splits = corpora.number_corpus(data.src_lang, data.tgt_lang, num_train=data.num_train,
                                       num_dev=data.num_dev, num_test=data.num_test,
                                       max_number=data.max_number, seed=seed)
        log(f"corpus: {data.src_lang}->{data.tgt_lang} number words, "
            + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
        return splits
    if data.columns_path:
        pairs, report = corpora.read_columns(data.columns_path, data.src_column, data.tgt_column)
    else:
        pairs, report = corpora.read_parallel_text(data.src_path, data.tgt_path)
    log(f"corpus: {report}")
    given = {}
    for split in ("dev", "test"):
        src, tgt = getattr(data, f"{split}_src_path"), getattr(data, f"{split}_tgt_path")
        if src:
            given[split], report = corpora.read_parallel_text(src, tgt)
            log(f"{split}: {report}")
    held_out = corpora.holdout_split(pairs, 0 if "dev" in given else data.num_dev,
                                     0 if "test" in given else data.num_test, seed=seed)
    return {**held_out, **given}


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
        config = model_settings.config(tokenizer.vocab_size, data_settings.max_len)
        if primary:
            write_atomically(config_path, config.to_json)
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[settings.dtype]
    model = Transformer(config, rngs=nnx.Rngs(settings.seed), dtype=dtype,
                        param_dtype=jnp.float32)
    schedule = paper_schedule(config.d_model, settings.warmup, settings.lr_scale)
    trainer = Trainer(model, make_optimizer(schedule, settings.clip_norm),
                      settings.label_smoothing)
    num_params = sum(p.size for p in jax.tree.leaves(trainer.initial_state.params))
    log(f"model: {num_params / 1e6:.2f}M parameters, d_model {config.d_model}, "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, {settings.dtype} "
        f"compute, {jax.device_count()} {jax.devices()[0].platform} device(s)")

    started = time.time()
    state, report = train(trainer, schedule, checkpointer, data, settings, data_settings,
                          resuming, run_started)
    train_seconds = time.time() - started
    with cli.signal_handlers(cli.exit_at_once(
            f"stopped during the final export and evaluation; training is saved at step "
            f"{int(state.step)}; run the same command to finish them")):
        summary = finish(settings, workdir, trainer, state, tokenizer, splits, data, report)
    summary["train_seconds"] = round(train_seconds, 1)
    checkpointer.close()
    return summary


def load_tokenizer(workdir: Path, pairs, data: DataSettings, seed: int,
                   resuming: bool) -> Tokenizer:
    """The run's tokenizer: trained once on the training pairs, reused on resume."""
    path = workdir / TOKENIZER_FILE
    if resuming and path.exists():
        tokenizer = Tokenizer(path)
    else:
        try:
            tokenizer = train_tokenizer(pairs, path, vocab_size=data.vocab_size,
                                        model_type=data.tokenizer_type, seed=seed)
        except TokenizerError as e:
            raise TrainError(f"--vocab-size {data.vocab_size}: {e}") from None
    log(f"tokenizer: {tokenizer.vocab_size} pieces -> {path}")
    return tokenizer


def make_batches(splits, tokenizer: Tokenizer, data: DataSettings,
                 seed: int) -> dict[str, PackedBatches]:
    """Every split packed into rows of one shape, which holds the longest sentences of
    every split: one batch shape for training and evaluation."""
    encoded = {}
    for split, pairs in splits.items():
        src_ids, tgt_ids, report = encode_pairs(tokenizer, pairs, max_len=data.max_len)
        if report.skipped:
            log(f"{split}: {report}")
        encoded[split] = src_ids, tgt_ids
    row_shape = fitting_row_shape(*(np.concatenate([positions_needed(sides[i])
                                                    for sides in encoded.values()])
                                    for i in (0, 1)), data.max_len)
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
                  "--columns-path" if data_settings.columns_path else "--src-path / --tgt-path")
        raise TrainError(f"the training data differ from those of checkpoint {step}: {e}. Was "
                         f"{corpus} changed? Restore it, or use a new --workdir") from None


def finish(settings: TrainSettings, workdir: Path, trainer: Trainer, state,
           tokenizer: Tokenizer, splits, data, report: dict) -> dict:
    """Export the model, evaluate on the held-out sets, write eval.json (with this
    process's training `report`) and the figures."""
    model = trainer.model(state)
    config = model.config
    if jax.process_index() == 0:
        model.save_pretrained(workdir / "export", tokenizer=tokenizer.path)
        log(f"exported {workdir / 'export'} (config.json, model.safetensors, tokenizer.model)")

    results = {"step": int(state.step), "decoding": f"beam {settings.beam}" if settings.beam > 1
               else "greedy", "training": report}
    for split in ("dev", "test"):
        results[split] = evaluation.heldout_loss(trainer, state, data[split])
    sources = [s for s, _ in splits["test"]]
    references = [t for _, t in splits["test"]]
    started = time.time()
    hypotheses = translate.translate_lines(sources, model, tokenizer, beam=settings.beam,
                                           batch_size=settings.decode_batch_size)
    results["test"].update(evaluation.translation_metrics(hypotheses, references))
    results["test"]["decode_seconds"] = round(time.time() - started, 1)
    results["samples"] = [{"source": s, "reference": r, "translation": h}
                          for s, r, h in zip(sources[: settings.samples], references,
                                             hypotheses)]
    if jax.process_index() != 0:
        return results

    write_text_atomically(workdir / "eval.json", json.dumps(results, indent=2) + "\n")
    plots.loss_curve(workdir / "metrics.jsonl", workdir / "loss.png")
    source, translation = sources[0], hypotheses[0]  # either may exceed max_len tokens
    src_ids = np.array([(tokenizer.encode(source) + [config.eos_id])[:config.max_len]], np.int32)
    tgt_ids = np.array([([config.bos_id] + tokenizer.encode(translation))[:config.max_len]],
                       np.int32)
    _, attention = model(jnp.asarray(src_ids), jnp.asarray(tgt_ids), return_attention=True)
    piece = tokenizer.sp.IdToPiece
    plots.attention_heatmap(np.asarray(attention["cross"][-1][0], np.float32),
                            [piece(int(i)) for i in src_ids[0]],
                            [piece(int(i)) for i in tgt_ids[0]], workdir / "attention.png",
                            f"last decoder layer's cross-attention: {source!r}")
    for sample in results["samples"]:
        mark = "ok " if sample["translation"] == sample["reference"] else "   "
        log(f"  {mark}{sample['source']!r} -> {sample['translation']!r}"
            f" (reference {sample['reference']!r})")
    return results
