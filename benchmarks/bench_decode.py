"""Decoding throughput: cached vs uncached greedy, and beam search, JAX vs torch.

    python benchmarks/bench_decode.py                    # base model, lengths 16 64 256
    python benchmarks/bench_decode.py --lengths 16 --repeats 2 --out /tmp/quick.json

A base-size model (d_model 512, 8 heads, d_ff 2048, 6+6 layers, 8000-token
vocabulary) with random weights, the same weights in both frameworks. Every
run decodes exactly L tokens per sentence (eos is disabled), so tokens/s =
batch * L / seconds. The first run of each (method, framework, length) is a
warm-up: for JAX it includes compilation, reported separately; the figure is
the median of the repeats after it, the frameworks alternating run by run.

    cached     greedy_search: one jit'd while_loop with a KV cache (JAX)
    uncached   greedy_search_uncached: the seeds' way, the decoder re-run over
               the whole prefix for every token (JAX: one jit per prefix length)
    beam       beam_search, beam size 4, KV cache
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np
import torch
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch_reference  # noqa: E402
from jax_transformer import TransformerConfig, pretrained  # noqa: E402
from jax_transformer import decoding as jax_decoding  # noqa: E402
from jax_transformer.model import Transformer  # noqa: E402
from torch_reference import decoding as torch_decoding  # noqa: E402

NO_EOS = -1  # never produced: every sentence runs to the full length


def run_once(framework, method, model, src, length, beam):
    decoding = jax_decoding if framework == "jax" else torch_decoding
    start = time.perf_counter()
    if method == "cached":
        tokens, _ = decoding.greedy_search(model, src, max_len=length, eos_id=NO_EOS)
    elif method == "uncached":
        tokens, _ = decoding.greedy_search_uncached(model, src, max_len=length, eos_id=NO_EOS)
    else:
        tokens, _ = decoding.beam_search(model, src, max_len=length, beam_size=beam,
                                         eos_id=NO_EOS)
    if framework == "jax":
        jax.block_until_ready(tokens)
    return time.perf_counter() - start, np.asarray(tokens)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--methods", nargs="+", default=["cached", "uncached", "beam"])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--uncached-repeats", type=int, default=1,
                   help="repeats for the (slow) uncached runs")
    p.add_argument("--uncached-lengths", type=int, nargs="*", default=[16, 64],
                   help="lengths at which to run the uncached baseline (its work grows as "
                        "L^2: at 256 it is ~256x the work at 16, tens of minutes here)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch.set_num_threads (on a machine shared with other jobs, 1 can "
                        "be much faster: OpenMP threads spin-wait when cores are busy)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "decode.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    config = TransformerConfig()  # the paper's base model
    jax_model = Transformer(config, rngs=nnx.Rngs(0))
    torch_model = torch_reference.Transformer(config).eval()
    torch_model.load_state_dict({k: torch.from_numpy(v)
                                 for k, v in pretrained.to_torch_state_dict(jax_model).items()})
    models = {"jax": jax_model, "torch": torch_model}
    src = np.random.RandomState(0).randint(4, config.src_vocab_size,
                                           (args.batch_size, args.src_len)).astype(np.int32)

    rows = []
    for length in args.lengths:
        for method in args.methods:
            if method == "uncached" and length not in args.uncached_lengths:
                continue
            repeats = args.uncached_repeats if method == "uncached" else args.repeats
            times, warmup, outputs = {"jax": [], "torch": []}, {}, {}
            for framework in ("jax", "torch"):
                warmup[framework], outputs[framework] = run_once(
                    framework, method, models[framework], src, length, args.beam)
            for _ in range(repeats):
                for framework in ("jax", "torch"):
                    times[framework].append(run_once(framework, method, models[framework],
                                                     src, length, args.beam)[0])
            same = bool((outputs["jax"] == outputs["torch"]).all())
            for framework in ("jax", "torch"):
                seconds = statistics.median(times[framework])
                row = dict(framework=framework, method=method, length=length,
                           batch_size=args.batch_size, seconds=seconds,
                           tokens_per_s=args.batch_size * length / seconds,
                           warmup_seconds=warmup[framework], runs=times[framework],
                           same_tokens_as_other_framework=same)
                rows.append(row)
                print(f"{framework:5s} {method:8s} L={length:3d}  {row['tokens_per_s']:9.1f} tok/s"
                      f"  median {seconds:7.3f}s  warm-up {warmup[framework]:7.2f}s"
                      f"  same tokens: {same}", file=sys.stderr, flush=True)

    def find(framework, method, length):
        return next((r for r in rows if (r["framework"], r["method"], r["length"])
                     == (framework, method, length)), None)

    print(f"\nbatch {args.batch_size}, source length {args.src_len}, beam {args.beam}; "
          "tokens/s (median), warm-up incl. compilation in brackets")
    header = f"{'method':10s} {'L':>4s} {'JAX':>22s} {'torch':>22s}"
    print(header + "\n" + "-" * len(header))
    for length in args.lengths:
        for method in args.methods:
            cells = []
            for framework in ("jax", "torch"):
                r = find(framework, method, length)
                if r is None:
                    cells.append("skipped")
                    continue
                cells.append(f"{r['tokens_per_s']:9.1f} ({r['warmup_seconds']:6.1f}s)")
            print(f"{method:10s} {length:4d} {cells[0]:>22s} {cells[1]:>22s}")
    summary = {}
    for length in args.lengths:
        cached, uncached = find("jax", "cached", length), find("jax", "uncached", length)
        torch_cached = find("torch", "cached", length)
        if cached and uncached:
            summary[f"jax_cached_over_uncached_L{length}"] = (cached["tokens_per_s"]
                                                              / uncached["tokens_per_s"])
        if cached and torch_cached:
            summary[f"jax_cached_over_torch_cached_L{length}"] = (
                cached["tokens_per_s"] / torch_cached["tokens_per_s"])
    for name, value in summary.items():
        print(f"{name}: {value:.2f}x")

    result = dict(
        config=dict(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                    layers=[config.num_encoder_layers, config.num_decoder_layers],
                    vocab=config.tgt_vocab_size),
        batch_size=args.batch_size, src_len=args.src_len, beam=args.beam,
        uncached_lengths=args.uncached_lengths,
        repeats=args.repeats, uncached_repeats=args.uncached_repeats,
        torch_threads=args.threads,
        versions=dict(jax=jax.__version__, flax=__import__("flax").__version__,
                      torch=torch.__version__, python=platform.python_version()),
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                     jax_devices=[str(d) for d in jax.devices()]),
        results=rows, summary=summary)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
