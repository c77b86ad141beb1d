"""Training-step throughput and MFU: the Flax model vs torch_reference (eager, torch.compile).

    python benchmarks/bench_train.py                       # base model, float32, 2 threads
    python benchmarks/bench_train.py --dtype bfloat16      # bf16 compute (f32 parameters)
    python benchmarks/bench_train.py --steps 3 --warmup 1 --d-model 64 --d-ff 128 --layers 2 \
        --out /tmp/quick.json                              # a quick smoke run
    python benchmarks/bench_train.py --frameworks jax jax_autodiff_grads torch_eager
                                      # also JAX with the plain Linear kernel (autodiff's
                                      # backward), the baseline for kernels/linear.py
    python benchmarks/bench_train.py --frameworks jax_threefry_dropout jax_hash_dropout
                                      # JAX with each dropout-mask generator
                                      # (kernels/dropout.py; jax: the backend's default)

Results go to benchmarks/results/train.json, or train_gpu.json when JAX runs on
a GPU, with the markdown page beside it (train.md, train_gpu.md; --render-only
RESULTS_JSON renders it again from the JSON). On a GPU both frameworks share it: JAX's preallocation of 75% of its
memory is turned off (XLA_PYTHON_CLIENT_PREALLOCATE=false unless set), and
torch_reference runs on CUDA, under torch.autocast(bfloat16) with --dtype
bfloat16.

One training step = forward, label-smoothed loss, backward, Adam update (the
paper's optimizer and schedule, dropout 0.1, as in training). Both frameworks
start from the same weights and see the same batches (random token ids, every
sentence full length, so every target token counts in the loss). The first
step of each framework is timed on its own (for JAX it includes compilation).
Then the frameworks alternate, one step each: `--warmup` rounds discarded (they
also let work a compiler left running finish), then `--steps` timed rounds,
and the median step time is reported. The machine's matmul peak is measured in
the same run, also alternating: an N x N x N matmul (N = --matmul-size) in JAX,
in the benchmark's dtype.

Model FLOPs per step (matmuls only, 2*m*n*k; the PaLM paper's appendix B /
nanoGPT's estimate_mfu way; attention counted over the full S x S / T x T
score matrix, no causal halving; embedding lookups, softmax, LayerNorm,
element-wise ops and the optimizer not counted):

    forward per source token   F_src = L_enc * (8 d^2 + 4 S d + 4 d F)       encoder layers
                                     + L_dec * 4 d^2                          cross-attn K, V
    forward per target token   F_tgt = L_dec * (8 d^2 + 4 T d                 self-attn
                                              + 4 d^2 + 4 S d                 cross-attn Q, O, scores
                                              + 4 d F)                        FFN
                                     + 2 d V                                  output projection
    training step              FLOPs = 3 * B * (S * F_src + T * F_tgt)       (backward = 2x forward)

    MFU = (FLOPs / median step time) / (measured matmul FLOP/s), same run, same dtype.

Tokens/s counts target (loss) tokens: B * T / step time. Each row also keeps the
process's CPU time per step (`step_cpu_seconds`, median): on a shared CPU
machine, less disturbed by other processes than the wall clock.

Each row records its device, compute dtype and the matmul precision in force:
for JAX, jax_default_matmul_precision and what it computes on that backend
(float32 matmuls run as TF32 on NVIDIA GPUs unless it is "highest"); for torch,
autocast, torch.backends.cuda.matmul.allow_tf32 and
torch.get_float32_matmul_precision() (--torch-tf32 sets it to "high", TF32).

Peak memory: each framework runs first step + warm-up + a few steps in a fresh
subprocess. On a GPU: the peak device memory its allocator handed out (JAX:
memory_stats()["peak_bytes_in_use"]; torch: torch.cuda.max_memory_allocated()).
On CPU, where JAX's memory_stats() is None: the process's peak RSS (VmHWM from
/proc/self/status), which includes the Python runtime and the framework's
libraries; "base" is the RSS after imports, before the model is built.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

# Both frameworks share one GPU: JAX must not reserve 75% of it when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, runner, train_steps  # noqa: E402
from benchmarks.report import Report, Table  # noqa: E402


def model_flops_per_step(c, batch_size: int, src_len: int, tgt_len: int) -> dict:
    """Matmul FLOPs of a forward pass and of a training step (the docstring's formula)."""
    d, f, S, T = c.d_model, c.d_ff, src_len, tgt_len
    per_src = c.num_encoder_layers * (8 * d * d + 4 * S * d + 4 * d * f) \
        + c.num_decoder_layers * 4 * d * d
    per_tgt = c.num_decoder_layers * (8 * d * d + 4 * T * d + 4 * d * d + 4 * S * d + 4 * d * f) \
        + 2 * d * c.tgt_vocab_size
    forward = batch_size * (S * per_src + T * per_tgt)
    return {"forward": forward, "train_step": 3 * forward,
            "forward_per_src_token": per_src, "forward_per_tgt_token": per_tgt}


def default_results_path(backend: str) -> Path:
    return Path(__file__).parent / "results" / ("train_gpu.json" if backend == "gpu"
                                                else "train.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    runner.add_model_args(p)
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=4000, help="learning-rate warm-up")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype (parameters and optimizer stay float32); torch "
                        "uses autocast")
    p.add_argument("--frameworks", nargs="+", default=["jax", "torch_eager", "torch_compile"],
                   choices=train_steps.FRAMEWORKS,
                   help="jax_autodiff_grads: JAX with autodiff's own Linear backward (the "
                        "baseline for jax_transformer/kernels/linear.py); jax_threefry_dropout, "
                        "jax_hash_dropout: JAX with dropout masks from threefry or the "
                        "counter hash (jax_transformer/kernels/dropout.py)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per framework")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed rounds (one step per framework) after the first steps")
    p.add_argument("--pause", type=float, default=0.2,
                   help="seconds of idle before each timed step (OpenMP/Eigen threads spin "
                        "for a while after work; this keeps one framework's spinning out of "
                        "the other's step)")
    p.add_argument("--matmul-size", type=int, default=None,
                   help="N of the peak-measuring matmul (default 2048 on CPU, 8192 on GPU)")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch.set_num_threads (XLA uses every core by default)")
    p.add_argument("--reference-peak-tflops", type=float, default=None,
                   help="a spec-sheet peak (e.g. 989 for an H100 SXM's dense bf16) for a "
                        "second MFU figure; the measured matmul peak is always used")
    p.add_argument("--torch-tf32", action="store_true",
                   help="torch.set_float32_matmul_precision('high'): TF32 for torch's float32 "
                        "matmuls on CUDA, as JAX's default precision uses there")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--memory-probe", choices=train_steps.FRAMEWORKS, help=argparse.SUPPRESS)
    report.add_output_args(p, "JSON results (default benchmarks/results/train.json, or "
                              "train_gpu.json when JAX runs on a GPU)")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- memory probe

