"""The bare training step of a train.py run under several process settings, A/B.

    python benchmarks/step_variants.py --variant "1 device: JAX_NUM_CPU_DEVICES=1" \\
        --variant "2 devices: JAX_NUM_CPU_DEVICES=2" --rounds 5 --steps 5 -- TRAIN_PY_FLAGS...

Each variant is a worker process with its environment variables set (JAX's
device count, XLA_FLAGS, JAX_TRANSFORMER_KERNELS...), which builds the run's
batches and compiled step with bare_step.prepared_step (the flags' --workdir
holds a started or finished run: its tokenizer). The workers then take turns: in each
round every variant runs --steps steps on the same batches, each waited for,
so that they share the machine's state alike; the figure per variant is the
median over rounds of each round's median step time.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import bare_step, report, runner  # noqa: E402

BATCHES = 8  # the run's first batches, used in turn


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """"LABEL: NAME=VALUE ..." -> (label, environment)."""
    label, _, assignments = text.partition(":")
    env = dict(item.split("=", 1) for item in shlex.split(assignments))
    if not label.strip() or any(not name for name in env):
        raise SystemExit(f"--variant {text!r}: expected 'LABEL: NAME=VALUE ...'")
    return label.strip(), env


def worker(train_flags: list[str]) -> None:
    """Prepare the run's step, print "ready", then for each "go N" line on stdin run N
    steps and print their median seconds."""
    import jax

    run, state, _, batches = bare_step.prepared_step(train_flags, BATCHES)
    trainer = run.trainer
    print("ready", jax.device_count(), flush=True)
    done = 0
    for line in sys.stdin:
        seconds = []
        for _ in range(int(line.split()[1])):
            started = time.perf_counter()
            state, metrics = trainer.train_step(state, batches[done % BATCHES])
            jax.block_until_ready(metrics)
            seconds.append(time.perf_counter() - started)
            done += 1
        print(statistics.median(seconds), flush=True)


def start_worker(env: dict[str, str], train_flags: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--worker", "--", *train_flags],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, **env})


def measure(variants: list[tuple[str, dict[str, str]]], train_flags: list[str], rounds: int,
            steps: int) -> dict:
    workers = {label: start_worker(env, train_flags) for label, env in variants}
    devices = {}
    for label, process in workers.items():
        line = [""]
        while line[0] != "ready":  # lines the run printed before
            text = process.stdout.readline()
            if not text:
                raise SystemExit(f"variant {label!r}: its worker failed (exit {process.wait()})")
            line = text.split() or [""]
        devices[label] = int(line[1])

    def one_round(label):
        def call(_round):
            workers[label].stdin.write(f"go {steps}\n")
            workers[label].stdin.flush()
            return float(workers[label].stdout.readline())
        return call

    times = runner.alternate({label: one_round(label) for label in workers}, rounds,
                             lambda i, results: print(f"round {i + 1}: " + ", ".join(
                                 f"{label} {r[-1]:.3f} s" for label, r in results.items()),
                                 flush=True))
    for process in workers.values():
        process.stdin.close()
        process.wait()
    first = statistics.median(times[variants[0][0]])
    return {"variants": [{"label": label, "environment": env, "devices": devices[label],
                          "round_seconds": [round(t, 4) for t in times[label]],
                          "step_seconds": round(statistics.median(times[label]), 4),
                          "vs_first": round(statistics.median(times[label]) / first, 3)}
                         for label, env in variants],
            "settings": {"rounds": rounds, "steps": steps, "train_flags": train_flags},
            "machine": runner.host(), "versions": runner.versions("jax", "jaxlib", "flax")}


def machine_line(machine: dict) -> str:
    return f"{machine['processor']}, {machine['cpus']} CPUs, {machine['platform']}."


def describe(result: dict) -> report.Report:
    rows = [(v["label"], " ".join(f"{k}={val}" for k, val in v["environment"].items()) or "-",
             v["devices"], f"{v['step_seconds']:.3f}", f"{v['vs_first']:.2f}x")
            for v in result["variants"]]
    return report.Report(
        title="The bare training step under several process settings",
        script="benchmarks/step_variants.py",
        notes=["Each variant in its own process; alternating rounds of the same steps; "
               "median over rounds of each round's median step time."],
        tables=[report.Table(("variant", "environment", "devices", "step (s)",
                              "time vs the first"), rows, "lllrr")],
        settings=result["settings"], device=machine_line(result["machine"]),
        versions=result["versions"])


def main(argv=None) -> dict | None:
    if (rendered := report.render_only(argv, describe)) is not None:
        return rendered
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", default=[], metavar="'LABEL: NAME=VALUE ...'",
                   help="a worker's environment; give two or more")
    p.add_argument("--rounds", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--steps", type=int, default=5, help="steps per round (default: %(default)s)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    report.add_output_args(p, "JSON output (default: benchmarks/results/step_variants.json)",
                           default=str(ROOT / "benchmarks/results/step_variants.json"))
    p.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then the run's flags")
    args = p.parse_args(argv)
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    if args.worker:
        return worker(flags)
    if len(args.variant) < 2:
        p.error("give two or more --variant")
    result = measure([parse_variant(v) for v in args.variant], flags, args.rounds, args.steps)
    print(report.write_results(result, args.out, describe), end="")
    print(f"saved {args.out}")
    return result


if __name__ == "__main__":
    main()
