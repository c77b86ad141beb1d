"""The race: train.py against Hugging Face Marian, same corpus, same device, same wall time.

    python benchmarks/race.py --src-path train.en --tgt-path train.de \\
        --dev-src-path dev.en --dev-tgt-path dev.de --test-src-path test.en \\
        --test-tgt-path test.de --time-budget 600           # base model; bf16 on a GPU
    python benchmarks/race.py ... --time-budget 30 --d-model 32 --heads 2 --d-ff 64 \\
        --layers 1 --vocab-size 500 --max-tokens 2048 --max-len 64   # a CPU smoke run

"Which gives the better translator in ten minutes on my GPU?" Each side gets
--time-budget seconds of wall time, counted from its start (reading the corpus,
training the tokenizer, building the model and compiling included); it stops
after the step in which the budget runs out, then greedy-decodes the test set,
scored with sacreBLEU and chrF. The two sides run one after the other:

- ours: train.py in a subprocess (--time-budget; base model; bf16 on CUDA,
  float32 on CPU; packed batches of --max-tokens token slots per side; the
  paper's Adam and schedule with --warmup, label smoothing 0.1, dropout 0.1;
  the dev loss every --eval-every steps; one checkpoint, at the end; JAX's
  persistent compilation cache fresh, so cold, unless --compile-cache names one);
- the peer a user would pick instead: Hugging Face `MarianMTModel`, randomly
  initialised at the same size (post-LN, ReLU, sinusoidal positions, embeddings
  scaled by sqrt(d_model), shared and tied), trained here by a plain torch loop:
  length-sorted batches of at most --max-tokens padded token slots per side in
  shuffled order, Adam(0.9, 0.98, 1e-9) (fused on CUDA) with the paper's
  schedule, label smoothing 0.1, bf16 autocast on CUDA (float32 on CPU), no
  torch.compile; decoded with `generate(num_beams=1)`; glibc's malloc as it
  comes, or with --peer-malloc kept keeping freed memory as train.py does.

Both train the same SentencePiece BPE vocabulary (train.py's own
`train_tokenizer`, same pairs and seed, so the same pieces), skip pairs longer
than --max-len tokens, and measure the dev loss (label-smoothed, per real target
token) every --eval-every steps, inside their budgets.

Reported per side: steps, real target tokens/s over the training loop, seconds
from the start to the end of the first step, compile seconds, test BLEU and
chrF, final dev loss, the steady-state rate (median over the second half of
the steps, evaluations left out), and peak memory; for ours also the loop's host
time per step and the bare compiled step on the run's own batches
(bare_step.py, run after the race: its rate and its MFU against a matmul peak
measured beside it). Peak memory: on CUDA the allocator's peak bytes in
use during training (JAX's peak_bytes_in_use, torch's max_memory_allocated), on
CPU the side's process peak RSS over its whole run. Writes JSON (default
benchmarks/results/race_<device>.json), the same name with .md (the markdown
page, also printed; --render-only RESULTS_JSON renders it again from the JSON)
and .png (dev loss against wall time for both sides). The peer's code is in
race_peer.py.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report, runner  # noqa: E402
from benchmarks.race_peer import LABEL_SMOOTHING, PEER_TOKENIZER_FILE, run_peer  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402
from jax_transformer.train.runtime import host_memory  # noqa: E402
from transformer_core.checkpoint_dir import TOKENIZER_FILE  # noqa: E402

SIDES = ("ours", "peer")
PEER_MALLOC = ("default", "kept")
OURS_DIR = "ours"  # train.py's --workdir inside the race's


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("corpus: parallel text, one sentence a line")
    for split in ("", "dev-", "test-"):
        for side in ("src", "tgt"):
            g.add_argument(f"--{split}{side}-path", required=True)
    p.add_argument("--time-budget", type=float, default=600.0,
                   help="wall seconds per side, from its start (default: %(default)s)")
    p.add_argument("--device", choices=("cuda", "cpu"),
                   help="default: cuda if torch sees a GPU, else cpu")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--peer-malloc", choices=PEER_MALLOC, default="default",
                   help="the peer's process: glibc's malloc as a plain loop has it (default), "
                        "or keeping freed memory as train.py does (train/runtime/host_memory.py)")
    g = p.add_argument_group("model and training, the same on both sides (default: the "
                             "paper's base model)")
    runner.add_model_args(g)
    g.add_argument("--vocab-size", type=int, default=16000, help="joint BPE vocabulary")
    g.add_argument("--max-len", type=int, default=256, help="longer pairs are skipped")
    g.add_argument("--max-tokens", type=int, default=16384,
                   help="token slots per side of a batch, padding included")
    g.add_argument("--warmup", type=int, default=1000)
    g.add_argument("--eval-every", type=int, default=250, help="steps between dev losses")
    g.add_argument("--decode-batch-size", type=int, default=250)
    p.add_argument("--compile-cache", help="ours: JAX's compilation cache directory (default: "
                   "a fresh one in the work directory, i.e. a cold first run)")
    p.add_argument("--workdir", type=Path, help="kept afterwards; must not exist yet (default: "
                   "a temporary directory, removed)")
    report.add_output_args(p, "JSON output (default: benchmarks/results/race_<device>.json); "
                              "the dev-loss plot goes beside it, same name with .png",
                           type=Path)
    args = p.parse_args(argv)
    if args.time_budget <= 0:
        p.error("--time-budget must be positive")
    if args.workdir is not None and args.workdir.exists():
        p.error(f"--workdir {args.workdir} exists; the race needs a fresh one")
    return args


# ----------------------------------------------------------------------------- ours

def run_ours(args, workdir: Path) -> dict:
    """train.py with --time-budget in a subprocess; its eval.json and metrics.jsonl -> a row."""
    run_dir = workdir / OURS_DIR
    command = [sys.executable, str(ROOT / "train.py"), "--workdir", str(run_dir),
               "--src-path", args.src_path, "--tgt-path", args.tgt_path,
               "--dev-src-path", args.dev_src_path, "--dev-tgt-path", args.dev_tgt_path,
               "--test-src-path", args.test_src_path, "--test-tgt-path", args.test_tgt_path,
               "--tokenizer-type", "bpe", "--vocab-size", str(args.vocab_size),
               "--max-len", str(args.max_len), "--max-tokens", str(args.max_tokens),
               "--d-model", str(args.d_model), "--num-heads", str(args.heads),
               "--d-ff", str(args.d_ff), "--layers", str(args.layers),
               "--dropout", str(args.dropout), "--warmup", str(args.warmup),
               "--label-smoothing", str(LABEL_SMOOTHING),
               "--dtype", "bfloat16" if args.device == "cuda" else "float32",
               "--steps", str(10 ** 9), "--time-budget", str(args.time_budget),
               "--eval-every", str(args.eval_every), "--checkpoint-every", str(10 ** 9),
               "--beam", "1", "--decode-batch-size", str(args.decode_batch_size),
               "--compile-cache", args.compile_cache or str(workdir / "xla-cache"),
               "--dev-bleu-sentences", "0", "--quiet", "--no-tensorboard"]
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    log_path = workdir / "ours.log"
    print(f"ours: {' '.join(command[1:])}", flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    if code != 0:
        tail = log_path.read_text()[-3000:]
        raise SystemExit(f"error: train.py exited with {code}; the end of its log:\n{tail}")
    results = json.loads((run_dir / "eval.json").read_text())
    training = results["training"]
    offset = training["seconds_before_training"]  # the loop's `elapsed` counts from here
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    bare = bare_step(command[2:], workdir, env)
    steady = steady_rate(records, args.eval_every)
    step_ends = {r["step"]: offset + r["elapsed"] for r in records if "loss" in r}
    dev_curve = [{"step": r["step"], "seconds": round(step_ends[r["step"]], 2),
                  "dev_loss": r["dev_loss"]} for r in records if "dev_loss" in r]
    return {"side": "ours", "what": "train.py (jax_transformer)",
            "command": command[1:], "steps": training["steps"],
            "stopped_by": training["stopped_by"],
            "tgt_tokens_per_s": training["tgt_tokens_per_s"],
            "tgt_tokens_per_step": training["tgt_tokens_per_batch"],
            "first_step_seconds": round(step_ends[1], 2) if 1 in step_ends else None,
            "training_seconds": round(max(step_ends.values(), default=offset), 2),
            "compile_seconds": training["compile_ahead_seconds"],
            "steady_tgt_tokens_per_s": steady, "bare_step": bare,
            "host_seconds_per_step": training["host_seconds_per_step"],
            "programs_compiled": training["compiled"]["programs"],
            "compile_cache_hits": training["compiled"]["cache_hits"],
            "bleu": results["test"]["bleu"], "chrf": results["test"]["chrf"],
            "dev_loss": results["dev"]["loss"], "dev_curve": dev_curve,
            "peak_memory_bytes": (training["peak_device_memory_bytes"] if args.device == "cuda"
                                  else runner.peak_rss_bytes(resource.RUSAGE_CHILDREN)),
            "wall_seconds": round(wall, 1), "log": str(log_path)}


def steady_rate(records: list[dict], eval_every: int) -> float | None:
    """train.py's steady-state real target tokens/s: the median over the second half of
    the steps of a step's tokens over the time to the next step's start, leaving out
    the steps an evaluation follows."""
    starts = {r["step"]: (r["elapsed"], r["tokens"]) for r in records if "loss" in r}
    rates = [tokens / (starts[step + 1][0] - began)
             for step, (began, tokens) in sorted(starts.items())
             if step + 1 in starts and step % eval_every and starts[step + 1][0] > began]
    return round(statistics.median(rates[len(rates) // 2:]), 1) if rates else None


def bare_step(train_flags: list[str], workdir: Path, env: dict) -> dict:
    """benchmarks/bare_step.py on the finished run: the step alone, on its batches."""
    log_path = workdir / "bare_step.log"
    with open(log_path, "w") as log:
        result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bare_step.py"),
                                 "--", *train_flags], stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"error: bare_step.py exited with {result.returncode}; see {log_path}")
    return json.loads(result.stdout.splitlines()[-1])


# ----------------------------------------------------------------------------- report

def describe(result: dict) -> Report:
    """The page of a results dict: each side's headline figures, then how it trained."""
    sides = result["sides"].values()
    memory = ("peak device memory (GiB)" if result["device"] == "cuda"
              else "peak RSS (GiB)")
    headline = [[row["what"], f"{row['steps']:,}", f"{row['tgt_tokens_per_s']:,.0f}",
                 "-" if row["first_step_seconds"] is None else f"{row['first_step_seconds']:.1f}",
                 f"{row['compile_seconds']:.1f}", f"{row['bleu']:.1f}", f"{row['chrf']:.1f}",
                 f"{row['dev_loss']:.3f}", f"{row['peak_memory_bytes'] / 2 ** 30:.2f}"]
                for row in sides]
    training = [[row["what"], row["stopped_by"], f"{row['tgt_tokens_per_step']:,.0f}",
                 f"{row['training_seconds']:.1f}", f"{row['wall_seconds']:.1f}",
                 row["programs_compiled"], row["compile_cache_hits"],
                 len(row["dev_curve"])] for row in sides]
    def figure(value, form):
        return "-" if value is None else format(value, form)

    steps = [[row["what"], figure(row.get("steady_tgt_tokens_per_s"), ",.0f"),
              figure(row.get("bare_step", {}).get("tgt_tokens_per_s"), ",.0f"),
              figure(row["steady_tgt_tokens_per_s"] / row["bare_step"]["tgt_tokens_per_s"]
                     if row.get("bare_step") and row.get("steady_tgt_tokens_per_s") else None,
                     ".1%"),
              figure(row.get("host_seconds_per_step"), ".4f"),
              figure(row.get("bare_step", {}).get("mfu"), ".1%"),
              figure(row["bare_step"]["matmul_peak_flops_per_s"] / 1e9
                     if row.get("bare_step") else None, ",.0f")] for row in sides]
    tokenizers = {True: "byte-identical", False: "different",
                  None: "not compared (one side ran)"}[result["same_tokenizer"]]
    return Report(
        title="The race: train.py against Hugging Face Marian",
        script="benchmarks/race.py",
        notes=[f"Each side trained for {result['time_budget']:g} s of wall time from its "
               f"start, then greedy-decoded the test set. The two sides' SentencePiece "
               f"models: {tokenizers}. Memory: {result['memory']}. The dev loss against "
               "wall time is plotted in the .png of the same name.",
               "Steady state: the median rate over the second half of the steps, evaluations "
               "left out. The bare step (benchmarks/bare_step.py, after the race): the "
               "compiled step alone on the run's first batches, each waited for; its MFU "
               "counts matmul FLOPs against a matmul peak measured just before and after it. "
               "Host s per step: the CPU time of train.py's loop thread taking a "
               "prefetched batch and dispatching the step, its waits for the devices not "
               "counted (median; in runs before 2026-11-26, its wall time)."],
        tables=[Table(("side", "steps", "real target tokens/s", "first step (s)",
                       "compile (s)", "BLEU", "chrF", "dev loss", memory), headline,
                      align="lrrrrrrrr"),
                Table(("side", "stopped by", "real target tokens per step", "training (s)",
                       "wall (s)", "programs compiled", "compile cache hits",
                       "dev losses on the way"), training, align="llrrrrrr"),
                Table(("side", "steady-state real target tokens/s", "bare step's (same batches)",
                       "steady / bare", "host s per step", "bare step's MFU",
                       "matmul peak (GFLOP/s)"), steps, align="lrrrrrr")],
        settings={k: v for k, v in result["settings"].items()
                  if k not in ("out", "render_only")},
        device=f"{result['device_name']} (--device {result['device']}).",
        versions=result["versions"])


