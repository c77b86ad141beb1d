"""Training on natural sentence lengths: batch shapes, compiling, packing, real tokens/s.

    python benchmarks/bench_corpus.py                  # base model, float32, 30k pairs, 200 steps
    python benchmarks/bench_corpus.py --dtype bfloat16 --max-tokens 25000   # on a GPU
    python benchmarks/bench_corpus.py --d-model 64 --heads 4 --d-ff 128 --layers 2 \
        --pairs 3000 --steps 10 --out /tmp/quick.json       # a quick smoke run

The corpus is jax_transformer.data.natural (WMT14-like lengths: median ~25
pieces, a tail past 200), generated here; a BPE tokenizer is trained on it and
the batches are packed by train.py's own data path (train.inputs.make_batches). JAX
then trains as train.py does: every step program compiled ahead of time, with
JAX's persistent compilation cache off (so compile seconds are real), then
--steps steps. torch_reference (eager; bf16 autocast with --dtype bfloat16)
trains on the same batches from the same weights.

Reported per framework: the batch shapes, how many programs XLA compiled and
the seconds it took (JAX), the fraction of token slots that hold real tokens,
and real (non-pad) target tokens per second, (a) over the first --steps steps
counted from the start (compiling included: what a user waits for) and (b) in
steady state (median over the last half of the steps). Results go to
benchmarks/results/corpus_<backend>.json, with the markdown page beside it
(corpus_<backend>.md; --render-only RESULTS_JSON renders it again from the JSON).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=30_000, help="corpus size (default: %(default)s)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=4096,
                   help="token slots per side of a batch (default: %(default)s)")
    runner.add_model_args(p)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--steps", type=int, default=200, help="steps per framework")
    p.add_argument("--frameworks", nargs="+", default=["jax", "torch"],
                   choices=("jax", "torch"))
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    report.add_output_args(p, "JSON results (default: "
                              "benchmarks/results/corpus_<backend>.json)")
    return p.parse_args(argv)


def make_data(args, workdir: Path):
    """train.py's data path on the natural-length corpus: {"train": PackedBatches, ...}."""
    from jax_transformer.data import natural
    from jax_transformer.data.tokenizing import encode_pairs, train_tokenizer
    from jax_transformer.train.inputs import make_batches
    from jax_transformer.train.settings.data import DataSettings

    pairs = natural.natural_length_corpus(args.pairs + 200, seed=0)
    splits = {"train": pairs[200:], "dev": pairs[:100], "test": pairs[100:200]}
    tokenizer = train_tokenizer(splits["train"], workdir / "spm.model",
                                vocab_size=args.vocab_size, model_type="bpe")
    settings = DataSettings(src_path="natural", tgt_path="natural", max_len=args.max_len,
                            max_tokens=args.max_tokens, vocab_size=args.vocab_size)
    encoded = {split: encode_pairs(tokenizer, pairs, max_len=args.max_len)[:2]
               for split, pairs in splits.items()}
    return tokenizer, make_batches(encoded, settings, seed=0)


def run_steps(train_step, batches) -> tuple[list[float], list[int], list[float]]:
    """Seconds, real target tokens and loss of each step; `train_step(batch)` returns
    (loss, tokens) once the step is done."""
    seconds, tokens, losses = [], [], []
    for batch in batches:
        step_seconds, (loss, step_tokens) = runner.timed(train_step, batch)
        seconds.append(step_seconds)
        tokens.append(step_tokens)
        losses.append(loss)
    return seconds, tokens, losses


def throughput(step_seconds: list[float], step_tokens: list[int], started_to_first: float):
    """Real target tokens/s from the start (compiling included) and in steady state."""
    half = len(step_seconds) // 2
    return {"first_steps_tgt_tokens_per_s": sum(step_tokens) / (started_to_first
                                                                 + sum(step_seconds)),
            "steady_tgt_tokens_per_s": statistics.median(
                t / s for t, s in zip(step_tokens[half:], step_seconds[half:])),
            "median_step_seconds": statistics.median(step_seconds[half:])}


def run_jax(args, config, batches, state_dict, shapes) -> dict:
    import jax.numpy as jnp
    from flax import nnx

    from jax_transformer.model import Transformer
    from jax_transformer.pretrained import load_torch_state_dict
    from jax_transformer.train import step as training
    from jax_transformer.train.runtime import compiling

    compiling.use_compilation_cache(None)
    compiling.CompileCounter.start()
    before = compiling.CompileCounter.snapshot()
    started = time.perf_counter()
    model = Transformer(config, rngs=nnx.Rngs(0),
                        dtype=jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32)
    load_torch_state_dict(model, state_dict)
    trainer = training.Trainer(model, training.make_optimizer(
        training.paper_schedule(config.d_model, 4000)))
    state = trainer.initial_state
    compiling.compile_ahead(trainer.programs(state, shapes), print)
    compiled = compiling.CompileCounter.since(before)
    to_first = time.perf_counter() - started

    def train_step(batch):
        nonlocal state
        state, metrics = trainer.train_step(state, trainer.shard_batch(batch))
        return float(metrics["loss"]), int(metrics["tokens"])  # waits for the step

    seconds, tokens, losses = run_steps(train_step, batches)
    return {"framework": "jax", "compiled": compiled, "seconds_to_first_step": round(to_first, 2),
            **throughput(seconds, tokens, to_first), "losses": losses,
            "peak_device_mib": runner.jax_peak_device_mib() or None}


