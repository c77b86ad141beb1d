"""The learning ladder: why train.py learnt less per step than Hugging Face Marian.

    python benchmarks/learning.py --src-path train.en --tgt-path train.fr \
        --dev-src-path dev.en --dev-tgt-path dev.fr          # every run, seed 0
    python benchmarks/learning.py ... --runs peer equal --seeds 1 --check

Both sides train the same model (by default the CPU proxy: d_model 128, 4 heads,
d_ff 512, 6+6 post-LN layers, a joint 8k BPE vocabulary, batches of 2,048 token
slots a side, the paper's schedule with 400 warm-up steps) on the same corpus for
--steps steps, and measure the dev loss (label-smoothed, per real target token,
dropout off, on the same padded dev batches) every --eval-every steps:

- ours: train.py's model and step (jax_transformer.train.step.Trainer);
- the peer: Hugging Face `MarianMTModel` in race_peer.py's plain torch loop.

Every run shares: the SentencePiece BPE vocabulary (train.py's `train_tokenizer`),
Adam(0.9, 0.98, 1e-9) with the paper's schedule, label smoothing 0.1 (each side's own
formula), dropout --dropout at the same four sites, float32. A run (RUNS) sets:

- init: "marian" (Marian's `_init_weights`: every matrix and token table N(0, 0.02),
  padding's row 0, biases 0), "paper" (Xavier-uniform matrices, N(0, d_model^-0.5)
  tables: train.py's draw before this ladder), one of the two parts of "paper" on
  top of "marian", or "default" (train.py's draw now). Both sides start from the
  same tensors: ours' draw is ported into Marian (port/hf_export.py's naming).
- batches: "padded" (race_peer.py's length-sorted batches of at most --max-tokens
  padded slots a side, widths a multiple of 8, rows padded up to --max-tokens with
  all-pad rows so that ours compiles a step per width; in a shuffled order the seed
  fixes, the same for both sides) or "packed" (train.py's packed rows, ours only).
- seed: the draw of the weights, the batch order and the dropout masks.

The first runs make the sides as equal as the code allows ("peer" and "equal"); each
later run changes one factor from the run it is read against. Writes JSON (default
benchmarks/results/learning_cpu.json; runs of the same settings already there are
kept, so the ladder can be measured in parts) and the same name with .md. --check:
exit 1 if train.py's defaults (or the run named) trail the peer's dev loss by over
0.03 at any evaluation (the seeds' means).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import race_peer, report, runner  # noqa: E402
from jax_transformer.data.corpora import holdout_split, read_parallel_text  # noqa: E402
from jax_transformer.data.tokenizing import train_tokenizer  # noqa: E402
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID  # noqa: E402

WIDTH_MULTIPLE = race_peer.WIDTH_MULTIPLE  # padded batches: few shapes for ours' jit
MARIAN_INIT_STD = 0.02  # MarianConfig.init_std


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of the ladder: a side and the factors it trains with, and what
    it changes from the run it is read `against`."""
    name: str
    side: str  # "ours" or "peer"
    init: str  # one of INITS
    batches: str  # "padded" or "packed" (ours only)
    against: str | None  # the run this one differs from by one factor, or None
    changed: str  # that factor, in words


@dataclasses.dataclass
class Corpus:
    """The encoded corpus both sides read: the tokenizer's pieces + eos per sentence."""
    vocab_size: int
    train_src: list
    train_tgt: list
    dev_src: list
    dev_tgt: list


def load_corpus(args, workdir: Path) -> Corpus:
    train_pairs, _ = read_parallel_text(args.src_path, args.tgt_path)
    dev_pairs, _ = read_parallel_text(args.dev_src_path, args.dev_tgt_path)
    # train.py's tokenizer: the pairs in the order its split leaves them, its seed
    tokenizer = train_tokenizer(holdout_split(train_pairs, 0, 0, seed=0)["train"],
                                workdir / "tokenizer.model", vocab_size=args.vocab_size,
                                model_type="bpe", seed=0)
    train_src, train_tgt = race_peer.encode(tokenizer, train_pairs, args.max_len)
    dev_src, dev_tgt = race_peer.encode(tokenizer, dev_pairs, args.max_len)
    return Corpus(tokenizer.vocab_size, train_src, train_tgt, dev_src, dev_tgt)


