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

Results go to benchmarks/results/decode.json, with the markdown page beside it
(decode.md; --render-only RESULTS_JSON renders it again from the JSON).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

FRAMEWORKS = ("jax", "torch")
NO_EOS = -1  # never produced: every sentence runs to the full length


def parse_args(argv=None):
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
    report.add_output_args(p, "JSON results (default %(default)s)",
                           default=str(Path(__file__).parent / "results" / "decode.json"))
    return p.parse_args(argv)


def load_models(config) -> dict:
    """Per framework (model, its decoding module): the same random weights in both."""
    import torch
    from flax import nnx

    import torch_reference
    from jax_transformer import decoding as jax_decoding
    from jax_transformer import pretrained
    from jax_transformer.model import Transformer
    from torch_reference import decoding as torch_decoding

    jax_model = Transformer(config, rngs=nnx.Rngs(0))
    torch_model = torch_reference.Transformer(config).eval()
    torch_model.load_state_dict({k: torch.from_numpy(v)
                                 for k, v in pretrained.to_torch_state_dict(jax_model).items()})
    return {"jax": (jax_model, jax_decoding), "torch": (torch_model, torch_decoding)}


def decode(decoding, method: str, model, src, length: int, beam: int):
    """The tokens of one decoding run, waited for."""
    import jax
    if method == "cached":
        tokens, _ = decoding.greedy_search(model, src, max_len=length, eos_id=NO_EOS)
    elif method == "uncached":
        tokens, _ = decoding.greedy_search_uncached(model, src, max_len=length, eos_id=NO_EOS)
    else:
        tokens, _ = decoding.beam_search(model, src, max_len=length, beam_size=beam,
                                         eos_id=NO_EOS)
    return jax.block_until_ready(tokens)  # torch's tensors are ready: passed through


def measure(args, models, src, method: str, length: int) -> list[dict]:
    """One row per framework: a warm-up run each, then the repeats, alternating."""
    runs = {fw: partial(decode, decoding, method, model, src, length, args.beam)
            for fw, (model, decoding) in models.items()}
    warmups = {fw: runner.timed(run) for fw, run in runs.items()}
    same = bool((np.asarray(warmups["jax"][1]) == np.asarray(warmups["torch"][1])).all())
    repeats = args.uncached_repeats if method == "uncached" else args.repeats
    times = runner.alternate({fw: lambda i, run=run: runner.timed(run)[0]
                              for fw, run in runs.items()}, repeats)
    rows = []
    for fw in FRAMEWORKS:
        seconds = statistics.median(times[fw])
        rows.append(dict(framework=fw, method=method, length=length,
                         batch_size=args.batch_size, seconds=seconds,
                         tokens_per_s=args.batch_size * length / seconds,
                         warmup_seconds=warmups[fw][0], runs=times[fw],
                         same_tokens_as_other_framework=same))
        print(f"{fw:5s} {method:8s} L={length:3d}  {rows[-1]['tokens_per_s']:9.1f} tok/s"
              f"  median {seconds:7.3f}s  warm-up {warmups[fw][0]:7.2f}s"
              f"  same tokens: {same}", file=sys.stderr, flush=True)
    return rows


def find(rows, framework: str, method: str, length: int) -> dict | None:
    return next((r for r in rows if (r["framework"], r["method"], r["length"])
                 == (framework, method, length)), None)


def speedups(rows, lengths) -> dict[str, float]:
    """JAX cached over JAX uncached, and over torch cached, per length."""
    summary = {}
    for length in lengths:
        cached, uncached = find(rows, "jax", "cached", length), find(rows, "jax", "uncached",
                                                                     length)
        torch_cached = find(rows, "torch", "cached", length)
        if cached and uncached:
            summary[f"jax_cached_over_uncached_L{length}"] = (cached["tokens_per_s"]
                                                              / uncached["tokens_per_s"])
        if cached and torch_cached:
            summary[f"jax_cached_over_torch_cached_L{length}"] = (
                cached["tokens_per_s"] / torch_cached["tokens_per_s"])
    return summary


def describe(result: dict) -> Report:
    """The page of a results dict: tokens/s per method and length, then the speed-ups."""
    rows, machine = result["results"], result["machine"]
    cells = {(r["method"], r["length"]): {} for r in rows}
    for r in rows:
        cells[r["method"], r["length"]][r["framework"]] = r
    table = []
    for (method, length), by_framework in cells.items():
        jax_row, torch_row = by_framework["jax"], by_framework["torch"]
        table.append([method, length, f"{jax_row['tokens_per_s']:.1f}",
                      f"{torch_row['tokens_per_s']:.1f}", f"{jax_row['warmup_seconds']:.2f}",
                      f"{torch_row['warmup_seconds']:.2f}", len(jax_row["runs"]),
                      "yes" if jax_row["same_tokens_as_other_framework"] else "no"])
    config = result["config"]
    return Report(
        title="Decoding throughput, JAX vs torch_reference",
        script="benchmarks/bench_decode.py",
        notes=[f"Model: d_model {config['d_model']}, {config['num_heads']} heads, d_ff "
               f"{config['d_ff']}, {'+'.join(map(str, config['layers']))} layers, vocabulary "
               f"{config['vocab']}, random weights. Tokens/s: the median of the repeats after "
               "a warm-up run; the warm-up (for JAX, compiling included) in seconds."],
        tables=[Table(("method", "output length", "JAX tokens/s", "torch tokens/s",
                       "JAX warm-up (s)", "torch warm-up (s)", "repeats",
                       "same tokens"), table, align="lrrrrrrl"),
                Table(("speed-up", "ratio"),
                      [(name, f"{value:.2f}x") for name, value in result["summary"].items()],
                      align="lr")],
        settings={k: result[k] for k in ("batch_size", "src_len", "beam", "repeats",
                                         "uncached_repeats", "uncached_lengths",
                                         "torch_threads")},
        device=runner.machine_line(machine),
        versions=result["versions"])


def main(argv=None):
    if report.render_only(argv, describe) is not None:
        return
    args = parse_args(argv)
    import jax
    import torch

    from jax_transformer import TransformerConfig
    torch.set_num_threads(args.threads)
    config = TransformerConfig()  # the paper's base model
    models = load_models(config)
    src = np.random.RandomState(0).randint(4, config.src_vocab_size,
                                           (args.batch_size, args.src_len)).astype(np.int32)
    rows = [row for length in args.lengths for method in args.methods
            if method != "uncached" or length in args.uncached_lengths
            for row in measure(args, models, src, method, length)]
    result = dict(
        config=dict(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                    layers=[config.num_encoder_layers, config.num_decoder_layers],
                    vocab=config.tgt_vocab_size),
        batch_size=args.batch_size, src_len=args.src_len, beam=args.beam,
        uncached_lengths=args.uncached_lengths,
        repeats=args.repeats, uncached_repeats=args.uncached_repeats,
        torch_threads=args.threads,
        versions=dict(**runner.versions("jax", "flax", "torch"),
                      python=platform.python_version()),
        machine=dict(**runner.host(), jax_devices=[str(d) for d in jax.devices()]),
        results=rows, summary=speedups(rows, args.lengths))
    print(report.write_results(result, args.out, describe))


if __name__ == "__main__":
    main()
