"""The data path at WMT size: preparing a corpus, starting train.py on it, and each
process's share of the reads.

    tar -xJf ../shared/corpora/bible-en-fr.tar.xz -C /tmp/bible
    python benchmarks/bench_data.py --corpus /tmp/bible --sizes 28800 2900000 10000000

The EN->FR corpus's train.en / train.fr are repeated line by line to each size. For each:

1. `jaxformer-prepare` in a process of its own (the default workers, one a core):
   seconds per stage, pairs/s (the encode's per worker), the peak RSS of the preparing
   process and of its largest worker, the directory's size. Beside it, SentencePiece
   alone encoding the same text on one core.
2. `train.py --data DIR` (d_model 256, 3+3 layers) twice, the compile cache cold then
   warm: seconds from the command to the end of step 1, and the process's RSS when the
   loop starts (its "compiled in" line: corpus, batches and programs ready).

Then on the --distributed-size corpus: 2 processes x 2 CPU devices against 1 process
x 4 devices, --steps steps each: their losses, and each process's bytes read of the
prepared training split (eval.json's train_data_read_bytes).

Writes benchmarks/results/data.json and data.md (--render-only RESULTS_JSON renders the
page again). Needs a few GiB of disk in --workdir per 10M pairs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--d-model", "256", "--num-heads", "4", "--d-ff", "1024", "--layers", "3"]
PREPARE = """import json, resource, sys
from jax_transformer.commands.prepare import main
code = main(sys.argv[1:])
usage = {who: resource.getrusage(getattr(resource, who)).ru_maxrss
         for who in ("RUSAGE_SELF", "RUSAGE_CHILDREN")}
print(json.dumps({"exit": code, **usage}))
"""
MIB = 2**20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, required=True,
                   help="a folder with train.en and train.fr (the EN->FR corpus)")
    p.add_argument("--sizes", type=int, nargs="+", default=[28_800, 2_900_000, 10_000_000],
                   help="corpus sizes in pairs")
    p.add_argument("--distributed-size", type=int, default=2_900_000,
                   help="the size the 2-process run trains on (one of --sizes; 0: none)")
    p.add_argument("--steps", type=int, default=5, help="steps of the 2-process comparison")
    p.add_argument("--workdir", type=Path, help="where corpora and runs go (default: a "
                                                "temporary folder, removed after)")
    report.add_output_args(p, "JSON results (default: benchmarks/results/data.json)")
    return p.parse_args(argv)


def repeat_corpus(corpus: Path, pairs: int, out: Path) -> tuple[Path, Path]:
    """train.en / train.fr repeated line by line to `pairs` lines each."""
    paths = []
    for side in ("en", "fr"):
        lines = (corpus / f"train.{side}").read_bytes().splitlines(keepends=True)
        path = out / f"train.{side}"
        with open(path, "wb") as f:
            whole, rest = divmod(pairs, len(lines))
            block = b"".join(lines)
            for _ in range(whole):
                f.write(block)
            f.write(b"".join(lines[:rest]))
        paths.append(path)
    return paths[0], paths[1]


def prepare(src: Path, tgt: Path, directory: Path) -> dict:
    """jaxformer-prepare in a process of its own: its manifest's figures and peak RSS."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", PREPARE, "--output", str(directory),
                           "--src-path", str(src), "--tgt-path", str(tgt), "--num-dev", "500",
                           "--num-test", "200", "--quiet"], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    usage = json.loads(done.stdout.strip().splitlines()[-1])
    manifest = json.loads((directory / "manifest.json").read_text())
    pairs = sum(split["read"] for split in manifest["splits"].values())
    seconds, train = manifest["seconds"], manifest["splits"]["train"]
    return {"command_seconds": round(time.monotonic() - began, 1), "seconds": seconds,
            "workers": train["parts"], "pairs": pairs,
            "pairs_per_s": round(pairs / seconds["total"]),
            "encode_pairs_per_s_per_worker": round(train["read"] / train["encode_seconds"]),
            "peak_rss_mib": round(usage["RUSAGE_SELF"] / 1024),
            "peak_worker_rss_mib": round(usage["RUSAGE_CHILDREN"] / 1024),
            "directory_mib": round(sum(p.stat().st_size for p in directory.iterdir()) / MIB),
            "log": manifest["log"]}