def padded_batches(src, tgt, max_tokens: int) -> list[dict[str, np.ndarray]]:
    """race_peer.py's length-sorted batches (widths a multiple of 8), as numpy arrays:
    "src" (R, S), "tgt_in" = bos + target (R, T), "tgt_out" = target + eos, pad 0.
    A batch's rows are padded up to max_tokens // its width with all-pad rows, which
    change no loss, so that ours compiles one step per width."""
    batches = []
    for indices in race_peer.token_budget_batches(src, tgt, max_tokens, WIDTH_MULTIPLE):
        width = lambda side: race_peer.padded_width(max(len(side[i]) for i in indices),
                                                    WIDTH_MULTIPLE)
        rows = max_tokens // max(width(src), width(tgt))
        batch = {"src": np.full((rows, width(src)), PAD_ID, np.int32),
                 "tgt_in": np.full((rows, width(tgt)), PAD_ID, np.int32),
                 "tgt_out": np.full((rows, width(tgt)), PAD_ID, np.int32)}
        for row, i in enumerate(indices):
            batch["src"][row, :len(src[i])] = src[i]
            batch["tgt_in"][row, :len(tgt[i])] = [BOS_ID] + tgt[i][:-1]
            batch["tgt_out"][row, :len(tgt[i])] = tgt[i]
        batches.append(batch)
    return batches


def packed_batches(corpus: Corpus, max_tokens: int, max_len: int, steps: int, seed: int
                   ) -> list[dict[str, np.ndarray]]:
    """train.py's first `steps` batches: its packed rows of one shape
    (jax_transformer.data.batches.packed, as train/inputs.py makes them), epochs in its order."""
    from jax_transformer.data.batches.packed import PackedBatches
    from jax_transformer.data.batches.rows import fitting_row_shape, positions_needed
    sides = [[np.asarray(ids[:-1], np.int32) for ids in side]  # pieces; packing adds eos
             for side in (corpus.train_src, corpus.train_tgt, corpus.dev_src, corpus.dev_tgt)]
    row_shape = fitting_row_shape(np.concatenate([positions_needed(s) for s in sides[0::2]]),
                                  np.concatenate([positions_needed(s) for s in sides[1::2]]),
                                  max_len)
    batches = PackedBatches(sides[0], sides[1], max_tokens, [row_shape], seed=seed)
    iterator = batches.iterator()
    return [next(iterator) for _ in range(steps)]


def batch_order(count: int, steps: int, seed: int) -> list[int]:
    """`steps` batch indices: epochs in shuffled order, as race_peer.py's loop."""
    rng, order = np.random.default_rng(seed), []
    while len(order) < steps:
        order.extend(rng.permutation(count).tolist())
    return order[:steps]


def our_config(args, vocab_size: int):
    """The model both sides build, in our config: Marian's sinusoid layout (half_split),
    so that weights port between the sides as they are."""
    from transformer_core.config import TransformerConfig
    return TransformerConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=args.d_model,
        num_heads=args.heads, d_ff=args.d_ff, num_encoder_layers=args.layers,
        num_decoder_layers=args.layers, dropout=args.dropout, max_len=args.max_len + 1,
        position_layout="half_split", pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID)


INITS = ("marian", "paper", "paper_embeddings", "paper_matrices", "default")


def initial_weights(args, vocab_size: int, init: str, seed: int) -> dict[str, np.ndarray]:
    """The starting weights, torch-named as in our checkpoints: the paper's ("paper",
    jax_transformer's weight_init xavier under nnx.Rngs(seed): Xavier-uniform matrices,
    embeddings N(0, d_model^-0.5)); Marian's rule ("marian", its `_init_weights`: every
    matrix and embedding N(0, 0.02), padding's row 0, biases 0, LayerNorms 1 and 0,
    drawn by numpy under `seed`); Marian's with the paper's embeddings
    ("paper_embeddings") or matrices ("paper_matrices"); or train.py's ("default",
    jax_transformer's default weight_init under nnx.Rngs(seed))."""
    from flax import nnx
    from jax_transformer.model import build_model
    from jax_transformer.pretrained import to_torch_state_dict
    config = our_config(args, vocab_size)
    if init == "default":
        return to_torch_state_dict(build_model(config, rngs=nnx.Rngs(seed)))
    paper = to_torch_state_dict(build_model(config.replace(weight_init="xavier"),
                                            rngs=nnx.Rngs(seed)))
    if init == "paper":
        return paper
    rng = np.random.default_rng(seed)

    def marian_draw(key: str, like: np.ndarray) -> np.ndarray:
        if "norm" in key:
            return np.full_like(like, 1.0 if key.endswith("weight") else 0.0)
        if key.endswith("bias"):
            return np.zeros_like(like)
        value = rng.normal(0.0, MARIAN_INIT_STD, like.shape).astype(like.dtype)
        if "embed" in key:
            value[PAD_ID] = 0.0
        return value

    marian = {key: marian_draw(key, value) for key, value in sorted(paper.items())}
    if init == "marian":
        return marian
    paper_for = (lambda key: "embed" in key) if init == "paper_embeddings" else (
        lambda key: "embed" not in key and "norm" not in key)
    return {key: paper[key] if paper_for(key) else value for key, value in marian.items()}


