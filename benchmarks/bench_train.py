"""Training-step throughput and MFU: the Flax model vs torch_reference (eager, torch.compile).

    python benchmarks/bench_train.py                       # base model, float32, 2 threads
    python benchmarks/bench_train.py --dtype bfloat16      # bf16 compute (f32 parameters)
    python benchmarks/bench_train.py --steps 3 --warmup 1 --d-model 64 --d-ff 128 --layers 2 \
        --out /tmp/quick.json                              # a quick smoke run
    python benchmarks/bench_train.py --frameworks jax jax_autodiff_grads torch_eager
                                      # also JAX with the plain Linear kernel (autodiff's
                                      # backward), the baseline for kernels/linear.py
    python benchmarks/bench_train.py --frameworks jax jax_rbg_dropout
                                      # also JAX with dropout masks from XLA's
                                      # RngBitGenerator (kernels/dropout.py)

Results go to benchmarks/results/train.json, or train_gpu.json when JAX runs on
a GPU. On a GPU both frameworks share it: JAX's preallocation of 75% of its
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
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Both frameworks share one GPU: JAX must not reserve 75% of it when it starts.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


# ----------------------------------------------------------------------------- FLOPs

def model_flops_per_step(c, batch_size: int, src_len: int, tgt_len: int) -> dict:
    d, f, S, T = c.d_model, c.d_ff, src_len, tgt_len
    per_src = c.num_encoder_layers * (8 * d * d + 4 * S * d + 4 * d * f) \
        + c.num_decoder_layers * 4 * d * d
    per_tgt = c.num_decoder_layers * (8 * d * d + 4 * T * d + 4 * d * d + 4 * S * d + 4 * d * f) \
        + 2 * d * c.tgt_vocab_size
    forward = batch_size * (S * per_src + T * per_tgt)
    return {"forward": forward, "train_step": 3 * forward,
            "forward_per_src_token": per_src, "forward_per_tgt_token": per_tgt}


def rss_mib() -> float:
    """Peak RSS of this process. VmHWM, not ru_maxrss: Linux carries ru_maxrss over
    fork + exec, so a subprocess would report its parent's peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def current_rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


# ----------------------------------------------------------------------------- set-up

def make_config(args):
    from transformer_core.config import TransformerConfig
    return TransformerConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab,
                             d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
                             num_encoder_layers=args.layers, num_decoder_layers=args.layers,
                             dropout=args.dropout, max_len=max(512, args.src_len, args.tgt_len))


def make_batches(args, config, count: int):
    rng = np.random.RandomState(0)
    batches = []
    for _ in range(count):
        src = rng.randint(4, config.src_vocab_size, (args.batch_size, args.src_len))
        tgt = rng.randint(4, config.tgt_vocab_size, (args.batch_size, args.tgt_len + 1))
        batches.append({"src": src.astype(np.int32), "tgt_in": tgt[:, :-1].astype(np.int32),
                        "tgt_out": tgt[:, 1:].astype(np.int32)})
    return batches


# Rows of JAX with some kernels switched (jax_transformer.kernels.override): what
# each kernel choice is worth, measured in the same run as the default "jax" row.
JAX_VARIANTS = {
    "jax": {},
    "jax_autodiff_grads": {"linear": "plain"},  # autodiff's Linear backward (kernels/linear.py)
    "jax_rbg_dropout": {"dropout_mask": "tuned"},  # masks from XLA's RngBitGenerator
}

# What a float32 matmul computes in, per backend and jax_default_matmul_precision
# (jax.lax.Precision's documentation); unlisted settings: the backend's default.
JAX_FLOAT32_MATMUL = {
    "cpu": {None: "float32"},
    "gpu": {None: "TF32 (NVIDIA Ampere and later; else float32)", "highest": "float32",
            "float32": "float32", "bfloat16": "bfloat16"},
    "tpu": {None: "1 bfloat16 pass", "high": "3 bfloat16 passes",
            "bfloat16_3x": "3 bfloat16 passes", "highest": "float32",
            "float32": "float32"},
}


