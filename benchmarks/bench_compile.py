"""Compile time against depth, and the step's speed, with the layer stacks run as a
loop or as one scan (jax_transformer/scanned.py, train.py --scan-layers).

    python benchmarks/bench_compile.py           # base model, 6 and 12 layers, float32
    python benchmarks/bench_compile.py --dtype bfloat16 --batch-size 384 --src-len 64 \\
        --tgt-len 64                             # on a GPU, the bench_train GPU batch

Compile: the training step (forward, label-smoothed loss, backward, Adam; dropout
0.1) of the paper's base model (vocabulary 8000) at each depth of --depths (encoder
and decoder layers each), looped and scanned, lowered and compiled ahead
(`jit(...).lower(...).compile()`, JAX's persistent cache off); the seconds of
tracing and lowering ("lower") and of XLA's compile, for --compile-rounds rounds
that alternate the variants, median.

Step: at --layers, the loop and the scan at each --unrolls (jax.lax.scan's unroll),
from the same weights and dropout streams on the same batches (random ids, every
sentence full length), alternating one step each: --warmup rounds discarded, then
--steps rounds; median wall and CPU seconds per step. On a shared machine the
figures move between runs; the ratios within one run are what to compare.

Results go to benchmarks/results/compile.json (compile_gpu.json when JAX runs on a
GPU) with the markdown page beside it (--render-only RESULTS_JSON renders it again).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402
from benchmarks.train_steps import jax_numerics, make_batches  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def default_results_path(backend: str) -> Path:
    return RESULTS / ("compile.json" if backend == "cpu" else f"compile_{backend}.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runner.add_model_args(parser)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12],
                        help="layers per stack whose compile is timed")
    parser.add_argument("--unrolls", type=int, nargs="+", default=[1, 2],
                        help="the scan's unroll values whose step is timed")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--compile-rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    report.add_output_args(parser, "results JSON (default: benchmarks/results/compile.json, "
                                   "compile_gpu.json on a GPU)")
    return parser.parse_args(argv)


def build_trainer(args, layers: int, unroll: int | None):
    """A Trainer of the base model at `layers` per stack, looped (unroll None) or
    scanned; the same seed gives every variant the same weights and dropout streams."""
    import jax.numpy as jnp
    from flax import nnx

    from benchmarks.train_steps import make_config
    from jax_transformer.model import Transformer
    from jax_transformer.scanned import scan_layers
    from jax_transformer.train import step as training

    config = make_config(argparse.Namespace(**{**vars(args), "layers": layers}))
    dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
    model = Transformer(config, rngs=nnx.Rngs(0), dtype=dtype)
    if unroll is not None:
        scan_layers(model, unroll)
    return training.Trainer(model, training.make_optimizer(
        training.paper_schedule(config.d_model, 4000)))


def compile_step(trainer, batch):
    """(lower seconds, compile seconds, the compiled step)."""
    lower_seconds, lowered = runner.timed(trainer.train_step.lower, trainer.initial_state,
                                          batch)
    compile_seconds, compiled = runner.timed(lowered.compile)
    return lower_seconds, compile_seconds, compiled


def variant_name(unroll: int | None) -> str:
    return "loop" if unroll is None else f"scan (unroll {unroll})"


def measure_compiles(args, host_batch, kept: dict) -> list[dict]:
    """The compile rows; the last round's steps at --layers go into `kept` (by unroll)."""
    variants = [(layers, unroll) for layers in args.depths for unroll in (None, 1)]
    times = {variant: [] for variant in variants}
    for round_ in range(args.compile_rounds):
        for layers, unroll in variants:
            trainer = build_trainer(args, layers, unroll)
            lower_s, compile_s, compiled = compile_step(trainer, trainer.shard_batch(host_batch))
            times[layers, unroll].append((lower_s, compile_s))
            if layers == args.layers:
                kept[unroll] = trainer, compiled
            print(f"round {round_}: {layers} layers, {variant_name(unroll)}: lower "
                  f"{lower_s:.2f}s, compile {compile_s:.2f}s", file=sys.stderr, flush=True)
    return [dict(layers=layers, variant=variant_name(unroll),
                 lower_seconds=statistics.median(t[0] for t in times[layers, unroll]),
                 compile_seconds=statistics.median(t[1] for t in times[layers, unroll]),
                 total_seconds=statistics.median(t[0] + t[1] for t in times[layers, unroll]),
                 rounds=times[layers, unroll])
            for layers, unroll in variants]