def run_torch(args, config, batches, state_dict) -> dict:
    import torch

    from torch_reference import training
    from torch_reference.model import Transformer

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    model = Transformer(config).train()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
    model.to(device)
    optimizer, scheduler = training.make_optimizer(model,
                                                   training.paper_schedule(config.d_model, 4000))
    to_first = time.perf_counter() - started

    def train_step(batch):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=args.dtype == "bfloat16"):
            metrics = training.train_step(model, optimizer, scheduler, [batch])
        return float(metrics["loss"]), int(metrics["tokens"])  # waits for the step

    device_batches = ({k: torch.from_numpy(v.astype(np.int64)).to(device)  # one at a time
                       for k, v in batch.items()} for batch in batches)
    seconds, tokens, losses = run_steps(train_step, device_batches)
    return {"framework": "torch_eager", "seconds_to_first_step": round(to_first, 2),
            **throughput(seconds, tokens, to_first), "losses": losses,
            "peak_device_mib": (torch.cuda.max_memory_allocated() / 2 ** 20
                                if device == "cuda" else None)}


def describe(result: dict) -> Report:
    """The page of a results dict: the batches' fill, then per framework its
    compiling and its real target tokens/s."""
    args, rows = result["args"], result["rows"]
    table = [[r["framework"], f"{r['seconds_to_first_step']:.1f}",
              f"{r['first_steps_tgt_tokens_per_s']:,.0f}", f"{r['steady_tgt_tokens_per_s']:,.0f}",
              f"{r['median_step_seconds'] * 1e3:.0f}",
              r["compiled"]["programs"] if "compiled" in r else "-",
              f"{r['compiled']['compile_seconds']:.1f}" if "compiled" in r else "-",
              f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}",
              f"{r['peak_device_mib']:.0f}" if r["peak_device_mib"] else "-"] for r in rows]
    host = result["host"]
    return Report(
        title="Training on natural sentence lengths: packing, compiling, real tokens/s",
        script="benchmarks/bench_corpus.py",
        notes=[f"Batch shapes {result['batch_shapes']}, {result['batches_per_epoch']} batches "
               f"per epoch; {result['real_token_fraction']:.1%} of token slots hold real "
               f"tokens ({result['tgt_real_fraction']:.1%} of the target side's); "
               f"{result['tgt_tokens_per_batch']:,.0f} real target tokens per batch "
               f"({result['tgt_tokens_per_batch_of_max_tokens']:.0%} of --max-tokens)."],
        tables=[Table(("framework", "to the first step (s)",
                       f"real target tokens/s, first {args['steps']} steps",
                       "real target tokens/s, steady", "median step (ms)",
                       "programs compiled", "compile (s)", "loss, first -> last",
                       "peak device memory (MiB)"), table, align="lrrrrrrrr")],
        settings={k: v for k, v in args.items() if k not in ("out", "render_only")},
        device=f"{result['backend']}: {result['device']}; {host['cpus']} CPUs "
               f"({host['processor']}), {host['platform']}.",
        versions=result["versions"])


def main(argv=None) -> dict:
    if (rendered := report.render_only(argv, describe)) is not None:
        return rendered
    args = parse_args(argv)
    import jax

    from flax import nnx

    from jax_transformer.model import Transformer
    from jax_transformer.pretrained import to_torch_state_dict
    from jax_transformer.train.settings.model import ModelSettings

    with tempfile.TemporaryDirectory() as workdir:
        tokenizer, data = make_data(args, Path(workdir))
    train = data["train"]
    fill = train.fill()
    batches = [batch for _, batch in zip(range(args.steps), train.iterator())]
    print(f"batch shapes {train.shapes()}; {fill['real_fraction']:.1%} of token slots real; "
          f"{fill['tgt_tokens_per_batch']:,.0f} real target tokens per batch "
          f"({fill['tgt_tokens_per_batch'] / args.max_tokens:.0%} of --max-tokens)")
    config = ModelSettings(d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
                           num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                           dropout=args.dropout).config(tokenizer.vocab_size, args.max_len)
    state_dict = to_torch_state_dict(Transformer(config, rngs=nnx.Rngs(0)))
    rows = []
    for framework in args.frameworks:
        row = (run_jax(args, config, batches, state_dict, train.shapes()) if framework == "jax"
               else run_torch(args, config, batches, state_dict))
        print(f"{row['framework']}: {row['first_steps_tgt_tokens_per_s']:,.0f} real target "
              f"tokens/s over the first {args.steps} steps, {row['steady_tgt_tokens_per_s']:,.0f} "
              f"in steady state" + (f"; compiled {row['compiled']}" if "compiled" in row else ""))
        rows.append(row)
    result = {"backend": jax.default_backend(), "device": str(jax.devices()[0]),
              "machine": platform.machine(), "args": vars(args),
              "batch_shapes": train.shapes(), "batches_per_epoch": fill["batches"],
              "real_token_fraction": fill["real_fraction"],
              "tgt_real_fraction": fill["tgt_real_fraction"],
              "tgt_tokens_per_batch": fill["tgt_tokens_per_batch"],
              "tgt_tokens_per_batch_of_max_tokens": fill["tgt_tokens_per_batch"] / args.max_tokens,
              "rows": rows, "host": runner.host(),
              "versions": {**runner.versions("jax", "flax", "torch"),
                           "python": platform.python_version()}}
    out = Path(args.out or Path(__file__).parent / "results"
               / f"corpus_{jax.default_backend()}.json")
    print(report.write_results(result, out, describe) + f"saved {out}")
    return result


if __name__ == "__main__":
    main()
