"""jaxformer-translate's latency: lines typed one at a time, and a file's first sentence.

    python benchmarks/bench_interactive.py --checkpoint runs/numbers/export \\
        --src-path lines.txt --lines 20 --rounds 5

Each measurement is a fresh `python -m jax_transformer.commands.translate` process, as a
user starts it:

    interactive   the first --lines lines of --src-path fed on a pipe one at a time, each
                  after the answer to the one before: the first line's latency (from the
                  process's start: imports, loading, compiling or loading its search) and
                  the median latency of the lines after it
    file          the same lines as --input: the seconds from the process's start to its
                  first translated sentence on stdout

for --framework jax and torch. JAX keeps its programs in a persistent compilation cache
of this benchmark's own (--compile-cache): one untimed interactive process first fills
it (its figures are the "cold cache" row), then every round runs each (command,
framework) in turn, on the warm cache; the figures are the medians over the rounds.
Results go to benchmarks/results/interactive.json, with the markdown page beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
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
FRAMEWORKS = ("jax", "torch")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", required=True, type=Path, help="a checkpoint directory")
    p.add_argument("--src-path", required=True, type=Path, help="source sentences, one a line")
    p.add_argument("--lines", type=int, default=20, help="the first N lines")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    report.add_output_args(p, "JSON results (default %(default)s)",
                           default=str(ROOT / "benchmarks" / "results" / "interactive.json"))
    return p.parse_args(argv)


def command(args, framework: str, cache: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jax_transformer.commands.translate", "--checkpoint",
            str(args.checkpoint), "--beam", str(args.beam), "--framework", framework,
            *(["--compile-cache", str(cache)] if framework == "jax" else []), *extra]


def start(cmd: list[str], **pipes) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, **pipes)


def finish(process: subprocess.Popen) -> None:
    """Read the rest of the process's output and wait for its end, which must be a success."""
    process.stdout.read()
    err = process.stderr.read()
    if process.wait(timeout=600) != 0:
        raise SystemExit(f"error: jaxformer-translate failed: {err.strip()[-2000:]}")


def interactive(cmd: list[str], lines: list[str]) -> dict:
    """Feed `lines` one at a time: the seconds to each answer (the first from the start)."""
    started = time.perf_counter()
    process = start(cmd, stdin=subprocess.PIPE, bufsize=1)
    seconds = []
    for line in lines:
        sent = time.perf_counter() if seconds else started
        process.stdin.write(line + "\n")
        process.stdin.flush()
        if not process.stdout.readline():
            break
        seconds.append(time.perf_counter() - sent)
    process.stdin.close()
    finish(process)
    return dict(first_line_s=seconds[0], further_lines_s=statistics.median(seconds[1:]),
                slowest_further_line_s=max(seconds[1:]))


def first_sentence(cmd: list[str], source: Path) -> dict:
    """The seconds from the start of a file's translation to its first output line."""
    started = time.perf_counter()
    process = start([*cmd, "--input", str(source)])
    process.stdout.readline()
    seconds = time.perf_counter() - started
    finish(process)
    return dict(first_sentence_s=seconds)


def measure(args) -> dict:
    lines = args.src_path.read_text(encoding="utf-8").splitlines()[:args.lines]
    if len(lines) < 2:
        raise SystemExit(f"error: --lines {args.lines} of {args.src_path}: at least 2 needed")
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        cache, source = Path(tmp) / "xla-cache", Path(tmp) / "source.txt"
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
        cold = interactive(command(args, "jax", cache), lines)
        calls = {f"{kind} {framework}": (lambda i, kind=kind, framework=framework:
                                         interactive(command(args, framework, cache), lines)
                                         if kind == "interactive" else
                                         first_sentence(command(args, framework, cache), source))
                 for kind in ("interactive", "file") for framework in FRAMEWORKS}
        runs = runner.alternate(calls, args.rounds)
    rows = [dict(name=name, runs=results, **{figure: statistics.median(r[figure] for r in results)
                                             for figure in results[0]})
            for name, results in runs.items()]
    import torch

    from transformer_core.config import TransformerConfig
    return dict(checkpoint=str(args.checkpoint), src_path=str(args.src_path), lines=len(lines),
                beam=args.beam, rounds=args.rounds,
                config=TransformerConfig.from_json(args.checkpoint / "config.json").to_dict(),
                load_average=dict(start=load_start, end=os.getloadavg()[0]),
                versions=dict(**runner.versions("jax", "flax"), torch=torch.__version__,
                              python=platform.python_version()),
                machine=runner.host(), cold_cache=cold, results=rows)


def describe(result: dict) -> Report:
    """The page: per framework the interactive latencies and a file's first sentence."""
    rows = {row["name"]: row for row in result["results"]}
    table = [[framework, f"{rows[f'interactive {framework}']['first_line_s']:.2f}",
              f"{rows[f'interactive {framework}']['further_lines_s']:.3f}",
              f"{rows[f'interactive {framework}']['slowest_further_line_s']:.3f}",
              f"{rows[f'file {framework}']['first_sentence_s']:.2f}"] for framework in FRAMEWORKS]
    cold, config, load = result["cold_cache"], result["config"], result["load_average"]
    table.append(["jax, cold cache (one run)", f"{cold['first_line_s']:.2f}",
                  f"{cold['further_lines_s']:.3f}", f"{cold['slowest_further_line_s']:.3f}", "-"])
    return Report(
        title="jaxformer-translate's latency, interactive and a file's first sentence (CPU)",
        script="benchmarks/bench_interactive.py",
        notes=[f"Model: {result['checkpoint']}, d_model {config['d_model']}, "
               f"{config['num_encoder_layers']}+{config['num_decoder_layers']} layers, "
               f"vocabulary {config['tgt_vocab_size']}; the first {result['lines']} lines of "
               f"{result['src_path']}, beam {result['beam']}. Each figure is a fresh "
               "process's, the median of "
               f"{result['rounds']} rounds on a warm compilation cache, every command and "
               "framework in turn each round; the cold-cache row is the one run that filled "
               "the cache.",
               f"Load average {load['start']:.1f} at the start, {load['end']:.1f} at the "
               f"end, on {result['machine']['cpus']} CPUs"
               + (": other jobs ran, so the figures are noisy." if max(load.values())
                  > result["machine"]["cpus"] / 2 else " (nothing else ran).")],
        tables=[Table(("framework", "first line (s)", "further lines, median (s)",
                       "slowest further line (s)", "file: first sentence (s)"), table,
                      align="lrrrr")],
        settings={k: result[k] for k in ("checkpoint", "src_path", "lines", "beam", "rounds")},
        device=runner.machine_line({**result["machine"], "jax_devices": ["cpu"]}),
        versions=result["versions"])


def main(argv=None):
    return report.run_benchmark(argv, parse_args, measure, describe,
                                ROOT / "benchmarks" / "results" / "interactive.json")


if __name__ == "__main__":
    main()
