"""The race's peer: Hugging Face `MarianMTModel` at the race's size, randomly
initialised and trained by a plain torch loop for the time budget, then greedy-decoded
with `generate(num_beams=1)` (race.py's docstring has the settings).

    python benchmarks/race_peer.py --settings SETTINGS.json --variant fused+buckets \
        --workdir DIR --out ROW.json --translations TEST.txt

race.py runs it so, one process per run: the process sets glibc's malloc as train.py
sets its own (unless the settings' peer_malloc is "default") before torch starts a
thread, and torch's threads to the settings' `threads`. A variant is "plain" or
features joined by "+" (VARIANT_FEATURES).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import runner  # noqa: E402
from jax_transformer.data.tokenizing import train_tokenizer  # noqa: E402
from jax_transformer.data.corpora import holdout_split, read_parallel_text  # noqa: E402
from jax_transformer.train.runtime import host_memory  # noqa: E402
from jax_transformer.train.runtime.process_clock import process_seconds  # noqa: E402
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

LABEL_SMOOTHING = 0.1  # both sides'
TRAIN_SEED = 0  # train.py's default --seed: the order in which its tokenizer sees the pairs
IGNORED_LABEL = -100  # torch's cross_entropy ignore_index
PEER_TOKENIZER_FILE = "peer-tokenizer.model"
PLAIN = "plain"
WIDTH_MULTIPLE = 8  # the buckets variant's
VARIANT_FEATURES = {
    "fused": "fused Adam (torch's one-kernel update; on CUDA the plain loop has it too)",
    "buckets": f"batch widths padded up to multiples of {WIDTH_MULTIPLE} (few shapes)",
    "compile": "torch.compile of the training forward, its compile inside the budget",
    "init": "embeddings drawn from N(0, d_model^-0.5), as the paper's reference code",
}


def variant_features(variant: str) -> frozenset[str]:
    """The features a variant name turns on: "plain" none, else "+"-joined names."""
    if variant == PLAIN:
        return frozenset()
    features = variant.split("+")
    unknown = [f for f in features if f not in VARIANT_FEATURES]
    if unknown or len(set(features)) != len(features):
        raise ValueError(f"peer variant {variant!r}: {PLAIN!r} or '+'-joined features "
                         f"of {', '.join(VARIANT_FEATURES)}, each once")
    return frozenset(features)


def encode(tokenizer, pairs, max_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """Piece ids with eos appended; pairs with a side over `max_len` tokens are skipped."""
    src, tgt = [], []
    for s, t in pairs:
        s_ids, t_ids = tokenizer.encode(s) + [EOS_ID], tokenizer.encode(t) + [EOS_ID]
        if max(len(s_ids), len(t_ids)) <= max_len:
            src.append(s_ids)
            tgt.append(t_ids)
    return src, tgt


def padded_width(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def token_budget_batches(src, tgt, max_tokens: int, multiple: int = 1) -> list[list[int]]:
    """Pair indices sorted by length, cut into batches of at most `max_tokens` padded
    token slots per side (rows x longest sentence). With `multiple` > 1, buckets: the
    pairs sorted by their width padded up to a multiple of `multiple`, and a batch
    holding one width, so that its batches have few shapes."""
    def width_of(i):
        return padded_width(max(len(src[i]), len(tgt[i])), multiple)

    order = sorted(range(len(src)), key=lambda i: (
        width_of(i) if multiple > 1 else 0, len(tgt[i]), len(src[i])))
    batches, batch, width = [], [], 0
    for i in order:
        length = width_of(i)
        if batch and (max(width, length) * (len(batch) + 1) > max_tokens
                      or (multiple > 1 and length != width)):
            batches.append(batch)
            batch, width = [], 0
        batch.append(i)
        width = max(width, length)
    batches.append(batch)
    return batches


def peer_batch(indices, src, tgt, multiple: int = 1):
    """Marian's inputs (source ids and mask, decoder input: bos + target) and the labels
    (target), as CPU tensors, each side's width padded up to a multiple of `multiple`."""
    import torch
    rows = len(indices)
    src_len = padded_width(max(len(src[i]) for i in indices), multiple)
    tgt_len = padded_width(max(len(tgt[i]) for i in indices), multiple)
    input_ids = torch.full((rows, src_len), PAD_ID, dtype=torch.long)
    decoder_input_ids = torch.full((rows, tgt_len), PAD_ID, dtype=torch.long)
    labels = torch.full((rows, tgt_len), IGNORED_LABEL, dtype=torch.long)
    for row, i in enumerate(indices):
        input_ids[row, :len(src[i])] = torch.tensor(src[i])
        decoder_input_ids[row, :len(tgt[i])] = torch.tensor([BOS_ID] + tgt[i][:-1])
        labels[row, :len(tgt[i])] = torch.tensor(tgt[i])
    return {"input_ids": input_ids, "attention_mask": input_ids != PAD_ID,
            "decoder_input_ids": decoder_input_ids}, labels