def measure_steps(args, host_batches, kept: dict) -> list[dict]:
    """The step rows, at --layers: the loop and the scan at each --unrolls (`kept`: the
    steps measure_compiles compiled already)."""
    steppers = {}
    for unroll in (None, *args.unrolls):
        if unroll not in kept:
            trainer = build_trainer(args, args.layers, unroll)
            kept[unroll] = trainer, compile_step(trainer, trainer.shard_batch(host_batches[0]))[2]
        trainer, compiled = kept.pop(unroll)
        batches = [trainer.shard_batch(b) for b in host_batches]
        steppers[variant_name(unroll)] = [compiled, trainer.initial_state, batches]

    def step(name):
        def one(i):
            entry = steppers[name]
            compiled, state, batches = entry
            wall, cpu = time.perf_counter(), time.process_time()
            entry[1], metrics = compiled(state, batches[i % len(batches)])
            float(metrics["loss"])  # waits for the step
            return time.perf_counter() - wall, time.process_time() - cpu
        return one

    calls = {name: step(name) for name in steppers}
    runner.alternate(calls, args.warmup)
    times = runner.alternate(calls, args.steps)
    loop = statistics.median(t[0] for t in times["loop"])
    rows = []
    for name in steppers:
        wall = statistics.median(t[0] for t in times[name])
        rows.append(dict(variant=name, step_seconds=wall,
                         step_cpu_seconds=statistics.median(t[1] for t in times[name]),
                         over_loop=wall / loop, runs=times[name]))
        print(f"{name:16s} median step {wall:.4f}s ({wall / loop:.3f}x the loop)",
              file=sys.stderr, flush=True)
    return rows


def describe(result: dict) -> Report:
    compiles = result["compile"]
    by_depth = {(r["layers"], r["variant"]): r for r in compiles}
    depths = sorted({r["layers"] for r in compiles})
    compile_rows = [(r["layers"], r["variant"], f"{r['lower_seconds']:.2f}",
                     f"{r['compile_seconds']:.2f}", f"{r['total_seconds']:.2f}",
                     f"{r['total_seconds'] / by_depth[depths[0], r['variant']]['total_seconds']:.2f}x",
                     f"{r['total_seconds'] / by_depth[r['layers'], 'loop']['total_seconds']:.2f}x")
                    for r in compiles]
    step_rows = [(r["variant"], f"{r['step_seconds'] * 1e3:.1f}",
                  f"{r['step_cpu_seconds'] * 1e3:.1f}", f"{r['over_loop']:.3f}x")
                 for r in result["step"]]
    s = result["settings"]
    return Report(
        title="Compile time and step time, layer stacks looped or scanned",
        script="benchmarks/bench_compile.py",
        notes=[f"The training step of a d_model {s['d_model']}, {s['heads']}-head, d_ff "
               f"{s['d_ff']} model (vocabulary {s['vocab']}, dropout {s['dropout']}, "
               f"{s['dtype']}), batch {s['batch_size']} x {s['src_len']} + {s['tgt_len']} "
               "tokens. Compile: medians of the rounds (tracing and lowering, then XLA); "
               "step: medians of alternating rounds, same weights and batches. "
               + result["note"]],
        tables=[Table(("layers per stack", "stacks", "lower (s)", "XLA compile (s)",
                       "total (s)", f"over {depths[0]} layers", "over the loop"),
                      compile_rows, align="llrrrrr"),
                Table((f"step at {s['layers']} layers", "wall (ms)", "CPU (ms)",
                       "over the loop"), step_rows, align="lrrr")],
        settings=s, device=result["device"], versions=result["versions"])


def main(argv=None):
    if report.render_only(argv, describe) is not None:
        return
    args = parse_args(argv)
    import jax

    from benchmarks.train_steps import make_config
    jax.config.update("jax_enable_compilation_cache", False)  # compile for real
    host_batches = make_batches(args, make_config(args), 4)
    kept = {}  # unroll -> (trainer, compiled step) at --layers
    result = dict(
        settings={k: getattr(args, k) for k in (
            "d_model", "heads", "d_ff", "vocab", "dropout", "dtype", "batch_size", "src_len",
            "tgt_len", "depths", "layers", "unrolls", "compile_rounds", "warmup", "steps")},
        note=args_note(),
        compile=measure_compiles(args, host_batches[0], kept),
        step=measure_steps(args, host_batches, kept),
        device=jax_numerics(args.dtype)["device"] + f"; {runner.host()['cpus']} CPUs",
        versions=dict(**runner.versions("jax", "jaxlib", "flax"),
                      python=platform.python_version()))
    out = args.out or default_results_path(jax.default_backend())
    print(report.write_results(result, out, describe))


def args_note() -> str:
    """The machine's load when the run started: others' work moves the figures."""
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() \
        else ["?"]
    return f"Load average at the start: {' '.join(load)}."


if __name__ == "__main__":
    main()
