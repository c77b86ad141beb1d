"""The training run behind train.py: data, model, loop, checkpoints, evaluation, export.

Resuming: a work directory that holds checkpoints is resumed from the latest
one with the same settings, tokenizer, data order and dropout stream, so the
losses continue exactly as in an uninterrupted run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm import tqdm

from jax_transformer import corpora, evaluation, interchange, plots, translate
from jax_transformer.batching import BucketedBatches, encode_pairs, train_tokenizer
from jax_transformer.checkpointing import Checkpointer
from jax_transformer.config import TransformerConfig
from jax_transformer.model import Transformer
from jax_transformer.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from jax_transformer.training import Trainer, make_optimizer, paper_schedule

# Flags that only steer how long / how visibly the run goes; anything else must
# match when a work directory is resumed.
RESUMABLE_CHANGES = {"workdir", "steps", "eval_every", "checkpoint_every", "keep", "beam",
                     "decode_batch_size", "samples", "distributed", "quiet"}


class TrainingDiverged(RuntimeError):
    pass


def log(message: str) -> None:
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stderr)


def check_run_settings(workdir: Path, args: argparse.Namespace, resuming: bool) -> None:
    """Record the settings of a new run; refuse to resume one with other settings."""
    path = workdir / "run_args.json"
    settings = {k: v for k, v in vars(args).items() if k not in RESUMABLE_CHANGES}
    if resuming and path.exists():
        saved = json.loads(path.read_text())
        changed = sorted(k for k in settings if saved.get(k) != settings[k])
        if changed:
            detail = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)!r} -> {settings[k]!r}"
                               for k in changed)
            raise SystemExit(f"error: {workdir} holds a run with other settings ({detail}); "
                             "resume with the same flags or use a new --workdir")
    elif jax.process_index() == 0:
        path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def load_corpus(args) -> dict[str, list[tuple[str, str]]]:
    if not (args.src_path or args.tgt_path or args.columns_path):
        splits = corpora.number_corpus(args.src_lang, args.tgt_lang, num_train=args.num_train,
                                       num_dev=args.num_dev, num_test=args.num_test,
                                       max_number=args.max_number, seed=args.seed)
        log(f"corpus: {args.src_lang}->{args.tgt_lang} number words, "
            + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
        return splits
    if args.columns_path:
        pairs, report = corpora.read_columns(args.columns_path, args.src_column, args.tgt_column)
    else:
        pairs, report = corpora.read_parallel_text(*paired_paths(args, "src_path", "tgt_path"))
    log(f"corpus: {report}")
    given = {}
    for split in ("dev", "test"):
        paths = paired_paths(args, f"{split}_src_path", f"{split}_tgt_path")
        if paths:
            given[split], report = corpora.read_parallel_text(*paths)
            log(f"{split}: {report}")
    held_out = corpora.holdout_split(pairs, 0 if "dev" in given else args.num_dev,
                                     0 if "test" in given else args.num_test, seed=args.seed)
    return {**held_out, **given}


def paired_paths(args, src_flag: str, tgt_flag: str) -> tuple[str, str] | None:
    src, tgt = getattr(args, src_flag), getattr(args, tgt_flag)
    if bool(src) != bool(tgt):
        raise SystemExit(f"error: --{src_flag.replace('_', '-')} and "
                         f"--{tgt_flag.replace('_', '-')} go together")
    return (src, tgt) if src else None


def model_config(args, vocab_size: int) -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
        num_heads=args.heads, d_ff=args.d_ff, num_encoder_layers=args.layers,
        num_decoder_layers=args.layers, dropout=args.dropout, max_len=args.max_len,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, pre_norm=args.pre_norm,
        final_norm=args.pre_norm)


class MetricsLog:
    """metrics.jsonl: one JSON object per line. On resume, lines past the restored
    step are dropped, so the file reads as if the run had never stopped."""

    def __init__(self, path: Path, resume_step: int):
        self.path = path
        self.enabled = jax.process_index() == 0
        if self.enabled:
            kept = []
            if resume_step and path.exists():
                kept = [line for line in path.read_text().splitlines()
                        if json.loads(line)["step"] <= resume_step]
            path.write_text("".join(line + "\n" for line in kept))
            self.file = path.open("a", buffering=1)

    def write(self, **record) -> None:
        if self.enabled:
            self.file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self.enabled:
            self.file.close()


def run(args: argparse.Namespace) -> dict:
    if args.distributed:
        jax.distributed.initialize()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    checkpointer = Checkpointer(workdir, keep=args.keep)
    resuming = checkpointer.latest_step() is not None
    check_run_settings(workdir, args, resuming)

    # Data: corpus, tokenizer (trained once, reused on resume), length buckets.
    splits = load_corpus(args)
    tokenizer_path = workdir / interchange.TOKENIZER_FILE
    if resuming and tokenizer_path.exists():
        tokenizer = Tokenizer(tokenizer_path)
    else:
        tokenizer = train_tokenizer(splits["train"], tokenizer_path, vocab_size=args.vocab_size,
                                    model_type=args.tokenizer_type, seed=args.seed)
    log(f"tokenizer: {tokenizer.vocab_size} pieces -> {tokenizer_path}")
    data = {}
    for split, pairs in splits.items():
        src_ids, tgt_ids, report = encode_pairs(tokenizer, pairs, max_len=args.max_len)
        if report.skipped:
            log(f"{split}: {report}")
        data[split] = BucketedBatches(src_ids, tgt_ids, args.max_tokens,
                                      batch_multiple=jax.device_count(),
                                      shuffle=split == "train", seed=args.seed)
    log("train batch shapes (rows, source length, target length): " + ", ".join(map(str, data["train"].shapes())))

    # Model and optimizer.
    config_path = workdir / interchange.CONFIG_FILE
    if resuming and config_path.exists():
        config = TransformerConfig.from_json(config_path)
    else:
        config = model_config(args, tokenizer.vocab_size)
        if jax.process_index() == 0:
            config.to_json(config_path)
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[args.dtype]
    model = Transformer(config, rngs=nnx.Rngs(args.seed), dtype=dtype, param_dtype=jnp.float32)
    schedule = paper_schedule(config.d_model, args.warmup, args.lr_scale)
    trainer = Trainer(model, make_optimizer(schedule, args.clip_norm), args.label_smoothing)
    num_params = sum(p.size for p in jax.tree.leaves(trainer.initial_state.params))
    log(f"model: {num_params / 1e6:.2f}M parameters, d_model {config.d_model}, "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, {args.dtype} compute, "
        f"{jax.device_count()} {jax.devices()[0].platform} device(s)")

    state = trainer.initial_state
    batches = data["train"].iterator()
    if resuming:
        state, data_state = checkpointer.restore(state)
        batches.set_state(data_state)
        log(f"resumed from step {int(state.step)} ({checkpointer.manager.directory})")
    start_step = int(state.step)
    metrics_log = MetricsLog(workdir / "metrics.jsonl", start_step)

    # The loop.
    started = time.time()
    last_saved = start_step if resuming else None
    progress = tqdm(total=args.steps, initial=start_step, desc="train", unit="step",
                    disable=args.quiet or jax.process_index() != 0, dynamic_ncols=True)
    try:
        while int(state.step) < args.steps:
            step_started = time.time()
            micro_batches = [trainer.shard_batch(next(batches)) for _ in range(args.accumulate)]
            if args.accumulate == 1:
                state, metrics = trainer.train_step(state, micro_batches[0])
            else:
                state, metrics = trainer.accumulate(state, micro_batches)
            step = int(state.step)
            loss, grad_norm = float(metrics["loss"]), float(metrics["grad_norm"])
            if not (math.isfinite(loss) and math.isfinite(grad_norm)):
                where = (f"the last good checkpoint is step {last_saved} in "
                         f"{checkpointer.manager.directory}" if last_saved is not None
                         else "no checkpoint was written")
                raise TrainingDiverged(f"loss {loss} / gradient norm {grad_norm} at step {step}: "
                                       f"stopping; {where}")
            tokens = int(metrics["tokens"])
            lr = float(schedule(step - 1))
            tokens_per_s = tokens / max(time.time() - step_started, 1e-9)
            metrics_log.write(step=step, loss=loss, lr=lr, grad_norm=grad_norm, tokens=tokens,
                              tokens_per_s=round(tokens_per_s, 1),
                              elapsed=round(time.time() - started, 3))
            progress.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
            progress.update(1)
            if step % args.eval_every == 0 or step == args.steps:
                dev = evaluation.heldout_loss(trainer, state, data["dev"])
                metrics_log.write(step=step, dev_loss=dev["loss"], dev_perplexity=dev["perplexity"])
                log(f"step {step}: train loss {loss:.4f}, dev loss {dev['loss']:.4f}, "
                    f"dev perplexity {dev['perplexity']:.3f}")
            if step % args.checkpoint_every == 0 or step == args.steps:
                checkpointer.save(state, batches.get_state())
                last_saved = step
    except KeyboardInterrupt:
        progress.close()
        if int(state.step) != last_saved:
            checkpointer.save(state, batches.get_state())
        checkpointer.wait()
        log(f"interrupted: saved step {int(state.step)}; run the same command to resume")
        raise SystemExit(130)
    except TrainingDiverged as e:
        progress.close()
        checkpointer.wait()
        raise SystemExit(f"error: {e}")
    progress.close()
    checkpointer.wait()
    metrics_log.close()
    train_seconds = time.time() - started

    summary = finish(args, workdir, trainer, state, tokenizer, splits, data)
    summary["train_seconds"] = round(train_seconds, 1)
    checkpointer.close()
    return summary


def finish(args, workdir: Path, trainer: Trainer, state, tokenizer: Tokenizer, splits,
           data) -> dict:
    """Export the model, evaluate on the held-out sets, write eval.json and the figures."""
    model = trainer.model(state)
    config = model.config
    if jax.process_index() == 0:
        model.save_pretrained(workdir / "export", tokenizer=tokenizer.path)
        log(f"exported {workdir / 'export'} (config.json, model.safetensors, tokenizer.model)")

    results = {"step": int(state.step), "decoding": f"beam {args.beam}" if args.beam > 1
               else "greedy"}
    for split in ("dev", "test"):
        results[split] = evaluation.heldout_loss(trainer, state, data[split])
    sources = [s for s, _ in splits["test"]]
    references = [t for _, t in splits["test"]]
    started = time.time()
    hypotheses = translate.translate_lines(sources, model, tokenizer, beam=args.beam,
                                           batch_size=args.decode_batch_size)
    results["test"].update(evaluation.translation_metrics(hypotheses, references))
    results["test"]["decode_seconds"] = round(time.time() - started, 1)
    results["samples"] = [{"source": s, "reference": r, "translation": h}
                          for s, r, h in zip(sources[: args.samples], references, hypotheses)]
    if jax.process_index() != 0:
        return results

    (workdir / "eval.json").write_text(json.dumps(results, indent=2) + "\n")
    plots.loss_curve(workdir / "metrics.jsonl", workdir / "loss.png")
    source, translation = sources[0], hypotheses[0]
    src_ids = np.array([tokenizer.encode(source) + [config.eos_id]], np.int32)
    tgt_ids = np.array([[config.bos_id] + tokenizer.encode(translation)], np.int32)
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