def to_device(batch, device):
    inputs, labels = batch
    return {k: v.to(device) for k, v in inputs.items()}, labels.to(device)


def smoothed_loss_sum(logits, labels):
    """Label-smoothed cross-entropy summed over real target tokens."""
    import torch.nn.functional as F
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                           ignore_index=IGNORED_LABEL, label_smoothing=LABEL_SMOOTHING,
                           reduction="sum")


def real_tokens(labels) -> int:
    return int((labels != IGNORED_LABEL).sum())


def peer_dev_loss(model, batches, autocast) -> float:
    import torch
    model.eval()
    loss_sum, tokens = 0.0, 0
    with torch.no_grad(), autocast():
        for inputs, labels in batches:
            loss = smoothed_loss_sum(model(**inputs).logits, labels)
            loss_sum, tokens = loss_sum + float(loss), tokens + real_tokens(labels)
    model.train()
    return loss_sum / tokens


def peer_translate(model, tokenizer, sources, args, device, autocast) -> list[str]:
    """Greedy translations with `generate(num_beams=1)`, sources sorted by length."""
    import torch
    ids = []
    for s in sources:
        s_ids = tokenizer.encode(s) + [EOS_ID]
        ids.append(s_ids if len(s_ids) <= args.max_len else s_ids[:args.max_len - 1] + [EOS_ID])
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    translations = [""] * len(ids)
    model.eval()
    for start in range(0, len(order), args.decode_batch_size):
        batch = order[start:start + args.decode_batch_size]
        width = max(len(ids[i]) for i in batch)
        input_ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
        for row, i in enumerate(batch):
            input_ids[row, :len(ids[i])] = torch.tensor(ids[i])
        with torch.no_grad(), autocast():
            out = model.generate(input_ids=input_ids.to(device),
                                 attention_mask=(input_ids != PAD_ID).to(device), num_beams=1,
                                 do_sample=False,
                                 max_new_tokens=min(args.max_len, 2 * width + 10))
        for row, i in enumerate(batch):
            translations[i] = tokenizer.decode(out[row].tolist())  # drops bos, stops at eos
    return translations


def marian(args, vocab_size: int, paper_init: bool = False):
    """A randomly initialised MarianMTModel of the race's size: post-LN, ReLU, sinusoidal
    positions, embeddings scaled by sqrt(d_model), shared and tied; with `paper_init`
    the shared embedding drawn from N(0, d_model^-0.5) (padding's row kept zero)
    instead of Marian's N(0, 0.02)."""
    import torch
    from transformers import MarianConfig, MarianMTModel
    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size,
        d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="relu",
        dropout=args.dropout, attention_dropout=args.dropout, activation_dropout=args.dropout,
        max_position_embeddings=args.max_len + 1, scale_embedding=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True))
    if paper_init:
        with torch.no_grad():
            embedding = model.get_input_embeddings().weight
            embedding.normal_(0.0, args.d_model ** -0.5)
            embedding[PAD_ID].zero_()
    return model