def memory_probe(args, framework: str) -> dict:
    """Run in a fresh subprocess: peak RSS (and device memory, on a GPU) of one
    framework's training steps."""
    import jax  # noqa: F401  (both frameworks' libraries are imported in both probes)
    import torch  # noqa: F401
    train_steps.set_torch_options(args)
    base = runner.current_rss_mib()
    config = train_steps.make_config(args)
    contender = train_steps.make_runner(framework, args, config, None)
    batches = [contender.prepare(b) for b in train_steps.make_batches(args, config, 3)]
    for i in range(1 + args.warmup):
        contender.step(batches[i % len(batches)])
    return {"peak_rss_mib": runner.peak_rss_mib(), "base_rss_mib": base,
            "peak_device_mib": contender.peak_memory_mib()}


def run_memory_probe(flags: list[str], framework: str) -> dict:
    """memory_probe in a subprocess, with this run's flags (a probe prints, never writes)."""
    cmd = [sys.executable, __file__, "--memory-probe", framework, *flags]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # report, don't fail the benchmark
        return {"error": f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}"[-500:]}


# ----------------------------------------------------------------------------- timing

def first_steps(args, config, state_dict) -> tuple[dict, dict, dict]:
    """Each framework's (runner, device batches), its first step's seconds (for JAX,
    compiling included), and the errors of frameworks that failed (not fatal)."""
    host_batches = train_steps.make_batches(args, config, 4)
    contenders, first, errors = {}, {}, {}
    for name in args.frameworks:
        try:
            contender = train_steps.make_runner(name, args, config, state_dict)
            batches = [contender.prepare(b) for b in host_batches]
            first[name] = contender.step(batches[0])[0]
            contenders[name] = (contender, batches)
        except Exception as e:  # e.g. torch.compile without a working compiler
            errors[name] = f"{type(e).__name__}: {e}"[:500]
            print(f"{name}: failed: {errors[name]}", file=sys.stderr, flush=True)
        print(f"{name}: first step {first.get(name, float('nan')):.2f}s", file=sys.stderr,
              flush=True)
    return contenders, first, errors


def timed_step(contender, batches, pause: float, i: int) -> dict:
    time.sleep(pause)  # let the other framework's worker threads go idle
    cpu_start = time.process_time()
    seconds, loss = contender.step(batches[i % len(batches)])
    # the CPU time of this process's threads: on a shared CPU machine, less disturbed
    # by other processes than the wall clock
    return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu_start, "loss": loss}


