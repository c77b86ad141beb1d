"""The race: train.py against Hugging Face Marian, same corpus, same device, same wall time.

    python benchmarks/race.py --src-path train.en --tgt-path train.de \\
        --dev-src-path dev.en --dev-tgt-path dev.de --test-src-path test.en \\
        --test-tgt-path test.de --time-budget 600           # base model; bf16 on a GPU
    python benchmarks/race.py ... --time-budget 30 --d-model 32 --heads 2 --d-ff 64 \\
        --layers 1 --vocab-size 500 --max-tokens 2048 --max-len 64   # a CPU smoke run

"Which gives the better translator in ten minutes on my GPU?" Each side gets
--time-budget seconds of wall time, counted from its start (reading the corpus,
training the tokenizer, building the model and compiling included); it stops
after the step in which the budget runs out, then greedy-decodes the test set,
scored with sacreBLEU and chrF. The two sides run one after the other:

- ours: train.py in a subprocess (--time-budget; base model; bf16 on CUDA,
  float32 on CPU; packed batches of --max-tokens token slots per side; the
  paper's Adam and schedule with --warmup, label smoothing 0.1, dropout 0.1;
  the dev loss every --eval-every steps; one checkpoint, at the end; JAX's
  persistent compilation cache fresh, so cold, unless --compile-cache names one);
- the peer a user would pick instead: Hugging Face `MarianMTModel`, randomly
  initialised at the same size (post-LN, ReLU, sinusoidal positions, embeddings
  scaled by sqrt(d_model), shared and tied), trained here by a plain torch loop:
  length-sorted batches of at most --max-tokens padded token slots per side in
  shuffled order, Adam(0.9, 0.98, 1e-9) (fused on CUDA) with the paper's
  schedule, label smoothing 0.1, bf16 autocast on CUDA (float32 on CPU), no
  torch.compile; decoded with `generate(num_beams=1)`.

Both train the same SentencePiece BPE vocabulary (train.py's own
`train_tokenizer`, same pairs and seed, so the same pieces), skip pairs longer
than --max-len tokens, and measure the dev loss (label-smoothed, per real target
token) every --eval-every steps, inside their budgets.

Reported per side: steps, real target tokens/s over the training loop, seconds
from the start to the end of the first step, compile seconds, test BLEU and
chrF, final dev loss, and peak memory: on CUDA the allocator's peak bytes in
use during training (JAX's peak_bytes_in_use, torch's max_memory_allocated), on
CPU the side's process peak RSS over its whole run. Writes JSON (default
benchmarks/results/race_<device>.json), the same name with .md (the table,
also printed) and .png (dev loss against wall time for both sides).
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.metadata
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jax_transformer.data.batching import train_tokenizer  # noqa: E402
from jax_transformer.data.corpora import holdout_split, read_parallel_text  # noqa: E402
from transformer_core.checkpoint_dir import TOKENIZER_FILE  # noqa: E402
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

SIDES = ("ours", "peer")
LABEL_SMOOTHING = 0.1
TRAIN_SEED = 0  # train.py's default --seed: the order in which its tokenizer sees the pairs
IGNORED_LABEL = -100  # torch's cross_entropy ignore_index
PEER_TOKENIZER_FILE = "peer-tokenizer.model"
OURS_DIR = "ours"  # train.py's --workdir inside the race's


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("corpus: parallel text, one sentence a line")
    for split in ("", "dev-", "test-"):
        for side in ("src", "tgt"):
            g.add_argument(f"--{split}{side}-path", required=True)
    p.add_argument("--time-budget", type=float, default=600.0,
                   help="wall seconds per side, from its start (default: %(default)s)")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="default: cuda if torch sees a GPU, else cpu")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    g = p.add_argument_group("model and training, the same on both sides (default: the "
                             "paper's base model)")
    g.add_argument("--d-model", type=int, default=512)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--d-ff", type=int, default=2048)
    g.add_argument("--layers", type=int, default=6)
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--vocab-size", type=int, default=16000, help="joint BPE vocabulary")
    g.add_argument("--max-len", type=int, default=256, help="longer pairs are skipped")
    g.add_argument("--max-tokens", type=int, default=16384,
                   help="token slots per side of a batch, padding included")
    g.add_argument("--warmup", type=int, default=1000)
    g.add_argument("--eval-every", type=int, default=250, help="steps between dev losses")
    g.add_argument("--decode-batch-size", type=int, default=250)
    p.add_argument("--compile-cache", help="ours: JAX's compilation cache directory (default: "
                   "a fresh one in the work directory, i.e. a cold first run)")
    p.add_argument("--workdir", type=Path, help="kept afterwards; must not exist yet (default: "
                   "a temporary directory, removed)")
    p.add_argument("--out", type=Path, help="JSON output; the table and plot go next to it "
                   "(default: benchmarks/results/race_<device>.json)")
    args = p.parse_args(argv)
    if args.time_budget <= 0:
        p.error("--time-budget must be positive")
    if args.workdir is not None and args.workdir.exists():
        p.error(f"--workdir {args.workdir} exists; the race needs a fresh one")
    return args


def peak_rss_bytes(who: int) -> int:
    """Peak resident set size of this process (RUSAGE_SELF) or its waited-for children."""
    return resource.getrusage(who).ru_maxrss * 1024  # Linux reports KiB


# ----------------------------------------------------------------------------- ours

def run_ours(args, workdir: Path) -> dict:
    """train.py with --time-budget in a subprocess; its eval.json and metrics.jsonl -> a row."""
    run_dir = workdir / OURS_DIR
    command = [sys.executable, str(ROOT / "train.py"), "--workdir", str(run_dir),
               "--src-path", args.src_path, "--tgt-path", args.tgt_path,
               "--dev-src-path", args.dev_src_path, "--dev-tgt-path", args.dev_tgt_path,
               "--test-src-path", args.test_src_path, "--test-tgt-path", args.test_tgt_path,
               "--tokenizer-type", "bpe", "--vocab-size", str(args.vocab_size),
               "--max-len", str(args.max_len), "--max-tokens", str(args.max_tokens),
               "--d-model", str(args.d_model), "--heads", str(args.heads),
               "--d-ff", str(args.d_ff), "--layers", str(args.layers),
               "--dropout", str(args.dropout), "--warmup", str(args.warmup),
               "--label-smoothing", str(LABEL_SMOOTHING),
               "--dtype", "bfloat16" if args.device == "cuda" else "float32",
               "--steps", str(10 ** 9), "--time-budget", str(args.time_budget),
               "--eval-every", str(args.eval_every), "--checkpoint-every", str(10 ** 9),
               "--beam", "1", "--decode-batch-size", str(args.decode_batch_size),
               "--compile-cache", args.compile_cache or str(workdir / "xla-cache"),
               "--quiet", "--no-tensorboard"]
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    log_path = workdir / "ours.log"
    print(f"ours: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if code != 0:
        tail = log_path.read_text()[-3000:]
        raise SystemExit(f"error: train.py exited with {code}; the end of its log:\n{tail}")
    results = json.loads((run_dir / "eval.json").read_text())
    training = results["training"]
    offset = training["seconds_before_training"]  # the loop's `elapsed` counts from here
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step_ends = {r["step"]: offset + r["elapsed"] for r in records if "loss" in r}
    dev_curve = [{"step": r["step"], "seconds": round(step_ends[r["step"]], 2),
                  "dev_loss": r["dev_loss"]} for r in records if "dev_loss" in r]
    return {"side": "ours", "what": "train.py (jax_transformer)",
            "command": command[1:], "steps": training["steps"],
            "stopped_by": training["stopped_by"],
            "tgt_tokens_per_s": training["tgt_tokens_per_s"],
            "tgt_tokens_per_step": training["tgt_tokens_per_batch"],
            "first_step_seconds": round(step_ends[1], 2) if 1 in step_ends else None,
            "training_seconds": round(max(step_ends.values(), default=offset), 2),
            "compile_seconds": training["compile_ahead_seconds"],
            "programs_compiled": training["compiled"]["programs"],
            "compile_cache_hits": training["compiled"]["cache_hits"],
            "bleu": results["test"]["bleu"], "chrf": results["test"]["chrf"],
            "dev_loss": results["dev"]["loss"], "dev_curve": dev_curve,
            "peak_memory_bytes": (training["peak_device_memory_bytes"] if args.device == "cuda"
                                  else peak_rss_bytes(resource.RUSAGE_CHILDREN)),
            "wall_seconds": round(wall, 1), "log": str(log_path)}


# ----------------------------------------------------------------------------- the peer

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


def run_peer(args, workdir: Path) -> dict:
    """Hugging Face MarianMTModel trained by a plain torch loop for --time-budget seconds."""
    import contextlib

    import sacrebleu
    import torch
    from transformers import MarianConfig, MarianMTModel

    started = time.monotonic()  # the budget counts from here, as train.py's from its run()
    deadline = started + args.time_budget
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

    torch.manual_seed(0)
    config = MarianConfig(
        vocab_size=tokenizer.vocab_size, decoder_vocab_size=tokenizer.vocab_size,
        d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="relu",
        dropout=args.dropout, attention_dropout=args.dropout, activation_dropout=args.dropout,
        max_position_embeddings=args.max_len + 1, scale_embedding=True,
        pad_token_id=PAD_ID, eos_token_id=EOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=EOS_ID, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True)
    model = MarianMTModel(config).to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=cuda)
    scheduler = torch.optim.lr_scheduler.LambdaLR(  # the paper's schedule; step counts from 1
        optimizer, lambda done: args.d_model ** -0.5 * min((done + 1) ** -0.5,
                                                           (done + 1) * args.warmup ** -1.5))
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    rng = np.random.default_rng(0)
    step, trained_tokens, first_step_seconds, dev_curve = 0, 0, None, []
    loop_started = time.monotonic()
    while time.monotonic() < deadline:
        for index in rng.permutation(len(train_batches)):  # an epoch in shuffled batch order
            tokens = real_tokens(train_batches[index][1])  # counted on the CPU: no sync
            inputs, labels = to_device(train_batches[index], device)
            with autocast():
                loss_sum = smoothed_loss_sum(model(**inputs).logits, labels)
            (loss_sum / tokens).backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            loss_sum.item()  # waits for the step, as train.py does to log its loss
            step, trained_tokens = step + 1, trained_tokens + tokens
            first_step_seconds = first_step_seconds or time.monotonic() - started
            if step % args.eval_every == 0:
                dev_curve.append({"step": step,
                                  "seconds": round(time.monotonic() - started, 2),
                                  "dev_loss": peer_dev_loss(model, dev_batches, autocast)})
            if time.monotonic() >= deadline:
                break
    loop_ended = time.monotonic()
    peak_device = torch.cuda.max_memory_allocated(device) if cuda else None

    dev_loss = peer_dev_loss(model, dev_batches, autocast)
    hypotheses = peer_translate(model, tokenizer, [s for s, _ in test_pairs], args, device,
                                autocast)
    references = [[t for _, t in test_pairs]]
    return {"side": "peer", "what": "Hugging Face MarianMTModel, plain torch loop",
            "steps": step, "stopped_by": "time_budget",
            "tgt_tokens_per_s": round(trained_tokens / max(loop_ended - loop_started, 1e-9),
                                      1),
            "tgt_tokens_per_step": round(trained_tokens / max(step, 1), 1),
            "first_step_seconds": (round(first_step_seconds, 2) if first_step_seconds
                                   else None),
            "training_seconds": round(loop_ended - started, 2),
            "compile_seconds": 0.0, "programs_compiled": 0, "compile_cache_hits": 0,
            "bleu": sacrebleu.corpus_bleu(hypotheses, references).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, references).score,
            "dev_loss": dev_loss, "dev_curve": dev_curve,
            "peak_memory_bytes": (peak_device if cuda
                                  else peak_rss_bytes(resource.RUSAGE_SELF)),
            "wall_seconds": round(time.monotonic() - started, 1),
            "parameters": sum(p.numel() for p in model.parameters()),
            "train_pairs": len(train_src), "train_batches": len(train_batches)}


# ----------------------------------------------------------------------------- report

def markdown_table(result: dict) -> str:
    memory = ("peak device memory (GiB)" if result["device"] == "cuda"
              else "peak RSS (GiB)")
    lines = [f"| side | steps | real target tokens/s | first step (s) | compile (s) | "
             f"BLEU | chrF | dev loss | {memory} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["sides"].values():
        first = row["first_step_seconds"]
        lines.append(f"| {row['what']} | {row['steps']:,} | {row['tgt_tokens_per_s']:,.0f} | "
                     f"{'-' if first is None else f'{first:.1f}'} | "
                     f"{row['compile_seconds']:.1f} | {row['bleu']:.1f} | {row['chrf']:.1f} | "
                     f"{row['dev_loss']:.3f} | {row['peak_memory_bytes'] / 2 ** 30:.2f} |")
    return "\n".join(lines) + "\n"


def plot_dev_loss(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result["sides"].values():  # the periodic dev losses, then the final one
        curve = [(p["seconds"], p["dev_loss"]) for p in row["dev_curve"]]
        curve.append((row["training_seconds"], row["dev_loss"]))
        ax.plot(*zip(*curve), marker="o", markersize=3, label=row["what"])
    ax.axvline(result["time_budget"], color="grey", linestyle="--", label="time budget")
    ax.set_xlabel("wall seconds since the side's start")
    ax.set_ylabel("dev loss (label-smoothed, per target token)")
    ax.set_title(f"{result['device_name']}: dev loss against wall time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def device_name(device: str) -> str:
    import torch
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="race-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        sides = {}
        for side in args.sides:
            sides[side] = (run_ours if side == "ours" else run_peer)(args, workdir)
            print(f"{side}: " + json.dumps({k: v for k, v in sides[side].items()
                                            if k not in ("dev_curve", "command")}), flush=True)
        same_tokenizer = (filecmp.cmp(workdir / OURS_DIR / TOKENIZER_FILE,
                                      workdir / PEER_TOKENIZER_FILE, shallow=False)
                          if set(args.sides) == set(SIDES) else None)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir)
    result = {"device": args.device, "device_name": device_name(args.device),
              "time_budget": args.time_budget,
              "versions": {name: importlib.metadata.version(name)
                           for name in ("jax", "torch", "transformers")},
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
              "same_tokenizer": same_tokenizer,  # byte-identical SentencePiece models
              "memory": ("allocator peak bytes in use during training" if args.device == "cuda"
                         else "peak RSS of the side's process over its whole run"),
              "sides": sides}
    out = args.out or ROOT / "benchmarks" / "results" / f"race_{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown_table(result)
    out.with_suffix(".md").write_text(table)
    plot_dev_loss(result, out.with_suffix(".png"))
    print(table + f"saved {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