def paper_adam(model, args, fused: bool):
    """Adam(0.9, 0.98, 1e-9) with the paper's learning-rate schedule."""
    import torch
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # step counts from 1
        optimizer, lambda done: args.d_model ** -0.5 * min((done + 1) ** -0.5,
                                                           (done + 1) * args.warmup ** -1.5))
    return optimizer, scheduler


def compile_seconds() -> float:
    """torch.compile's seconds so far in this process: dynamo's tracing and compiling
    of the forward, and the backward's compile (done lazily, at the first backward)."""
    from torch._dynamo.utils import compile_times
    names, seconds = compile_times(repr="csv", aggregate=True)
    times = dict(zip(names, map(float, seconds)))
    return times.get("_compile.compile_inner", 0.0) + times.get("backward._backward_impl", 0.0)


def train_until(deadline: float, started: float, model, batches, dev_batches, args, device,
                autocast, features: frozenset[str]) -> dict:
    """Epochs over `batches` in shuffled order until the step in which `deadline`
    (time.monotonic) passes; every --eval-every steps the dev loss and the training
    loss: the mean of the steps' losses (label-smoothed, per real target token, as
    minimised) since the previous evaluation."""
    import torch
    optimizer, scheduler = paper_adam(model, args,
                                      fused=device.type == "cuda" or "fused" in features)
    forward = torch.compile(model) if "compile" in features else model  # training only
    rng = np.random.default_rng(0)
    step, trained_tokens, first_step_seconds, dev_curve = 0, 0, None, []
    step_rates, step_losses = [], []  # of each step: real target tokens/s, its loss
    loop_started = time.monotonic()
    while time.monotonic() < deadline:
        for index in rng.permutation(len(batches)):  # an epoch in shuffled batch order
            step_started = time.monotonic()
            tokens = real_tokens(batches[index][1])  # counted on the CPU: no sync
            inputs, labels = to_device(batches[index], device)
            with autocast():
                loss_sum = smoothed_loss_sum(forward(**inputs).logits, labels)
            (loss_sum / tokens).backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            # the loss, read: waits for the step, as train.py does to log its loss
            step_losses.append(loss_sum.item() / tokens)
            step, trained_tokens = step + 1, trained_tokens + tokens
            step_rates.append(tokens / (time.monotonic() - step_started))
            first_step_seconds = first_step_seconds or process_seconds()
            if step % args.eval_every == 0:
                dev_curve.append({"step": step,
                                  "seconds": round(time.monotonic() - started, 2),
                                  "dev_loss": peer_dev_loss(model, dev_batches, autocast),
                                  "train_loss": statistics.fmean(
                                      step_losses[-args.eval_every:])})
            if time.monotonic() >= deadline:
                break
    ended = time.monotonic()
    return {"steps": step, "trained_tokens": trained_tokens,
            "steady_tgt_tokens_per_s": round(statistics.median(step_rates[len(step_rates) // 2:]),
                                             1) if step_rates else None,
            "first_step_seconds": first_step_seconds, "dev_curve": dev_curve,
            "loop_seconds": ended - loop_started, "ended": ended}


def run_peer(args, variant: str, workdir: Path, translations: Path) -> dict:
    """Hugging Face MarianMTModel trained by a plain torch loop, with `variant`'s
    features, for --time-budget seconds; its greedy test translations written to
    `translations`, one a line. race.py scores them and measures the process's memory
    on a CPU."""
    import torch

    started = time.monotonic()  # the budget counts from here, as train.py's from its run()
    features = variant_features(variant)
    multiple = WIDTH_MULTIPLE if "buckets" in features else 1
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    autocast = ((lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if cuda
                else contextlib.nullcontext)
    train_pairs, _ = read_parallel_text(args.src_path, args.tgt_path)
    dev_pairs, _ = read_parallel_text(args.dev_src_path, args.dev_tgt_path)
    test_pairs, _ = read_parallel_text(args.test_src_path, args.test_tgt_path)
    # train.py's tokenizer: trained on the pairs in the order its split leaves them
    tokenizer = train_tokenizer(holdout_split(train_pairs, 0, 0, seed=TRAIN_SEED)["train"],
                                workdir / PEER_TOKENIZER_FILE, vocab_size=args.vocab_size,
                                model_type="bpe", seed=TRAIN_SEED)
    train_src, train_tgt = encode(tokenizer, train_pairs, args.max_len)
    dev_src, dev_tgt = encode(tokenizer, dev_pairs, args.max_len)
    train_batches = [peer_batch(b, train_src, train_tgt, multiple) for b in
                     token_budget_batches(train_src, train_tgt, args.max_tokens, multiple)]
    dev_batches = [to_device(peer_batch(b, dev_src, dev_tgt, multiple), device) for b in
                   token_budget_batches(dev_src, dev_tgt, args.max_tokens, multiple)]
    model = marian(args, tokenizer.vocab_size, paper_init="init" in features).to(device).train()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    trained = train_until(started + args.time_budget, started, model, train_batches,
                          dev_batches, args, device, autocast, features)
    dev_loss = peer_dev_loss(model, dev_batches, autocast)
    hypotheses = peer_translate(model, tokenizer, [s for s, _ in test_pairs], args, device,
                                autocast)
    translations.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses))
    steps, first_step_seconds = trained["steps"], trained["first_step_seconds"]
    compiled = "compile" in features
    what = "Hugging Face MarianMTModel, plain torch loop"
    return {"side": "peer", "variant": variant,
            "what": what if variant == PLAIN else f"{what} ({variant})",
            "steps": steps, "stopped_by": "time_budget",
            "tgt_tokens_per_s": round(trained["trained_tokens"]
                                      / max(trained["loop_seconds"], 1e-9), 1),
            "tgt_tokens_per_step": round(trained["trained_tokens"] / max(steps, 1), 1),
            "first_step_seconds": (round(first_step_seconds, 2) if first_step_seconds
                                   else None),
            "training_seconds": round(trained["ended"] - started, 2),
            "compile_seconds": round(compile_seconds(), 2) if compiled else 0.0,
            "programs_compiled": (torch._dynamo.utils.counters["stats"]["unique_graphs"]
                                  if compiled else 0),
            "compile_cache_hits": 0,
            "steady_tgt_tokens_per_s": trained["steady_tgt_tokens_per_s"],
            "dev_loss": dev_loss, "dev_curve": trained["dev_curve"],
            "peak_device_memory_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_pairs": len(train_src), "train_batches": len(train_batches),
            "batch_shapes": len({tuple(b[0]["input_ids"].shape) + tuple(b[1].shape)
                                 for b in train_batches}),
            "environment": {"threads": torch.get_num_threads(),
                            "interop_threads": torch.get_num_interop_threads(),
                            "devices": f"1 {device.type}",  # as ours: "<count> <platform>"
                            "versions": runner.versions("torch", "transformers")}}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--settings", type=Path, required=True,
                   help="race.py's settings as JSON (its flags' values)")
    p.add_argument("--variant", default=PLAIN)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="the run's row, as JSON")
    p.add_argument("--translations", type=Path, required=True)
    options = p.parse_args(argv)
    args = argparse.Namespace(**json.loads(options.settings.read_text()))
    variant_features(options.variant)  # a bad name fails before any work
    kept = args.peer_malloc == "equal" and host_memory.keep_freed_memory()  # before torch's threads
    import torch
    torch.set_num_threads(args.threads)
    row = run_peer(args, options.variant, options.workdir, options.translations)
    row["environment"]["allocator"] = allocator_name(kept)
    options.out.write_text(json.dumps(row, indent=2) + "\n")


def allocator_name(kept: bool) -> str:
    """How a side's process had glibc's malloc set (train/runtime/host_memory.py)."""
    return ("glibc malloc keeping freed memory (host_memory.py: arena_max 1, mmap_max 0, "
            "trim_threshold 2 GiB)" if kept else "malloc as it comes")


if __name__ == "__main__":
    main()