def sentencepiece_alone(src: Path, tgt: Path, tokenizer: Path, pairs: int = 100_000) -> float:
    """Pairs/s that SentencePiece encodes on one core (its own loop, lists of ids out)."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer))
    texts = [path.read_text(encoding="utf-8").split("\n")[:pairs] for path in (src, tgt)]
    began = time.perf_counter()
    for side in texts:
        sp.encode(side, num_threads=1)
    return round(len(texts[0]) / (time.perf_counter() - began))


def rss_mib(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {name: round(int(fields[key].split()[0]) / 1024)
            for name, key in (("rss_mib", "VmRSS"), ("peak_rss_mib", "VmHWM"))}


def to_first_step(directory: Path, workdir: Path, cache: Path) -> dict:
    """train.py --data DIR until step 1 is done (then killed): seconds from the command,
    and the process's memory when its loop starts."""
    shutil.rmtree(workdir, ignore_errors=True)
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "train.py", "--workdir", str(workdir), "--data", str(directory),
         *MODEL, "--steps", "1000", "--log-every", "1", "--quiet", "--compile-cache",
         str(cache)], cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    result = {}
    try:
        for line in process.stderr:
            if line.startswith("compiled in"):
                result["to_loop_seconds"] = round(time.monotonic() - began, 1)
                result.update(rss_mib(process.pid))
                break
        metrics = workdir / "metrics.jsonl"
        while not any('"loss"' in line for line in (metrics.read_text().splitlines()
                                                    if metrics.exists() else [])):
            assert process.poll() is None, "train.py ended before step 1"
            time.sleep(0.05)
        result["to_step_1_seconds"] = round(time.monotonic() - began, 1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return result


def distributed(directory: Path, workdir: Path, cache: Path, steps: int) -> dict:
    """2 processes x 2 CPU devices against 1 process x 4: losses and bytes read."""
    flags = ["--data", str(directory), *MODEL, "--steps", str(steps), "--quiet",
             "--compile-cache", str(cache), "--samples", "0", "--eval-every", str(steps)]
    one = workdir / "one"
    subprocess.run([sys.executable, "train.py", "--workdir", str(one), "--cpu-devices", "4",
                    *flags], cwd=ROOT, check=True, capture_output=True)
    two = workdir / "two"
    subprocess.run([sys.executable, "-m", "jax_transformer.commands.launch", "-n", "2",
                    "--cpu-devices", "2", "--", sys.executable, "train.py", "--distributed",
                    "--workdir", str(two), *flags], cwd=ROOT, check=True, capture_output=True)

    def losses(run: Path) -> list[float]:
        return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().split(
            "\n")[:-1]) if "loss" in r]

    reports = {name: json.loads((run / "eval.json").read_text())["training"]
               for name, run in (("one", one), ("two", two))}
    manifest = json.loads((directory / "manifest.json").read_text())
    a, b = np.array(losses(one)), np.array(losses(two))
    return {"steps": steps, "losses_one_process": a.tolist(), "losses_two_processes": b.tolist(),
            "max_relative_loss_difference": float(np.max(np.abs(a - b) / np.abs(a))),
            "train_data_bytes": reports["two"]["train_data_bytes"],
            # every process reads every length (2 bytes a sentence a side) to plan
            "lengths_bytes": 4 * manifest["splits"]["train"]["examples"],
            "read_bytes_one_process": reports["one"]["train_data_read_bytes"],
            "read_bytes_two_processes": reports["two"]["train_data_read_bytes"]}


