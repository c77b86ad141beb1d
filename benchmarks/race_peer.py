"""The race's peer: Hugging Face `MarianMTModel` at the race's size, randomly
initialised and trained by a plain torch loop for the time budget, then greedy-decoded
with `generate(num_beams=1)` (race.py's docstring has the settings)."""

from __future__ import annotations

import contextlib
import resource
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks.runner import peak_rss_bytes
from jax_transformer.data.encoding import train_tokenizer
from jax_transformer.data.corpora import holdout_split, read_parallel_text
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID

LABEL_SMOOTHING = 0.1  # both sides'
TRAIN_SEED = 0  # train.py's default --seed: the order in which its tokenizer sees the pairs
IGNORED_LABEL = -100  # torch's cross_entropy ignore_index
PEER_TOKENIZER_FILE = "peer-tokenizer.model"


def encode(tokenizer, pairs, max_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """Piece ids with eos appended; pairs with a side over `max_len` tokens are skipped."""
    src, tgt = [], []
    for s, t in pairs:
        s_ids, t_ids = tokenizer.encode(s) + [EOS_ID], tokenizer.encode(t) + [EOS_ID]
        if max(len(s_ids), len(t_ids)) <= max_len:
            src.append(s_ids)
            tgt.append(t_ids)
    return src, tgt


def token_budget_batches(src, tgt, max_tokens: int) -> list[list[int]]:
    """Pair indices sorted by length, cut into batches of at most `max_tokens` padded
    token slots per side (rows x longest sentence)."""
    order = sorted(range(len(src)), key=lambda i: (len(tgt[i]), len(src[i])))
    batches, batch, width = [], [], 0
    for i in order:
        length = max(len(src[i]), len(tgt[i]))
        if batch and max(width, length) * (len(batch) + 1) > max_tokens:
            batches.append(batch)
            batch, width = [], 0
        batch.append(i)
        width = max(width, length)
    batches.append(batch)
    return batches


def peer_batch(indices, src, tgt):
    """Marian's inputs (source ids and mask, decoder input: bos + target) and the labels
    (target), as CPU tensors."""
    import torch
    rows, src_len, tgt_len = len(indices), max(len(src[i]) for i in indices), max(
        len(tgt[i]) for i in indices)
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


def marian(args, vocab_size: int):
    """A randomly initialised MarianMTModel of the race's size: post-LN, ReLU, sinusoidal
    positions, embeddings scaled by sqrt(d_model), shared and tied."""
    import torch
    from transformers import MarianConfig, MarianMTModel
    torch.manual_seed(0)
    return MarianMTModel(MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size,
        d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="relu",
        dropout=args.dropout, attention_dropout=args.dropout, activation_dropout=args.dropout,
        max_position_embeddings=args.max_len + 1, scale_embedding=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True))


def paper_adam(model, args, fused: bool):
    """Adam(0.9, 0.98, 1e-9) with the paper's learning-rate schedule."""
    import torch
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # step counts from 1
        optimizer, lambda done: args.d_model ** -0.5 * min((done + 1) ** -0.5,
                                                           (done + 1) * args.warmup ** -1.5))
    return optimizer, scheduler


def train_until(deadline: float, started: float, model, batches, dev_batches, args, device,
                autocast) -> dict:
    """Epochs over `batches` in shuffled order until the step in which `deadline`
    (time.monotonic) passes; the dev loss every --eval-every steps."""
    optimizer, scheduler = paper_adam(model, args, fused=device.type == "cuda")
    rng = np.random.default_rng(0)
    step, trained_tokens, first_step_seconds, dev_curve = 0, 0, None, []
    step_rates = []  # real target tokens/s of each step
    loop_started = time.monotonic()
    while time.monotonic() < deadline:
        for index in rng.permutation(len(batches)):  # an epoch in shuffled batch order
            step_started = time.monotonic()
            tokens = real_tokens(batches[index][1])  # counted on the CPU: no sync
            inputs, labels = to_device(batches[index], device)
            with autocast():
                loss_sum = smoothed_loss_sum(model(**inputs).logits, labels)
            (loss_sum / tokens).backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum.item()  # waits for the step, as train.py does to log its loss
            step, trained_tokens = step + 1, trained_tokens + tokens
            step_rates.append(tokens / (time.monotonic() - step_started))
            first_step_seconds = first_step_seconds or time.monotonic() - started
            if step % args.eval_every == 0:
                dev_curve.append({"step": step,
                                  "seconds": round(time.monotonic() - started, 2),
                                  "dev_loss": peer_dev_loss(model, dev_batches, autocast)})
            if time.monotonic() >= deadline:
                break
    ended = time.monotonic()
    return {"steps": step, "trained_tokens": trained_tokens,
            "steady_tgt_tokens_per_s": round(statistics.median(step_rates[len(step_rates) // 2:]),
                                             1) if step_rates else None,
            "first_step_seconds": first_step_seconds, "dev_curve": dev_curve,
            "loop_seconds": ended - loop_started, "ended": ended}


def run_peer(args, workdir: Path) -> dict:
    """Hugging Face MarianMTModel trained by a plain torch loop for --time-budget seconds."""
    import sacrebleu
    import torch

    started = time.monotonic()  # the budget counts from here, as train.py's from its run()
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
    train_batches = [peer_batch(b, train_src, train_tgt)
                     for b in token_budget_batches(train_src, train_tgt, args.max_tokens)]
    dev_batches = [to_device(peer_batch(b, dev_src, dev_tgt), device)
                   for b in token_budget_batches(dev_src, dev_tgt, args.max_tokens)]
    model = marian(args, tokenizer.vocab_size).to(device).train()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    trained = train_until(started + args.time_budget, started, model, train_batches,
                          dev_batches, args, device, autocast)
    peak_device = torch.cuda.max_memory_allocated(device) if cuda else None
    dev_loss = peer_dev_loss(model, dev_batches, autocast)
    hypotheses = peer_translate(model, tokenizer, [s for s, _ in test_pairs], args, device,
                                autocast)
    references = [[t for _, t in test_pairs]]
    steps, first_step_seconds = trained["steps"], trained["first_step_seconds"]
    return {"side": "peer", "what": "Hugging Face MarianMTModel, plain torch loop",
            "steps": steps, "stopped_by": "time_budget",
            "tgt_tokens_per_s": round(trained["trained_tokens"]
                                      / max(trained["loop_seconds"], 1e-9), 1),
            "tgt_tokens_per_step": round(trained["trained_tokens"] / max(steps, 1), 1),
            "first_step_seconds": (round(first_step_seconds, 2) if first_step_seconds
                                   else None),
            "training_seconds": round(trained["ended"] - started, 2),
            "compile_seconds": 0.0, "programs_compiled": 0, "compile_cache_hits": 0,
            "steady_tgt_tokens_per_s": trained["steady_tgt_tokens_per_s"],
            "bleu": sacrebleu.corpus_bleu(hypotheses, references).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, references).score,
            "dev_loss": dev_loss, "dev_curve": trained["dev_curve"],
            "peak_memory_bytes": (peak_device if cuda
                                  else peak_rss_bytes(resource.RUSAGE_SELF)),
            "wall_seconds": round(time.monotonic() - started, 1),
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_pairs": len(train_src), "train_batches": len(train_batches)}
