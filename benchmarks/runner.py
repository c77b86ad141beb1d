"""What the benchmark scripts share while they measure: common flags, the machine
they run on, timing, a matmul peak, peak memory.

Framework imports (jax) stay inside the functions that need them, so that a script
can render its markdown from a results file without loading a framework.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import resource
import time
from typing import Any, Callable

# ----------------------------------------------------------------------------- flags

def add_model_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The model's size flags, defaulting to the paper's base model."""
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    parser.add_argument("--dropout", type=float, default=0.1)


# ----------------------------------------------------------------------------- the machine

def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def host() -> dict:
    """The operating system, CPU model and core count."""
    return {"platform": platform.platform(), "processor": cpu_name(), "cpus": os.cpu_count()}


def machine_line(machine: dict) -> str:
    """A results page's device line from a run's "machine" record."""
    return (f"{', '.join(machine['jax_devices'])}; {machine['cpus']} CPUs"
            + (f" ({machine['processor']})" if "processor" in machine else "")
            + f", {machine['platform']}.")


def versions(*packages: str) -> dict[str, str]:
    """Installed versions of `packages`, as their distributions report them."""
    return {name: importlib.metadata.version(name) for name in packages}


# ----------------------------------------------------------------------------- timing

def timed(call: Callable[..., Any], *args) -> tuple[float, Any]:
    """(wall seconds, result) of `call(*args)`; the call must wait for its own work."""
    start = time.perf_counter()
    result = call(*args)
    return time.perf_counter() - start, result


def alternate(calls: dict[str, Callable[[int], Any]], rounds: int,
              after_round: Callable[[int, dict[str, list]], None] | None = None
              ) -> dict[str, list]:
    """Round i calls each of `calls` with i, in order, so that the contenders share the
    machine's state (clocks, caches, other jobs) alike; returns each one's results in
    round order. `after_round(i, results so far)` may report progress."""
    results: dict[str, list] = {name: [] for name in calls}
    for i in range(rounds):
        for name, call in calls.items():
            results[name].append(call(i))
        if after_round:
            after_round(i, results)
    return results


class MatmulPeak:
    """A jit'd N x N @ N x N matmul in JAX, 2 N^3 FLOPs per call: the FLOP/s that MFU
    is measured against, taken in the same run as the model's steps."""

    @staticmethod
    def default_size(backend: str) -> int:
        """N that reaches the device's peak: 2048 on a CPU; a GPU needs 8192 (an H200's
        bf16 matmul measured 168 TFLOP/s at 2048, 509 at 4096, 681 at 8192)."""
        return 8192 if backend == "gpu" else 2048

    def __init__(self, n: int, dtype: str):
        import jax
        import jax.numpy as jnp
        self.n = n
        key_a, key_b = jax.random.split(jax.random.key(0))
        dt = jnp.bfloat16 if dtype == "bfloat16" else jnp.float32
        self.a = jax.random.normal(key_a, (n, n), dt)
        self.b = jax.random.normal(key_b, (n, n), dt)
        self.matmul = jax.jit(lambda a, b: a @ b)
        self.matmul(self.a, self.b).block_until_ready()

    def measure(self, repeats: int = 3) -> float:
        """FLOP/s of the fastest of `repeats` calls (a peak, not an average)."""
        best = min(timed(lambda: self.matmul(self.a, self.b).block_until_ready())[0]
                   for _ in range(repeats))
        return 2 * self.n ** 3 / best


# ----------------------------------------------------------------------------- memory

def peak_rss_mib() -> float:
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


def peak_rss_bytes(who: int) -> int:
    """Peak RSS of this process (RUSAGE_SELF) or of its waited-for children
    (RUSAGE_CHILDREN)."""
    return resource.getrusage(who).ru_maxrss * 1024  # Linux reports KiB


def jax_peak_device_mib() -> float | None:
    """The JAX allocator's peak bytes in use on the first device; None where the device
    does not report it (CPU)."""
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2 ** 20 if "peak_bytes_in_use" in stats else None