def jax_numerics(dtype: str) -> dict:
    """The device, compute dtype and matmul precision JAX runs the step with."""
    import jax
    backend, device = jax.default_backend(), jax.devices()[0]
    setting = jax.config.jax_default_matmul_precision
    table = JAX_FLOAT32_MATMUL.get(backend, {})
    float32_matmul = table.get(setting, table.get(None, "unknown"))
    matmuls = "bfloat16 operands, float32 accumulation" if dtype == "bfloat16" \
        else float32_matmul
    return {"device": f"{backend}: {_cpu_name() if backend == 'cpu' else device.device_kind}",
            "compute_dtype": dtype,
            "matmul_precision": f"{matmuls} (jax_default_matmul_precision="
                                f"{setting or 'default'})"}


class JaxRunner:
    """The Flax model's training step, with the kernel overrides of JAX_VARIANTS[name]
    (e.g. "jax_autodiff_grads": the plain Linear kernel, whose backward is JAX
    autodiff's in XLA's default layout; measures what the tuned Linear buys)."""

    def __init__(self, args, config, state_dict, name: str = "jax"):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from jax_transformer import kernels
        from jax_transformer.model import Transformer
        from jax_transformer.pretrained import load_torch_state_dict
        from jax_transformer.train import step as training

        self.jax = jax
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        model = Transformer(config, rngs=nnx.Rngs(0), dtype=dtype)
        if state_dict is not None:
            load_torch_state_dict(model, state_dict)
        optimizer = training.make_optimizer(
            training.paper_schedule(config.d_model, args.warmup_steps), args.clip_norm)
        self.trainer = training.Trainer(model, optimizer, args.label_smoothing)
        self.state = self.trainer.initial_state
        self.name = name
        # jit traces on the first step, so overriding during steps is overriding the trace.
        self.trace_context = lambda: kernels.override(**JAX_VARIANTS[name])
        self.numerics = jax_numerics(args.dtype)

    def prepare(self, batch):
        return self.trainer.shard_batch(batch)

    def peak_memory_mib(self):
        stats = self.jax.devices()[0].memory_stats()  # None on CPU
        return stats["peak_bytes_in_use"] / 2 ** 20 if stats and "peak_bytes_in_use" in stats \
            else None

    def step(self, batch) -> float:
        with self.trace_context():
            start = time.perf_counter()
            self.state, metrics = self.trainer.train_step(self.state, batch)
            loss = float(metrics["loss"])  # waits for the step
            return time.perf_counter() - start, loss


class TorchRunner:
    def __init__(self, args, config, state_dict, compiled: bool):
        import torch

        import torch_reference
        from torch_reference import training

        self.torch, self.training = torch, training
        self.name = "torch_compile" if compiled else "torch_eager"
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = torch_reference.Transformer(config).train()
        if state_dict is not None:
            self.model.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()})
        self.model.to(self.device)
        self.optimizer, self.scheduler = training.make_optimizer(
            self.model, training.paper_schedule(config.d_model, args.warmup_steps))
        self.forward_model = torch.compile(self.model) if compiled else self.model
        self.autocast = args.dtype == "bfloat16"
        self.args = args
        self.numerics = self.describe_numerics()

    def describe_numerics(self) -> dict:
        """The device, compute dtype and matmul precision the step runs with."""
        torch = self.torch
        device = torch.cuda.get_device_name() if self.device == "cuda" else _cpu_name()
        float32_matmuls = ("TF32" if torch.backends.cuda.matmul.allow_tf32 else "float32") \
            if self.device == "cuda" else "float32"
        settings = (f"allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                    f"float32_matmul_precision={torch.get_float32_matmul_precision()}")
        if self.autocast:
            return {"device": f"{self.device}: {device}",
                    "compute_dtype": "bfloat16 (torch.autocast; float32 parameters)",
                    "matmul_precision": f"bfloat16 under autocast; float32 matmuls: "
                                        f"{float32_matmuls} ({settings})"}
        return {"device": f"{self.device}: {device}", "compute_dtype": "float32",
                "matmul_precision": f"{float32_matmuls} ({settings})"}

    def prepare(self, batch):
        return {k: self.torch.from_numpy(v.astype(np.int64)).to(self.device)
                for k, v in batch.items()}

    def step(self, batch):
        torch = self.torch
        start = time.perf_counter()
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast):
            # torch.compile's module forwards .config and .parameters() to the original.
            metrics = self.training.train_step(self.forward_model, self.optimizer, self.scheduler, [batch],
                                               self.args.label_smoothing, self.args.clip_norm)
        loss = float(metrics["loss"])  # waits for the step (GPU too)
        return time.perf_counter() - start, loss

    def peak_memory_mib(self):
        if self.device == "cuda":
            return self.torch.cuda.max_memory_allocated() / 2 ** 20
        return None


