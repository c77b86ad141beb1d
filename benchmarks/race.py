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
scored with sacreBLEU and chrF. Every run is a process of its own, started by the race
on the same cores (--threads of them), with a matmul peak (JAX, a fresh process)
measured just before it; --rounds N runs each side N times, alternating ABBA (round
0: ours, then the peer's variants; round 1: the variants in reverse, then ours; ...),
and the page gives medians with their spread (min-max). The sides:

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
  torch.compile; decoded with `generate(num_beams=1)`; its process sets glibc's
  malloc as train.py sets its own (train/runtime/host_memory.py; --peer-malloc
  default: as it comes) and torch's threads to --threads. --peer-variants picks
  the loops run, each "plain" or features joined by "+": fused (fused Adam on the
  CPU too), buckets (widths padded to multiples of 8), compile (torch.compile, its
  compile inside the budget), init (embeddings from N(0, d_model^-0.5)). The
  variant with the lowest median final dev loss is the race's peer; all are reported.

Both train the same SentencePiece BPE vocabulary (train.py's own
`train_tokenizer`, same pairs and seed, so the same pieces), skip pairs longer
than --max-len tokens, and measure the dev loss (label-smoothed, per real target
token) every --eval-every steps, inside their budgets; beside it, the training
loss: the mean of the steps' losses (as minimised: label-smoothed, per real target
token, dropout on) since the previous evaluation, for ours read off its
metrics.jsonl, which has every step's.

Reported per side: steps, real target tokens/s over the training loop, seconds
from the process's start (its imports included) to the end of the first step,
compile seconds, test BLEU and
chrF (both sides' translations written to files beside the JSON and scored by
the race alike, with sacreBLEU's signatures; the output/reference length ratio;
a collapsed output, most lines empty or one line, flagged), final dev loss,
the dev and training losses at each evaluation, the steady-state rate (median
over the second half of the steps, evaluations left out), and peak memory; for
ours also the loop's host
time per step and the bare compiled step on the run's own batches
(bare_step.py, run after the race: its rate and its MFU against a matmul peak
measured beside it), and when each of its runs reached the peer's final dev loss
(read off its dev losses, linearly between evaluations), against the peer's
training time. Peak memory: on CUDA the allocator's peak bytes in
use during training (JAX's peak_bytes_in_use, torch's max_memory_allocated), on
CPU the side's process peak RSS over its whole run. The versions, threads, devices,
allocator and matmul peak of every run are in the JSON. Writes JSON (default
benchmarks/results/race_<device>.json), the same name with .md (the markdown
page, also printed; --render-only RESULTS_JSON renders it again from the JSON)
and .png (dev loss against wall time for both sides). The peer's code is in
race_peer.py, the page's in race_report.py.
"""

from __future__ import annotations

import argparse
import collections
import filecmp
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import report, runner  # noqa: E402
from benchmarks.race_peer import (LABEL_SMOOTHING, PEER_TOKENIZER_FILE, PLAIN,  # noqa: E402
                                  allocator_name, variant_features)
from benchmarks.race_report import (COLLAPSED_SHARE, describe,  # noqa: E402
                                    plot_dev_loss, summarize)
from jax_transformer.train.runtime import host_memory  # noqa: E402
from transformer_core.checkpoint_dir import TOKENIZER_FILE  # noqa: E402

SIDES = ("ours", "peer")
PEER_MALLOC = ("equal", "default")
PEER_VARIANTS = (PLAIN, "fused", "buckets", "compile", "init", "fused+buckets+compile+init")
OURS_DIR = "ours"  # train.py's --workdir inside a run's


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
    p.add_argument("--peer-malloc", choices=PEER_MALLOC, default="equal",
                   help="the peer's process: glibc's malloc set as train.py sets its own "
                        "(equal, the default: train/runtime/host_memory.py), or as a plain "
                        "loop has it (default)")
    p.add_argument("--peer-variants", nargs="+", default=list(PEER_VARIANTS),
                   help="the peer's loops, each 'plain' or '+'-joined features of fused, "
                        "buckets, compile, init (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each side (and peer variant), alternating ABBA")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="cores both sides' processes run on (the first N this process may "
                        "use): torch's threads, XLA:CPU's pool (default: all, %(default)s)")
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
    if args.rounds < 1 or not 1 <= args.threads <= len(os.sched_getaffinity(0)):
        p.error("--rounds must be at least 1, --threads between 1 and the cores available")
    for variant in args.peer_variants:
        try:
            variant_features(variant)
        except ValueError as error:
            p.error(str(error))
    if args.workdir is not None and args.workdir.exists():
        p.error(f"--workdir {args.workdir} exists; the race needs a fresh one")
    return args


# ----------------------------------------------------------------------------- a run

def run_process(command: list[str], env: dict, log_path: Path, cores: set[int]
                ) -> tuple[float, int]:
    """Run `command` on `cores`, its output to `log_path`; (wall seconds, peak RSS bytes
    of that process alone). Exits with the log's end if it fails."""
    print(" ".join(command[1:]), flush=True)
    started = time.monotonic()
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   preexec_fn=lambda: os.sched_setaffinity(0, cores))
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - started
    if (code := os.waitstatus_to_exitcode(status)) != 0:
        tail = log_path.read_text()[-3000:]
        raise SystemExit(f"error: {command[1]} exited with {code}; the end of its log:\n{tail}")
    return wall, usage.ru_maxrss * 1024  # Linux reports KiB


