"""train.py's own compile, cold: the race's model at 3, 6 and 12 layers, on 1 and 2
CPU devices, its layer stacks looped and scanned; what comes before its first step.

    python benchmarks/bench_train_compile.py --src-path corpus/train.en \
        --tgt-path corpus/train.fr     # the race's corpus; about 12 minutes on 2 cores
    python benchmarks/bench_train_compile.py --layers 3 --devices 2 --scan off on

bench_compile.py times the bare step's compile in one process; this runs train.py
itself (`--steps 1` on the pairs of --src-path/--tgt-path, 16 of them held out for
dev and 16 for test, or on its built-in corpus; the race's d_model 256, 4 heads,
d_ff 1024, BPE vocabulary 8000, packed batches of 4,096 token slots, 128 a row: the
race's shapes where sentences are as long as its), each run a process of its own
with an empty compilation cache, and reads from its log and eval.json: the train
step's XLA compile ("compiled train step ... in S s"), the programs compiled ahead
(train and eval steps, two at a time) with their tracing and lowering, the seconds
from the run's start to its first step (reading the corpus, building the model,
compiling), and the first step itself. Before each round, the seconds Python takes
to import train.py's modules in a fresh process: what comes before the run's start.
--rounds rounds run every configuration in turn; medians.

Results go to benchmarks/results/startup.json with the markdown page beside it
(--render-only RESULTS_JSON renders it again).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL = ["--d-model", "256", "--num-heads", "4", "--d-ff", "1024", "--max-tokens", "4096",
         "--max-len", "128", "--tokenizer-type", "bpe", "--vocab-size", "8000"]  # the race's
QUICK = ["--steps", "1", "--num-dev", "16", "--num-test", "16", "--eval-every", "1000000",
         "--beam", "1", "--samples", "0", "--dev-bleu-sentences", "0", "--quiet",
         "--no-tensorboard"]
ENV = {**{k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"},
       "JAX_PLATFORMS": "cpu"}
FIGURES = ("train_step_compile_seconds", "compile_ahead_seconds", "trace_lower_seconds",
           "seconds_before_training", "first_step_seconds")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 6, 12],
                        help="encoder and decoder layers each")
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--scan", nargs="+", choices=("off", "on"), default=["off", "on"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--src-path", help="training sources (default: the built-in corpus)")
    parser.add_argument("--tgt-path", help="their translations")
    report.add_output_args(parser, "results JSON (default: "
                                   "benchmarks/results/startup.json)")
    return parser.parse_args(argv)


def import_seconds() -> float:
    """Seconds a fresh Python takes to import what a run runs (train/run.py's modules)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "import jax_transformer.train.run"], cwd=ROOT,
                   check=True)
    return time.monotonic() - started


def one_run(layers: int, devices: int, scan: str, corpus: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch) / "run"
        done = subprocess.run(
            [sys.executable, "train.py", "--workdir", str(workdir), "--layers", str(layers),
             "--cpu-devices", str(devices), "--scan-layers", scan, "--compile-cache",
             str(Path(scratch) / "xla-cache"), *MODEL, *QUICK, *corpus],
            cwd=ROOT, capture_output=True, text=True, env=ENV)
        if done.returncode:
            raise SystemExit(f"train.py failed:\n{done.stderr[-3000:]}")
        training = json.loads((workdir / "eval.json").read_text())["training"]
        step = next(json.loads(line) for line in (workdir / "metrics.jsonl").open()
                    if '"loss"' in line)
    compiled = re.search(r"compiled train step \S+ in ([\d.]+) s", done.stderr)
    return {"layers": layers, "devices": devices, "scan": scan,
            "train_step_compile_seconds": float(compiled[1]),
            "compile_ahead_seconds": training["compile_ahead_seconds"],
            "trace_lower_seconds": training["compiled"]["trace_lower_seconds"],
            "seconds_before_training": training["seconds_before_training"],
            "first_step_seconds": round(step["tokens"] / step["tokens_per_s"], 3),
            "batch_shapes": training["batch_shapes"]}


def measure(args) -> dict:
    configurations = list(itertools.product(args.scan, args.devices, args.layers))
    runs, imports = [], []
    corpus = ["--src-path", args.src_path, "--tgt-path", args.tgt_path] if args.src_path else []
    for round_ in range(args.rounds):
        imports.append(round(import_seconds(), 3))
        for scan, devices, layers in configurations:
            run = one_run(layers, devices, scan, corpus)
            runs.append({**run, "round": round_})
            print(f"round {round_ + 1}: {layers} layers, {devices} device(s), scan {scan}: "
                  f"train step compiled in {run['train_step_compile_seconds']:.1f} s, first "
                  f"step at {run['seconds_before_training']:.1f} s", flush=True)
    rows = []
    for scan, devices, layers in configurations:
        mine = [r for r in runs if (r["scan"], r["devices"], r["layers"]) == (scan, devices, layers)]
        rows.append({"layers": layers, "devices": devices, "scan": scan,
                     **{name: round(statistics.median(r[name] for r in mine), 3)
                        for name in FIGURES}})
    return {"results": rows, "runs": runs, "import_seconds": imports,
            "settings": {"layers": args.layers, "devices": args.devices, "scan": args.scan,
                         "rounds": args.rounds, "train_flags": " ".join(MODEL + QUICK),
                         "corpus": args.src_path and f"{args.src_path} | {args.tgt_path}"},
            "machine": {**runner.host(), "jax_devices": ["cpu, split as each run says"]},
            "versions": runner.versions("jax", "jaxlib", "flax")}


def describe(result: dict) -> Report:
    rows = result["results"]

    def over_smallest(row):
        base = next(r for r in rows if (r["scan"], r["devices"]) == (row["scan"], row["devices"]))
        return f"{row['train_step_compile_seconds'] / base['train_step_compile_seconds']:.2f}x"

    table = [[r["scan"], r["devices"], r["layers"], f"{r['train_step_compile_seconds']:.1f}",
              over_smallest(r), f"{r['compile_ahead_seconds']:.1f}",
              f"{r['trace_lower_seconds']:.1f}", f"{r['seconds_before_training']:.1f}",
              f"{r['first_step_seconds']:.2f}"] for r in rows]
    imports = statistics.median(result["import_seconds"])
    return Report(
        title="train.py's own compile, cold (the race's model)",
        script="benchmarks/bench_train_compile.py",
        notes=[f"Medians of {result['settings']['rounds']} rounds; each run train.py "
               "`--steps 1` with an empty compilation cache. Train step: XLA's compile of "
               "the training step; against the fewest layers of its row group. Ahead: the "
               "programs compiled before the first step (train and eval steps, two at a "
               "time), with tracing and lowering. Before the first step: from the run's start "
               "(after Python's imports) to the first step's start. Importing train.py's "
               f"modules took {imports:.1f} s more (median of a fresh process's)."],
        tables=[Table(["layers scanned", "devices", "layers", "train step XLA compile (s)",
                       "over the fewest layers", "compiled ahead (s)",
                       "tracing and lowering (s)", "before the first step (s)",
                       "first step (s)"], table, "llrrrrrrr")],
        settings={k: report.setting(v) for k, v in result["settings"].items()},
        device=runner.machine_line(result["machine"]),
        versions=result["versions"])


def main(argv=None) -> dict:
    return report.run_benchmark(argv, parse_args, measure, describe, RESULTS / "startup.json")


if __name__ == "__main__":
    main()