def print_round(i: int, results: dict[str, list]) -> None:
    steps = "  ".join(f"{name} {records[-1]['seconds']:.3f}s"
                      for name, records in results.items() if name != "matmul_peak")
    print(f"round {i}: {steps}  matmul {results['matmul_peak'][-1] / 1e9:.0f} GFLOP/s",
          file=sys.stderr, flush=True)


def timed_rounds(args, contenders: dict, peak: runner.MatmulPeak) -> dict[str, list]:
    """--warmup untimed rounds, then --steps timed ones, one step per framework each,
    alternating. Returns each framework's timed_step records and, under "matmul_peak",
    the matmul's FLOP/s, measured once per timed round."""
    # Warm-up rounds alternate like the timed ones and come after every first step,
    # so that work a compiler leaves running (torch.compile's worker processes) is
    # over before timing starts.
    runner.alternate({name: lambda i, c=contender, b=batches: c.step(b[(i + 1) % len(b)])
                      for name, (contender, batches) in contenders.items()}, args.warmup)
    calls = {"matmul_peak": lambda i: peak.measure(),
             **{name: partial(timed_step, contender, batches, args.pause)
                for name, (contender, batches) in contenders.items()}}
    return runner.alternate(calls, args.steps, after_round=print_round)


# ----------------------------------------------------------------------------- results

def make_rows(args, flops: dict, contenders: dict, first: dict, timings: dict,
              memory: dict, peak_flops: float) -> list[dict]:
    rows = []
    for name, (contender, _) in contenders.items():
        times = [record["seconds"] for record in timings[name]]
        cpu_times = [record["cpu_seconds"] for record in timings[name]]
        seconds = statistics.median(times)
        achieved = flops["train_step"] / seconds
        probe = memory.get(name, {})
        rows.append({
            "framework": name, "dtype": args.dtype, **contender.numerics,
            "step_seconds": seconds, "tokens_per_s": args.batch_size * args.tgt_len / seconds,
            "model_flops_per_step": flops["train_step"], "achieved_flops_per_s": achieved,
            "mfu": achieved / peak_flops, "first_step_seconds": first[name],
            "peak_rss_mib": probe.get("peak_rss_mib"),
            "peak_device_mib": probe.get("peak_device_mib"),
            "mfu_vs_reference_peak": (achieved / (args.reference_peak_tflops * 1e12)
                                      if args.reference_peak_tflops else None),
            "base_rss_mib": probe.get("base_rss_mib"),
            "step_times": times, "losses": [record["loss"] for record in timings[name]],
            "step_cpu_seconds": statistics.median(cpu_times), "step_cpu_times": cpu_times,
        })
    eager = next((r for r in rows if r["framework"] == "torch_eager"), None)
    for r in rows:
        r["speedup_vs_torch_eager"] = eager and eager["step_seconds"] / r["step_seconds"]
    return rows