def matmul_peak(args, cores: set[int]) -> float:
    """FLOP/s of runner.MatmulPeak (JAX, float32 on a CPU, bf16 on CUDA), in a fresh
    process on the runs' cores: the machine's state just before a run."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from benchmarks.runner import "
            "MatmulPeak as M; print(M(M.default_size(sys.argv[2]), sys.argv[3]).measure())")
    result = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), "gpu" if args.device == "cuda" else "cpu",
         "bfloat16" if args.device == "cuda" else "float32"],
        env={**os.environ, "JAX_PLATFORMS": args.device}, capture_output=True, text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores), check=True)
    return float(result.stdout.split()[-1])


def check_output(hypotheses: list[str], references: list[str], path: Path) -> dict:
    """Write a side's test translations to `path` and score them: BLEU and chrF with
    sacreBLEU's signatures (train.py's evaluation.translation_metrics, for both sides),
    the output/reference length ratio (BLEU's tokens), and whether it collapsed: more
    than COLLAPSED_SHARE of the lines empty or one same line."""
    import sacrebleu
    from jax_transformer.train.tasks.metrics import translation_metrics
    path.write_text("".join(h.replace("\n", " ") + "\n" for h in hypotheses))
    metrics = translation_metrics(hypotheses, references)
    lengths = sacrebleu.metrics.BLEU().corpus_score(hypotheses, [references])
    lines = [h.strip() for h in hypotheses]
    empty = sum(not line for line in lines)
    most_common = collections.Counter(line for line in lines if line).most_common(1)
    repeated = most_common[0][1] if most_common else 0
    share = (empty + repeated) / max(len(lines), 1)
    return {"bleu": metrics["bleu"], "bleu_signature": metrics["bleu_signature"],
            "chrf": metrics["chrf"], "chrf_signature": metrics["chrf_signature"],
            "length_ratio": round(lengths.sys_len / max(lengths.ref_len, 1), 4),
            "empty_lines": empty, "most_repeated_line": repeated,
            "collapsed": share > COLLAPSED_SHARE, "translations": report.shown_path(path)}


def test_set_references(args) -> list[str]:
    from jax_transformer.data.corpora import read_parallel_text
    return [t for _, t in read_parallel_text(args.test_src_path, args.test_tgt_path)[0]]


# ----------------------------------------------------------------------------- ours

def run_ours(args, workdir: Path, translations: Path, cores: set[int]) -> dict:
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
               "--samples", str(10 ** 9),  # eval.json keeps every test translation
               "--dev-bleu-sentences", "0", "--quiet", "--no-tensorboard"]
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    log_path = workdir / "ours.log"
    wall, peak_rss = run_process(command, env, log_path, cores)
    results = json.loads((run_dir / "eval.json").read_text())
    training = results["training"]
    offset = training["seconds_before_training"]  # the loop's `elapsed` counts from here
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    bare = bare_step(command[2:], workdir, env)
    steady = steady_rate(records, args.eval_every)
    step_starts = {r["step"]: offset + r["elapsed"] for r in records if "loss" in r}
    devices = re.search(r"(\d+) (\w+) device\(s\)", log_path.read_text())
    output = check_output([sample["translation"] for sample in results["samples"]],
                          [sample["reference"] for sample in results["samples"]], translations)
    return {"side": "ours", "what": "train.py (jax_transformer)",
            "command": command[1:], "steps": training["steps"],
            "stopped_by": training["stopped_by"],
            "tgt_tokens_per_s": training["tgt_tokens_per_s"],
            "tgt_tokens_per_step": training["tgt_tokens_per_batch"],
            "first_step_seconds": training["first_step_done_seconds"],
            "training_seconds": round(max(step_starts.values(), default=offset), 2),
            "compile_seconds": training["compile_ahead_seconds"],
            "steady_tgt_tokens_per_s": steady, "bare_step": bare,
            "host_seconds_per_step": training["host_seconds_per_step"],
            "programs_compiled": training["compiled"]["programs"],
            "compile_cache_hits": training["compiled"]["cache_hits"],
            **output, "dev_loss": results["dev"]["loss"],
            "dev_curve": dev_curve(records, step_starts),
            "peak_memory_bytes": (training["peak_device_memory_bytes"] if args.device == "cuda"
                                  else peak_rss),
            "wall_seconds": round(wall, 1), "log": str(log_path),
            "environment": {
                "threads": len(cores),  # XLA:CPU sizes its pool by the cores it may use
                "devices": f"{devices[1]} {devices[2]}" if devices else None,
                "allocator": allocator_name(host_memory.wanted(env)),  # train.py's own rule
                "versions": runner.versions("jax", "jaxlib", "flax", "optax")}}


def dev_curve(records: list[dict], step_starts: dict[int, float]) -> list[dict]:
    """train.py's evaluations in its metrics.jsonl `records`: each one's step, its seconds
    (the next step's start in `step_starts`: the evaluation included), dev loss and
    training loss, the mean of the losses train.py logged (it logs every step's) for the
    steps since the previous evaluation (train.py evaluates every --eval-every steps,
    and at --steps)."""
    step_losses = {r["step"]: r["loss"] for r in records if "loss" in r}
    evaluations = [r for r in records if "dev_loss" in r]
    return [{"step": r["step"],
             "seconds": round(step_starts.get(r["step"] + 1, max(step_starts.values())), 2),
             "dev_loss": r["dev_loss"],
             "train_loss": statistics.fmean(step_losses[step]
                                            for step in range(previous + 1, r["step"] + 1))}
            for previous, r in zip([0, *(r["step"] for r in evaluations)], evaluations)]


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


# ----------------------------------------------------------------------------- the peer

def run_peer(args, variant: str, workdir: Path, translations: Path, cores: set[int]) -> dict:
    """race_peer.py in a subprocess, on `cores`; its row, its output checked."""
    settings = workdir / "race-settings.json"
    settings.write_text(json.dumps({k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in vars(args).items()}))
    row_path = workdir / "peer.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "race_peer.py"),
               "--settings", str(settings), "--variant", variant, "--workdir", str(workdir),
               "--out", str(row_path), "--translations", str(translations)]
    # JAX_PLATFORMS: host_memory's rule, as train.py's process applies it
    env = {**os.environ, "JAX_PLATFORMS": args.device}
    wall, peak_rss = run_process(command, env, workdir / "peer.log", cores)
    row = json.loads(row_path.read_text())
    hypotheses = translations.read_text().splitlines()
    row.update(check_output(hypotheses, test_set_references(args), translations))
    row["peak_memory_bytes"] = row.pop("peak_device_memory_bytes") or peak_rss
    row["wall_seconds"] = round(wall, 1)
    return row


# ----------------------------------------------------------------------------- rounds

def run_order(rounds: int, variants: list[str], sides: list[str]) -> list[tuple[int, str]]:
    """(round, "ours" or a peer variant) in running order: ABBA, round 0 ours first, round
    1 the variants in reverse and ours last, and so on."""
    contenders = (["ours"] if "ours" in sides else []) + (variants if "peer" in sides else [])
    return [(i, who) for i in range(rounds)
            for who in (contenders if i % 2 == 0 else contenders[::-1])]


def device_name(device: str) -> str:
    import torch
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"CPU ({runner.cpu_name() or platform.machine()}, {os.cpu_count()} cores)"


def main(argv=None) -> dict:
    if (rendered := report.render_only(argv, describe)) is not None:
        return rendered
    args = parse_args(argv)
    import torch
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or ROOT / "benchmarks" / "results" / f"race_{args.device}.json"
    translations = out.with_suffix(".translations")  # the runs' test outputs, kept
    translations.mkdir(parents=True, exist_ok=True)
    cores = set(sorted(os.sched_getaffinity(0))[:args.threads])
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="race-"))
    workdir.mkdir(parents=True, exist_ok=True)
    runs, run_dirs = [], {}
    try:
        for position, (i, who) in enumerate(run_order(args.rounds, args.peer_variants,
                                                      args.sides)):
            name = f"round{i}-{'ours' if who == 'ours' else 'peer-' + who}"
            run_dirs.setdefault("ours" if who == "ours" else "peer", workdir / name)
            (workdir / name).mkdir()
            peak = matmul_peak(args, cores)
            row = (run_ours if who == "ours" else partial(run_peer, variant=who))(
                args, workdir=workdir / name, translations=translations / f"{name}.txt",
                cores=cores)
            runs.append({**row, "round": i, "position": position,
                         "matmul_peak_flops_per_s": peak})
            print(f"{name}: " + json.dumps({k: v for k, v in row.items()
                                            if k not in ("dev_curve", "command")}), flush=True)
        same_tokenizer = (filecmp.cmp(run_dirs["ours"] / OURS_DIR / TOKENIZER_FILE,
                                      run_dirs["peer"] / PEER_TOKENIZER_FILE, shallow=False)
                          if set(run_dirs) == set(SIDES) else None)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir)
    peer_variants = {variant: summarize([r for r in runs if r.get("variant") == variant])
                     for variant in args.peer_variants if "peer" in args.sides}
    best = min(peer_variants, key=lambda v: peer_variants[v]["dev_loss"], default=None)
    sides = ({"ours": summarize([r for r in runs if r["side"] == "ours"])}
             if "ours" in args.sides else {})
    if best is not None:
        sides["peer"] = peer_variants[best]
    result = {"device": args.device, "device_name": device_name(args.device),
              "time_budget": args.time_budget, "rounds": args.rounds,
              "versions": runner.versions("jax", "torch", "transformers"),
              "settings": {k: (str(v) if isinstance(v, Path) else v)
                           for k, v in vars(args).items()},
              "same_tokenizer": same_tokenizer,  # byte-identical SentencePiece models
              "memory": ("allocator peak bytes in use during training" if args.device == "cuda"
                         else "peak RSS of the side's process over its whole run"),
              "best_peer_variant": best,  # the lowest median final dev loss
              "sides": sides, "peer_variants": peer_variants, "runs": runs}
    page = report.write_results(result, out, describe)
    plot_dev_loss(result, out.with_suffix(".png"))
    print(page + f"saved {out}, {report.markdown_path(out)}, {out.with_suffix('.png')}, "
          f"{translations}/")
    return result


if __name__ == "__main__":
    main()