def describe(result: dict) -> Report:
    sizes = result["sizes"]
    prep = [[f"{s['pairs']:,}", s["prepare"]["workers"], f"{s['prepare']['seconds']['read']:.0f}",
             f"{s['prepare']['seconds']['tokenizer']:.0f}",
             f"{s['prepare']['seconds']['encode']:.0f}", f"{s['prepare']['seconds']['total']:.0f}",
             f"{s['prepare']['pairs_per_s']:,}",
             f"{s['prepare']['encode_pairs_per_s_per_worker']:,}",
             f"{s['sentencepiece_pairs_per_s']:,}", f"{s['prepare']['peak_rss_mib']:,}",
             s["prepare"]["peak_worker_rss_mib"], f"{s['prepare']['directory_mib']:,}"]
            for s in sizes]
    start = [[f"{s['pairs']:,}", s["cold"]["to_step_1_seconds"], s["warm"]["to_loop_seconds"],
              s["warm"]["to_step_1_seconds"], s["warm"]["rss_mib"], s["warm"]["peak_rss_mib"],
              s["warm"]["rss_mib"] - sizes[0]["warm"]["rss_mib"]] for s in sizes]
    tables = [Table(("pairs", "workers", "read (s)", "tokenizer (s)", "encode (s)", "total (s)",
                     "pairs/s", "encode pairs/s per worker", "SentencePiece alone, pairs/s "
                     "on one core", "peak RSS (MiB)", "peak RSS of a worker (MiB)",
                     "directory (MiB)"), prep, align="r" * 12),
              Table(("pairs", "to step 1, cold cache (s)", "to the loop, warm cache (s)",
                     "to step 1, warm cache (s)", "RSS at the loop (MiB)",
                     "peak RSS before it (MiB)", f"RSS over {sizes[0]['pairs']:,} pairs (MiB)"),
                    start, align="r" * 7)]
    notes = ["Preparing (`jaxformer-prepare`, one encoding worker a core) and starting "
             "`train.py --data DIR` on the EN->FR corpus repeated to each size. The "
             "tokenizer trains on at most 250,000 pairs; SentencePiece alone is its "
             "`encode` on one core over the first 100,000 pairs, the ceiling of a worker."]
    if result.get("distributed"):
        d = result["distributed"]
        whole, lengths = d["train_data_bytes"], d["lengths_bytes"]
        alone = d["read_bytes_one_process"][0] - lengths
        rows = [[run, p, f"{n:,}", f"{n / whole:.2%}", f"{n - lengths:,}",
                 f"{(n - lengths) / alone:.0%}"]
                for run, reads in (("1 process x 4 devices", d["read_bytes_one_process"]),
                                   ("2 processes x 2 devices", d["read_bytes_two_processes"]))
                for p, n in enumerate(reads)]
        tables.append(Table(("run", "process", "bytes read", "of the training split",
                             "of them, sentences gathered", "of the 1-process run's gathers"),
                            rows, align="lrrrrr"))
        notes.append(f"{d['steps']} steps on {result['args']['distributed_size']:,} pairs "
                     f"(training split {whole / MIB:,.0f} MiB): the largest relative "
                     f"difference of the two topologies' losses is "
                     f"{d['max_relative_loss_difference']:.1e}.")
    host = result["host"]
    return Report(
        title="The data path at WMT size: prepare once, memory-map always",
        script="benchmarks/bench_data.py", notes=notes, tables=tables,
        settings={k: v for k, v in result["args"].items() if k not in ("out", "render_only")},
        device=f"{host['cpus']} CPUs ({host['processor']}), {host['platform']}.",
        versions=result["versions"])


def main(argv=None) -> dict:
    if (rendered := report.render_only(argv, describe)) is not None:
        return rendered
    args = parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_data_"))
    workdir.mkdir(parents=True, exist_ok=True)
    cache = workdir / "xla"
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "sizes": [], "host": runner.host(),
              "versions": {**runner.versions("jax", "sentencepiece", "numpy"),
                           "python": platform.python_version()}}
    out = Path(args.out or ROOT / "benchmarks" / "results" / "data.json")
    try:
        for pairs in args.sizes:
            folder = workdir / f"pairs{pairs}"
            folder.mkdir(exist_ok=True)
            src, tgt = repeat_corpus(args.corpus, pairs, folder)
            row = {"pairs": pairs, "prepare": prepare(src, tgt, folder / "prepared")}
            row["sentencepiece_pairs_per_s"] = sentencepiece_alone(
                src, tgt, folder / "prepared" / "tokenizer.model")
            for name in ("cold", "warm"):
                if name == "cold":
                    shutil.rmtree(cache, ignore_errors=True)
                row[name] = to_first_step(folder / "prepared", folder / "run", cache)
            print(json.dumps(row), flush=True)
            result["sizes"].append(row)
            src.unlink()
            tgt.unlink()
        if args.distributed_size:
            folder = workdir / f"pairs{args.distributed_size}"
            result["distributed"] = distributed(folder / "prepared", folder, cache, args.steps)
            print(json.dumps(result["distributed"]), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(report.write_results(result, out, describe) + f"saved {out}")
    return result


if __name__ == "__main__":
    main()