def make_runner(name, args, config, state_dict):
    if name in JAX_VARIANTS:
        return JaxRunner(args, config, state_dict, name)
    return TorchRunner(args, config, state_dict, compiled=(name == "torch_compile"))


class MatmulPeak:
    """A jit'd N x N @ N x N matmul in JAX: 2 N^3 FLOPs per call."""

    def __init__(self, n: int, dtype: str):
        import jax
        import jax.numpy as jnp
        self.jax, self.n = jax, n
        key_a, key_b = jax.random.split(jax.random.key(0))
        dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        self.a = jax.random.normal(key_a, (n, n), dt)
        self.b = jax.random.normal(key_b, (n, n), dt)
        self.matmul = jax.jit(lambda a, b: a @ b)
        self.matmul(self.a, self.b).block_until_ready()

    def measure(self, repeats: int = 3) -> float:
        """FLOP/s of the fastest of `repeats` calls (a peak, not an average)."""
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            self.matmul(self.a, self.b).block_until_ready()
            best = min(best, time.perf_counter() - start)
        return 2 * self.n ** 3 / best


def set_torch_options(args):
    import torch
    torch.set_num_threads(args.threads)
    if args.torch_tf32:
        torch.set_float32_matmul_precision("high")  # TF32 for float32 matmuls on CUDA


# ----------------------------------------------------------------------------- memory probe

def memory_probe(args, framework: str) -> dict:
    """Run in a fresh subprocess: peak RSS (and device memory, on a GPU) of one
    framework's training steps."""
    import jax  # noqa: F401  (both frameworks' libraries are imported in both probes)
    import torch  # noqa: F401
    set_torch_options(args)
    base = current_rss_mib()
    config = make_config(args)
    runner = make_runner(framework, args, config, None)
    batches = [runner.prepare(b) for b in make_batches(args, config, 3)]
    for i in range(1 + args.warmup):
        runner.step(batches[i % len(batches)])
    return {"peak_rss_mib": rss_mib(), "base_rss_mib": base,
            "peak_device_mib": runner.peak_memory_mib()}


def run_memory_probe(args, framework: str) -> dict:
    cmd = [sys.executable, __file__, "--memory-probe", framework, *sys.argv[1:]]
    # strip any --out so the probe never writes results
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=1800)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # report, don't fail the benchmark
        return {"error": f"{type(e).__name__}: {getattr(e, 'stderr', '') or e}"[-500:]}


# ----------------------------------------------------------------------------- main

FRAMEWORKS = [*JAX_VARIANTS, "torch_eager", "torch_compile"]