def make_result(args, config, contenders, first, errors, timings, memory) -> dict:
    import jax
    import torch
    flops = model_flops_per_step(config, args.batch_size, args.src_len, args.tgt_len)
    peaks = timings["matmul_peak"]
    peak_flops = statistics.median(peaks)
    rows = make_rows(args, flops, contenders, first, timings, memory, peak_flops)
    return {
        "config": {k: getattr(config, k) for k in ("d_model", "num_heads", "d_ff",
                                                   "num_encoder_layers", "num_decoder_layers",
                                                   "src_vocab_size", "dropout")},
        "batch": {"batch_size": args.batch_size, "src_len": args.src_len,
                  "tgt_len": args.tgt_len},
        "args": vars(args),
        "flops": flops,
        "matmul_peak": {"n": args.matmul_size, "dtype": args.dtype,
                        "matmul_precision":
                            train_steps.jax_numerics(args.dtype)["matmul_precision"],
                        "median_flops_per_s": peak_flops, "runs": peaks},
        "rows": rows, "errors": errors, "memory_probes": memory,
        "machine": {**runner.host(), "python": sys.version.split()[0],
                    "jax": jax.__version__, "jax_backend": jax.default_backend(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "devices": sorted({r["device"] for r in rows}),
                    "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                    "XLA_PYTHON_CLIENT_PREALLOCATE":
                        os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
                    "load_average": os.getloadavg()},
    }


# ----------------------------------------------------------------------------- the page

def describe(result: dict) -> Report:
    """The page of a results dict. Rows written before they recorded their device and
    numerics (the committed train.json) read "not recorded" there."""
    peak, rows, args, machine = (result["matmul_peak"], result["rows"], result["args"],
                                 result["machine"])
    ref = args.get("reference_peak_tflops")
    cpu_times = any("step_cpu_seconds" in r for r in rows)
    # Peak device memory where a device reports it (GPU); else the process's peak RSS.
    on_device = any(r["peak_device_mib"] for r in rows)
    memory_key, memory_label = ("peak_device_mib", "peak device memory (MiB)") if on_device \
        else ("peak_rss_mib", "peak RSS (MiB)")
    devices = machine.get("devices") or [f"{machine['jax_backend']}: {machine['processor']}"]
    precision = f"{peak['matmul_precision']}, " if "matmul_precision" in peak else ""
    header = ["framework", "compute dtype", "matmul precision", "tokens/s", "step (ms)",
              *(["step CPU time (ms)"] if cpu_times else []), "vs torch eager", "GFLOP/s",
              "MFU", *([f"MFU vs {ref:g} TFLOP/s"] if ref else []), "first step (s)",
              memory_label]
    table = []
    for r in rows:
        speed = f"{r['speedup_vs_torch_eager']:.2f}x" if r["speedup_vs_torch_eager"] else "-"
        table.append([
            r["framework"], r.get("compute_dtype", r["dtype"]),
            r.get("matmul_precision", "not recorded"), f"{r['tokens_per_s']:.0f}",
            f"{r['step_seconds'] * 1e3:.0f}",
            *([f"{r['step_cpu_seconds'] * 1e3:.0f}"] if cpu_times else []), speed,
            f"{r['achieved_flops_per_s'] / 1e9:.1f}", f"{r['mfu'] * 100:.1f}%",
            *([f"{r['mfu_vs_reference_peak'] * 100:.1f}%"] if ref else []),
            f"{r['first_step_seconds']:.1f}",
            f"{r[memory_key]:.0f}" if r[memory_key] else "-"])
    for name, err in result["errors"].items():
        table.append([name, args["dtype"], f"failed: {err[:80]}",
                      *["-"] * (len(header) - 3)])
    environment = ", ".join(f"{k}={machine[k]}" for k in ("XLA_FLAGS",
                                                          "XLA_PYTHON_CLIENT_PREALLOCATE")
                            if machine.get(k))
    return Report(
        title="Training step: throughput and MFU, JAX vs torch_reference",
        script="benchmarks/bench_train.py",
        notes=[f"Devices: {'; '.join(devices)}. Matmul peak ({peak['n']}^3, {peak['dtype']}, "
               f"{precision}JAX, median of {len(peak['runs'])}): "
               f"{peak['median_flops_per_s'] / 1e9:.1f} GFLOP/s. "
               f"Model FLOPs per training step: {result['flops']['train_step'] / 1e9:.1f} G."],
        tables=[Table(header, table, align="lll" + "r" * (len(header) - 3))],
        settings={k: v for k, v in args.items()
                  if k not in ("out", "render_only", "memory_probe")},
        device=(f"{'; '.join(devices)}; {machine['cpus']} CPUs ({machine['processor']}), "
                f"{machine['platform']}; torch threads {machine['torch_threads']}; load "
                "average (1, 5, 15 min) at the end "
                + " ".join(f"{x:.2f}" for x in machine["load_average"])
                + (f"; {environment}" if environment else "") + "."),
        versions={k: machine[k] for k in ("python", "jax", "torch")})


def main(argv=None):
    if report.render_only(argv, describe) is not None:
        return
    args = parse_args(argv)
    if args.memory_probe:
        print(json.dumps(memory_probe(args, args.memory_probe)))
        return

    import jax
    from flax import nnx

    from jax_transformer.model import Transformer
    from jax_transformer.pretrained import to_torch_state_dict

    train_steps.set_torch_options(args)
    config = train_steps.make_config(args)
    state_dict = to_torch_state_dict(Transformer(config, rngs=nnx.Rngs(0)))
    backend = jax.default_backend()
    args.matmul_size = args.matmul_size or runner.MatmulPeak.default_size(backend)
    args.out = args.out or str(default_results_path(backend))
    peak = runner.MatmulPeak(args.matmul_size, args.dtype)
    contenders, first, errors = first_steps(args, config, state_dict)
    timings = timed_rounds(args, contenders, peak)
    flags = sys.argv[1:] if argv is None else list(argv)
    memory = {} if args.no_memory else {name: run_memory_probe(flags, name)
                                        for name in contenders}
    result = make_result(args, config, contenders, first, errors, timings, memory)
    result["markdown"] = describe(result).figures()
    print(report.write_results(result, args.out, describe))


if __name__ == "__main__":
    main()