def train_ours(args, corpus: Corpus, run: Run, seed: int, train_batches, order,
               dev_batches) -> dict:
    """train.py's Trainer from `initial_weights`, on `train_batches` in `order`."""
    import jax
    from flax import nnx
    from jax_transformer import scanned
    from jax_transformer.model import build_model
    from jax_transformer.pretrained import load_torch_state_dict
    from jax_transformer.train.step import Trainer, make_optimizer, paper_schedule

    config = our_config(args, corpus.vocab_size)
    model = build_model(config, rngs=nnx.Rngs(seed))
    load_torch_state_dict(model, initial_weights(args, corpus.vocab_size, run.init, seed))
    scanned.scan_layers(model)  # one compile per shape whatever the depth: same maths
    schedule = paper_schedule(args.d_model, args.warmup)
    trainer = Trainer(model, make_optimizer(schedule), label_smoothing=race_peer.LABEL_SMOOTHING,
                      schedule=schedule)
    state, losses, dev_curve = trainer.initial_state, [], []

    def dev_loss(state) -> float:
        sums = [trainer.eval_step(state, batch) for batch in dev_batches]
        return (float(sum(s["loss_sum"] for s in sums))
                / float(sum(s["tokens"] for s in sums)))

    for step, index in enumerate(order, start=1):
        state, metrics = trainer.train_step(state, train_batches[index])
        losses.append(metrics["loss"])
        if step % args.eval_every == 0:
            dev_curve.append({"step": step, "dev_loss": dev_loss(state)})
    return {"train_losses": [float(x) for x in jax.device_get(losses)],
            "dev_curve": dev_curve}


def train_peer(args, corpus: Corpus, run: Run, seed: int, train_batches, order,
               dev_batches) -> dict:
    """race_peer.py's Marian and plain torch loop from `initial_weights`."""
    import torch
    from jax_transformer.port.hf_export import hf_marian_tensors

    config = our_config(args, corpus.vocab_size)
    model = race_peer.marian(args, corpus.vocab_size)
    tensors = hf_marian_tensors(initial_weights(args, corpus.vocab_size, run.init, seed),
                                config)
    missing, unexpected = model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in tensors.items()}, strict=False)
    untouched = [k for k in missing if "embed_positions" not in k and k != "lm_head.weight"
                 and "embed_tokens" not in k]
    if untouched or unexpected:
        raise RuntimeError(f"porting into Marian left {untouched} and {unexpected}")
    model.train()
    optimizer, scheduler = race_peer.paper_adam(model, args, fused=False)
    to_peer = lambda b: ({"input_ids": torch.from_numpy(b["src"]).long(),
                          "attention_mask": torch.from_numpy(b["src"] != PAD_ID),
                          "decoder_input_ids": torch.from_numpy(b["tgt_in"]).long()},
                         torch.from_numpy(np.where(b["tgt_out"] == PAD_ID,
                                                   race_peer.IGNORED_LABEL,
                                                   b["tgt_out"])).long())
    dev = [to_peer(b) for b in dev_batches]
    torch.manual_seed(seed)  # the dropout masks
    losses, dev_curve = [], []
    for step, index in enumerate(order, start=1):
        inputs, labels = to_peer(train_batches[index])
        loss_sum = race_peer.smoothed_loss_sum(model(**inputs).logits, labels)
        tokens = race_peer.real_tokens(labels)
        (loss_sum / tokens).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss_sum.item() / tokens)
        if step % args.eval_every == 0:
            dev_curve.append({"step": step, "dev_loss": race_peer.peer_dev_loss(
                model, dev, race_peer.contextlib.nullcontext)})
    return {"train_losses": losses, "dev_curve": dev_curve}