def default_results_path(backend: str) -> Path:
    return Path(__file__).parent / "results" / ("train_gpu.json" if backend == "gpu"
                                                else "train.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=8000, help="shared vocabulary size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--src-len", type=int, default=32)
    p.add_argument("--tgt-len", type=int, default=32)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=None)
    p.add_argument("--warmup-steps", type=int, default=4000, help="learning-rate warm-up")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="compute dtype (parameters and optimizer stay float32); torch "
                        "uses autocast")
    p.add_argument("--frameworks", nargs="+", default=["jax", "torch_eager", "torch_compile"],
                   choices=FRAMEWORKS,
                   help="jax_autodiff_grads: JAX with autodiff's own Linear backward (the "
                        "baseline for jax_transformer/kernels/linear.py); jax_rbg_dropout: "
                        "JAX with dropout masks from XLA's RngBitGenerator "
                        "(jax_transformer/kernels/dropout.py)")
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
    p.add_argument("--memory-probe", choices=FRAMEWORKS,
                   help=argparse.SUPPRESS)
    p.add_argument("--out", default=None,
                   help="JSON results (default benchmarks/results/train.json, or "
                        "train_gpu.json when JAX runs on a GPU)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.memory_probe:
        print(json.dumps(memory_probe(args, args.memory_probe)))
        return

    import jax
    import torch

    from jax_transformer.model import Transformer
    from jax_transformer.pretrained import to_torch_state_dict
    from flax import nnx

    set_torch_options(args)
    config = make_config(args)
    flops = model_flops_per_step(config, args.batch_size, args.src_len, args.tgt_len)
    state_dict = to_torch_state_dict(Transformer(config, rngs=nnx.Rngs(0)))
    host_batches = make_batches(args, config, 4)
    on_gpu = jax.default_backend() == "gpu"
    if args.matmul_size is None:
        args.matmul_size = 8192 if on_gpu else 2048
    if args.out is None:
        args.out = str(default_results_path(jax.default_backend()))
    peak = MatmulPeak(args.matmul_size, args.dtype)

    runners, first, errors = {}, {}, {}
    for name in args.frameworks:
        try:
            runner = make_runner(name, args, config, state_dict)
            batches = [runner.prepare(b) for b in host_batches]
            first[name] = runner.step(batches[0])[0]
            runners[name] = (runner, batches)
        except Exception as e:  # e.g. torch.compile without a working compiler
            errors[name] = f"{type(e).__name__}: {e}"[:500]
            print(f"{name}: failed: {errors[name]}", file=sys.stderr, flush=True)
        print(f"{name}: first step {first.get(name, float('nan')):.2f}s", file=sys.stderr,
              flush=True)
    # Warm-up rounds alternate like the timed ones and come after every first step,
    # so that work a compiler leaves running (torch.compile's worker processes) is
    # over before timing starts.
    for i in range(args.warmup):
        for name, (runner, batches) in runners.items():
            runner.step(batches[(i + 1) % len(batches)])

    times = {name: [] for name in runners}
    cpu_times = {name: [] for name in runners}
    losses = {name: [] for name in runners}
    peaks = []
    for i in range(args.steps):
        peaks.append(peak.measure())
        for name, (runner, batches) in runners.items():
            time.sleep(args.pause)  # let the other framework's worker threads go idle
            cpu_start = time.process_time()
            seconds, loss = runner.step(batches[i % len(batches)])
            cpu_times[name].append(time.process_time() - cpu_start)
            times[name].append(seconds)
            losses[name].append(loss)
        print(f"round {i}: " + "  ".join(f"{n} {t[-1]:.3f}s" for n, t in times.items())
              + f"  matmul {peaks[-1] / 1e9:.0f} GFLOP/s", file=sys.stderr, flush=True)
    peak_flops = statistics.median(peaks)

    memory = {}
    if not args.no_memory:
        for name in runners:
            memory[name] = run_memory_probe(args, name)

    rows = []
    for name in runners:
        seconds = statistics.median(times[name])
        achieved = flops["train_step"] / seconds
        rows.append({
            "framework": name, "dtype": args.dtype, **runners[name][0].numerics,
            "step_seconds": seconds, "tokens_per_s": args.batch_size * args.tgt_len / seconds,
            "model_flops_per_step": flops["train_step"], "achieved_flops_per_s": achieved,
            "mfu": achieved / peak_flops, "first_step_seconds": first[name],
            "peak_rss_mib": memory.get(name, {}).get("peak_rss_mib"),
            "peak_device_mib": memory.get(name, {}).get("peak_device_mib"),
            "mfu_vs_reference_peak": (achieved / (args.reference_peak_tflops * 1e12)
                                      if args.reference_peak_tflops else None),
            "base_rss_mib": memory.get(name, {}).get("base_rss_mib"),
            "step_times": times[name], "losses": losses[name],
            # this process's CPU time per step (all its threads): on a shared CPU
            # machine, less disturbed by other processes than the wall clock
            "step_cpu_seconds": statistics.median(cpu_times[name]),
            "step_cpu_times": cpu_times[name],
        })
    eager = next((r for r in rows if r["framework"] == "torch_eager"), None)
    for r in rows:
        r["speedup_vs_torch_eager"] = eager and eager["step_seconds"] / r["step_seconds"]

    result = {
        "config": {k: getattr(config, k) for k in ("d_model", "num_heads", "d_ff",
                                                   "num_encoder_layers", "num_decoder_layers",
                                                   "src_vocab_size", "dropout")},
        "batch": {"batch_size": args.batch_size, "src_len": args.src_len,
                  "tgt_len": args.tgt_len},
        "args": vars(args),
        "flops": flops,
        "matmul_peak": {"n": args.matmul_size, "dtype": args.dtype,
                        "matmul_precision": jax_numerics(args.dtype)["matmul_precision"],
                        "median_flops_per_s": peak_flops, "runs": peaks},
        "rows": rows, "errors": errors, "memory_probes": memory,
        "machine": {"platform": platform.platform(), "processor": _cpu_name(),
                    "cpus": os.cpu_count(), "python": platform.python_version(),
                    "jax": jax.__version__, "jax_backend": jax.default_backend(),
                    "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "devices": sorted({r["device"] for r in rows}),
                    "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                    "XLA_PYTHON_CLIENT_PREALLOCATE":
                        os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
                    "load_average": os.getloadavg()},
    }
    table = markdown_table(result)
    print(table)
    result["markdown"] = table
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def markdown_table(result) -> str:
    peak, rows = result["matmul_peak"], result["rows"]
    ref = result["args"].get("reference_peak_tflops")
    # Peak device memory where a device reports it (GPU); else the process's peak RSS.
    on_device = any(r["peak_device_mib"] for r in rows)
    memory_key, memory_label = ("peak_device_mib", "peak device memory (MiB)") if on_device \
        else ("peak_rss_mib", "peak RSS (MiB)")
    lines = [
        f"Devices: {'; '.join(result['machine']['devices'])}. Matmul peak ({peak['n']}^3, "
        f"{peak['dtype']}, {peak['matmul_precision']}, JAX, median of {len(peak['runs'])}): "
        f"{peak['median_flops_per_s'] / 1e9:.1f} GFLOP/s. "
        f"Model FLOPs per training step: {result['flops']['train_step'] / 1e9:.1f} G.",
        "",
        "| framework | compute dtype | matmul precision | tokens/s | step (ms) | vs torch eager "
        f"| GFLOP/s | MFU |{f' MFU vs {ref:g} TFLOP/s |' if ref else ''} first step (s) "
        f"| {memory_label} |",
        "|---|---|---|---:|---:|---:|---:|---:|" + ("---:|" if ref else "") + "---:|---:|",
    ]
    for r in rows:
        speed = f"{r['speedup_vs_torch_eager']:.2f}x" if r["speedup_vs_torch_eager"] else "-"
        memory = f"{r[memory_key]:.0f}" if r[memory_key] else "-"
        vs_ref = f" {r['mfu_vs_reference_peak'] * 100:.1f}% |" if ref else ""
        lines.append(
            f"| {r['framework']} | {r['compute_dtype']} | {r['matmul_precision']} "
            f"| {r['tokens_per_s']:.0f} | {r['step_seconds'] * 1e3:.0f} | {speed} "
            f"| {r['achieved_flops_per_s'] / 1e9:.1f} | {r['mfu'] * 100:.1f}% |{vs_ref} "
            f"{r['first_step_seconds']:.1f} | {memory} |")
    for name, err in result["errors"].items():
        lines.append(f"| {name} | {result['args']['dtype']} | failed: {err[:80]} |")
    return "\n".join(lines)

if __name__ == "__main__":
    main()