def plot_dev_loss(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in result["sides"].values():  # the periodic dev losses, then the final one
        curve = [(p["seconds"], p["dev_loss"]) for p in row["dev_curve"]]
        curve.append((row["training_seconds"], row["dev_loss"]))
        ax.plot(*zip(*curve), marker="o", markersize=3, label=row["what"])
    ax.axvline(result["time_budget"], color="grey", linestyle="--", label="time budget")
    ax.set_xlabel("wall seconds since the side's start")
    ax.set_ylabel("dev loss (label-smoothed, per target token)")
    ax.set_title(f"{result['device_name']}: dev loss against wall time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def device_name(device: str) -> str:
    import torch
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({runner.cpu_name() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv=None) -> dict:
    if (rendered := report.render_only(argv, describe)) is not None:
        return rendered
    args = parse_args(argv)
    if args.peer_malloc == "kept" and not host_memory.keep_freed_memory():  # before torch's threads
        raise SystemExit("error: --peer-malloc kept needs glibc, no malloc setting in "
                         f"GLIBC_TUNABLES, no {host_memory.ENVIRONMENT_VARIABLE}=0, and a "
                         "CPU run (JAX_PLATFORMS=cpu where an accelerator plugin is installed)")
    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="race-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        sides = {}
        for side in args.sides:
            sides[side] = (run_ours if side == "ours" else run_peer)(args, workdir)
            if side == "peer" and args.peer_malloc == "kept":
                sides[side]["what"] += ", glibc keeping freed memory"
            print(f"{side}: " + json.dumps({k: v for k, v in sides[side].items()
                                            if k not in ("dev_curve", "command")}), flush=True)
        same_tokenizer = (filecmp.cmp(workdir / OURS_DIR / TOKENIZER_FILE,
                                      workdir / PEER_TOKENIZER_FILE, shallow=False)
                          if set(args.sides) == set(SIDES) else None)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir)
    result = {"device": args.device, "device_name": device_name(args.device),
              "time_budget": args.time_budget,
              "versions": runner.versions("jax", "torch", "transformers"),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
              "same_tokenizer": same_tokenizer,  # byte-identical SentencePiece models
              "memory": ("allocator peak bytes in use during training" if args.device == "cuda"
                         else "peak RSS of the side's process over its whole run"),
              "sides": sides}
    out = args.out or ROOT / "benchmarks" / "results" / f"race_{args.device}.json"
    page = report.write_results(result, out, describe)
    plot_dev_loss(result, out.with_suffix(".png"))
    print(page + f"saved {out}, {report.markdown_path(out)}, {out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