TRAINERS = {"ours": train_ours, "peer": train_peer}
# The ladder, in the order it is read: equal first, then one factor at a time.
RUNS = [
    Run("peer", "peer", "marian", "padded", None,
        "the peer's recipe: Marian's init, its length-sorted padded batches"),
    Run("equal", "ours", "marian", "padded", "peer",
        "nothing: ours from the peer's weights on the peer's batches"),
    Run("peer_paper_init", "peer", "paper", "padded", "peer",
        "init: the paper's (Xavier matrices, N(0, d^-0.5) embeddings)"),
    Run("paper_init", "ours", "paper", "padded", "equal",
        "init: the paper's (Xavier matrices, N(0, d^-0.5) embeddings)"),
    Run("paper_embeddings", "ours", "paper_embeddings", "padded", "equal",
        "init: the paper's embeddings only"),
    Run("paper_matrices", "ours", "paper_matrices", "padded", "equal",
        "init: the paper's matrices only"),
    Run("packed", "ours", "marian", "packed", "equal",
        "batches: train.py's packed rows"),
    Run("old_recipe", "ours", "paper", "packed", "packed",
        "init: the paper's; so train.py's recipe before this ladder"),
    Run("defaults", "ours", "default", "packed", "peer",
        "train.py's defaults now (its own draw of weight_init normal, packed rows)"),
]
RUN_NAMES = [run.name for run in RUNS]
CHECK_TOLERANCE = 0.03  # --check: ours' dev loss at most this much over the peer's


def measure_run(args, corpus: Corpus, run: Run, seed: int) -> dict:
    dev_batches = padded_batches(corpus.dev_src, corpus.dev_tgt, args.max_tokens)
    if run.batches == "packed":
        train_batches = packed_batches(corpus, args.max_tokens, args.max_len, args.steps, seed)
        order = list(range(args.steps))
    else:
        train_batches = padded_batches(corpus.train_src, corpus.train_tgt, args.max_tokens)
        order = batch_order(len(train_batches), args.steps, seed)
    started = time.monotonic()
    result = TRAINERS[run.side](args, corpus, run, seed, train_batches, order, dev_batches)
    losses = result.pop("train_losses")
    for point in result["dev_curve"]:  # the training loss beside it: since the last one
        point["train_loss"] = statistics.fmean(
            losses[point["step"] - args.eval_every:point["step"]])
    return {"name": run.name, "seed": seed, "seconds": round(time.monotonic() - started, 1),
            "train_tokens_per_step": statistics.fmean(
                int((train_batches[i]["tgt_out"] != PAD_ID).sum()) for i in order),
            **result}


SETTINGS = ("d_model", "heads", "d_ff", "layers", "dropout", "vocab_size", "max_len",
            "max_tokens", "warmup", "steps", "eval_every", "src_path", "tgt_path",
            "dev_src_path", "dev_tgt_path")


def measure(args) -> dict:
    """Every chosen run at every seed, added to the results already at --out for the
    same settings (a run measured again replaces its row); written after each run."""
    import jax
    args.workdir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(args.workdir / "xla"))
    settings = {name: getattr(args, name) for name in SETTINGS}
    result = {"settings": settings, "runs": [],
              "machine": {**runner.host(), "jax_devices": [str(d) for d in jax.devices()]},
              "versions": runner.versions("jax", "flax", "optax", "torch", "transformers")}
    if args.out.exists():
        earlier = json.loads(args.out.read_text())
        if earlier["settings"] != settings:
            raise SystemExit(f"error: {args.out} holds runs of other settings; give another "
                             "--out")
        result["runs"] = earlier["runs"]
    corpus = load_corpus(args, args.workdir)
    for name in args.runs:
        for seed in args.seeds:
            row = measure_run(args, corpus, RUNS[RUN_NAMES.index(name)], seed)
            result["runs"] = [r for r in result["runs"]
                              if (r["name"], r["seed"]) != (name, seed)] + [row]
            report.write_results(result, args.out, describe)
            print(f"{name} seed {seed} ({row['seconds']:.0f} s): dev loss "
                  + " / ".join(f"{p['dev_loss']:.3f}" for p in row["dev_curve"]), flush=True)
    return result


def dev_losses(result: dict, name: str) -> dict[int, float] | None:
    """A run's dev loss at each evaluation step, the mean over its seeds; None if unrun."""
    rows = [r for r in result["runs"] if r["name"] == name]
    if not rows:
        return None
    steps = [p["step"] for p in rows[0]["dev_curve"]]
    return {step: statistics.fmean(p["dev_loss"] for r in rows for p in r["dev_curve"]
                                   if p["step"] == step) for step in steps}


