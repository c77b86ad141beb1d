"""The training step with its state split over the devices (train.py --fsdp N) against
the state whole on every device (--fsdp 1): step time and each device's share.

    python benchmarks/bench_fsdp.py                       # 8 CPU devices, --fsdp 1, 4, 8
    python benchmarks/bench_fsdp.py --devices 0 --fsdp 1 4  # a machine's own devices

Each --fsdp value gets a Trainer (train/step.py, the mesh of train/runtime/sharding.py)
of the same model on the same random batches (every sentence full length, split over
all the devices); after --warmup steps, --rounds rounds alternate the variants, each
round timing --steps steps of each; median and spread of the per-step seconds. The
bytes are the parameters' and Adam moments': their total and the most any one device
holds. On a CPU split into more devices than cores the steps time the partitioning's
extra work (gathers, reduce-scatters), not a speed-up.

Results go to benchmarks/results/fsdp.json (fsdp_gpu.json on GPUs) with the markdown
page beside it (--render-only RESULTS_JSON renders it again).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    runner.add_model_args(parser)
    parser.set_defaults(d_model=256, heads=4, d_ff=1024, layers=3)  # the race's model
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--devices", type=int, default=8,
                        help="CPU devices to split the machine into; 0: JAX's own devices")
    parser.add_argument("--fsdp", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--scan-layers", choices=("on", "off"), default="on",
                        help="every variant's layers scanned or looped (train.py scans "
                             "them whenever --fsdp is above 1)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=32)
    parser.add_argument("--tgt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    report.add_output_args(parser, "results JSON (default: benchmarks/results/fsdp.json, "
                                   "fsdp_gpu.json on GPUs)")
    return parser.parse_args(argv)


def variant(args, fsdp: int, batches):
    """A step function over `batches` for --fsdp `fsdp`, and its state's bytes."""
    import jax
    from flax import nnx

    from benchmarks.train_steps import make_config
    from jax_transformer import scanned
    from jax_transformer.model import Transformer
    from jax_transformer.train.records.report import state_bytes
    from jax_transformer.train.runtime.sharding import make_mesh
    from jax_transformer.train.step import Trainer, make_optimizer, paper_schedule

    config = make_config(args)
    model = Transformer(config, rngs=nnx.Rngs(0))
    if args.scan_layers == "on":
        scanned.scan_layers(model)
    trainer = Trainer(model, make_optimizer(paper_schedule(args.d_model, 4000)),
                      mesh=make_mesh(fsdp))
    device_batches = [trainer.shard_batch(b) for b in batches]
    holder = {"state": trainer.initial_state}

    def steps(count: int) -> float:
        state = holder["state"]
        seconds, _ = runner.timed(lambda: jax.block_until_ready(
            run_steps(trainer, state, device_batches, count, holder)))
        return seconds / count

    compiled = trainer.train_step.lower(trainer.initial_state, device_batches[0]).compile()
    analysis = compiled.memory_analysis()  # per device: the step's temporaries
    held = state_bytes(trainer.initial_state)
    return steps, {"total_bytes": held["state_bytes"],
                   "max_device_bytes": held["device_state_bytes"],
                   "step_temp_bytes": getattr(analysis, "temp_size_in_bytes", None)}


def run_steps(trainer, state, device_batches, count: int, holder):
    for i in range(count):
        state, metrics = trainer.train_step(state, device_batches[i % len(device_batches)])
    holder["state"] = state
    return metrics["loss"]


def measure(args) -> dict:
    import jax

    from benchmarks.train_steps import make_batches, make_config
    batches = make_batches(args, make_config(args), 4)
    variants, memory = {}, {}
    for fsdp in args.fsdp:
        variants[fsdp], memory[fsdp] = variant(args, fsdp, batches)
        variants[fsdp](args.warmup)  # compiles
    times = runner.alternate({f: (lambda i, f=f: variants[f](args.steps)) for f in args.fsdp},
                             args.rounds, lambda i, r: print(
                                 f"round {i + 1}: " + ", ".join(f"--fsdp {f} {r[f][-1] * 1e3:.0f} ms"
                                                                for f in args.fsdp), flush=True))
    base = statistics.median(times[args.fsdp[0]])
    rows = []
    for fsdp in args.fsdp:
        median = statistics.median(times[fsdp])
        rows.append({"fsdp": fsdp, "data": jax.device_count() // fsdp,
                     "step_ms": round(median * 1e3, 1),
                     "step_ms_min": round(min(times[fsdp]) * 1e3, 1),
                     "step_ms_max": round(max(times[fsdp]) * 1e3, 1),
                     "vs_first": round(median / base, 3), **memory[fsdp],
                     "share": round(memory[fsdp]["max_device_bytes"]
                                    / memory[fsdp]["total_bytes"], 4)})
    return {"results": rows, "settings": {k: v for k, v in vars(args).items()
                                          if k not in ("out", "render_only")},
            "machine": {**runner.host(), "jax_devices": [str(d) for d in jax.devices()]},
            "versions": runner.versions("jax", "flax", "optax")}


def describe(result: dict) -> Report:
    rows = [[r["fsdp"], r["data"], f"{r['max_device_bytes'] / 2**20:.1f}",
             f"{r['share']:.3f}", "-" if r["step_temp_bytes"] is None
             else f"{r['step_temp_bytes'] / 2**20:.1f}", r["step_ms"], f"{r['step_ms_min']}-{r['step_ms_max']}",
             f"{r['vs_first']:.2f}x"] for r in result["results"]]
    first = result["results"][0]
    return Report(
        title="Training step with the state split over the devices (--fsdp)",
        script="benchmarks/bench_fsdp.py",
        notes=[f"Parameters and Adam moments (the state): {first['total_bytes'] / 2**20:.1f} "
               "MiB in all. Step temporaries: XLA's memory analysis of the compiled step, per "
               "device (the gathered weights, the gradients before they are reduced into "
               "their shards, the activations). Step: median over the rounds of the mean of "
               "each round's steps; the last column against the first row."],
        tables=[Table(["--fsdp", "data", "state MiB on the fullest device", "share of the total",
                       "step temporaries MiB a device", "step ms", "range ms", "step time"],
                      rows, "rrrrrrrr")],
        settings={k: report.setting(v) for k, v in result["settings"].items()},
        device=runner.machine_line(result["machine"]),
        versions=result["versions"])


def main(argv=None) -> dict:
    rendered = report.render_only(argv, describe)
    if rendered is not None:
        return rendered
    args = parse_args(argv)
    import jax
    if args.devices:  # before JAX starts its backends
        jax.config.update("jax_num_cpu_devices", args.devices)
    result = measure(args)
    path = args.out or RESULTS / ("fsdp.json" if jax.default_backend() == "cpu"
                                  else f"fsdp_{jax.default_backend()}.json")
    print(report.write_results(result, path, describe), end="")
    print(f"saved {path}")
    return result


if __name__ == "__main__":
    main()