def check(result: dict, ours: str) -> list[str]:
    """The evaluation steps at which run `ours` trails the peer's by over CHECK_TOLERANCE."""
    theirs, mine = dev_losses(result, "peer"), dev_losses(result, ours)
    if theirs is None or mine is None:
        raise SystemExit(f"error: --check needs the runs peer and {ours}")
    return [f"step {step}: {mine[step]:.3f} against the peer's {theirs[step]:.3f}"
            for step in theirs if mine[step] > theirs[step] + CHECK_TOLERANCE]


def describe(result: dict) -> report.Report:
    steps = [p["step"] for p in result["runs"][0]["dev_curve"]]
    rows = []
    for run in RUNS:
        measured = [r for r in result["runs"] if r["name"] == run.name]
        for row in sorted(measured, key=lambda r: r["seed"]):
            curve = {p["step"]: p for p in row["dev_curve"]}
            last = curve[steps[-1]]
            against = dev_losses(result, run.against) if run.against else None
            rows.append([run.name, run.side, row["seed"], run.changed,
                         *(f"{curve[step]['dev_loss']:.3f}" for step in steps),
                         f"{last['train_loss']:.3f}",
                         f"{last['dev_loss'] - against[steps[-1]]:+.3f} ({run.against})"
                         if against else "-", f"{row['train_tokens_per_step']:,.0f}"])
    settings = result["settings"]
    return report.Report(
        title="The learning ladder: train.py against Hugging Face Marian, per step",
        script="benchmarks/learning.py",
        notes=[f"Dev loss (label-smoothed, per real target token, dropout off) at equal "
               f"steps, {settings['d_model']} wide, {settings['layers']}+{settings['layers']} "
               f"layers, the paper's schedule with {settings['warmup']} warm-up steps. Each "
               "row changes one factor from the row it is read against; the last columns: "
               f"the training loss over the last {settings['eval_every']} steps, the final "
               "dev loss against that row's (its seeds' mean), and real target tokens a step."],
        tables=[report.Table(["run", "side", "seed", "what it changes",
                              *(f"step {step}" for step in steps), "train loss",
                              "final dev loss against", "target tokens a step"], rows,
                             "llrl" + "r" * (len(steps) + 3))],
        settings={k: report.setting(v) for k, v in settings.items()},
        device=runner.machine_line(result["machine"]), versions=result["versions"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for split in ("", "dev-"):
        for side in ("src", "tgt"):
            p.add_argument(f"--{split}{side}-path", required=True)
    g = p.add_argument_group("the model and its training, the same on both sides")
    g.add_argument("--d-model", type=int, default=128)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--d-ff", type=int, default=512)
    g.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--vocab-size", type=int, default=8000, help="joint BPE vocabulary")
    g.add_argument("--max-len", type=int, default=256, help="longer pairs are skipped")
    g.add_argument("--max-tokens", type=int, default=2048,
                   help="token slots per side of a batch")
    g.add_argument("--warmup", type=int, default=400)
    g.add_argument("--steps", type=int, default=200)
    g.add_argument("--eval-every", type=int, default=50, help="steps between dev losses")
    p.add_argument("--runs", nargs="+", choices=RUN_NAMES, default=RUN_NAMES)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--check", metavar="RUN", nargs="?", const="defaults", choices=RUN_NAMES,
                   help="after measuring, exit 1 if RUN's dev loss (default: defaults, "
                        f"train.py's) is over the peer's by more than {CHECK_TOLERANCE} at "
                        "any evaluation")
    p.add_argument("--workdir", type=Path, default=Path("runs/learning"),
                   help="the tokenizer and JAX's compilation cache")
    report.add_output_args(p, "results JSON (default benchmarks/results/learning_cpu.json); "
                           "runs of the same settings already there are kept", type=Path,
                           default=RESULTS)
    return p.parse_args(argv)


RESULTS = ROOT / "benchmarks" / "results" / "learning_cpu.json"


def main(argv=None) -> dict:
    rendered = report.render_only(argv, describe)
    if rendered is not None:
        return rendered
    args = parse_args(argv)
    result = measure(args)
    print(report.write_results(result, args.out, describe), end="")
    print(f"saved {args.out}")
    if args.check:
        behind = check(result, args.check)
        if behind:
            print(f"{args.check} trails the peer: " + "; ".join(behind))
            raise SystemExit(1)
        print(f"{args.check}: within {CHECK_TOLERANCE} of the peer's dev loss or lower at "
              "every evaluation")
    return result


if __name__ == "__main__":
    main()
