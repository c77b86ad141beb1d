"""Compile once: JAX's persistent compilation cache, ahead-of-time compiles, and counts.

    use_compilation_cache(dir)   compiled programs are kept in `dir`; a repeated or
                                 resumed run loads them instead of compiling
    compile_ahead(jobs, log)     compiles every (name, jitted, args) before training,
                                 several at a time, one progress line each
    CompileCounter               programs XLA compiled and seconds; persistent-cache hits

The counts come from jax.monitoring's events, so they cover every program of the
process (train and eval steps, decoding, small eager ops).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import jax
from jax import monitoring

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # XLA compiled a program
TRACE, LOWER = "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"
DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"),
                         "jax_transformer", "xla")


def use_compilation_cache(directory: str | os.PathLike | None) -> None:
    """Keep every compiled program (however quick to compile) in `directory`, or
    turn JAX's persistent cache off with None."""
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return
    Path(directory).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileCounter:
    """Totals of compile events since the process started; `since(snapshot)` gives
    the part after an earlier `snapshot()`. A program JAX found in the persistent
    cache counts as a cache hit (and its load time), not as compiled."""

    _lock = threading.Lock()
    _thread = threading.local()  # a cache hit is reported just before its compile event
    _totals = {"programs": 0, "compile_seconds": 0.0, "cache_hits": 0,
               "cache_load_seconds": 0.0, "trace_lower_seconds": 0.0}
    _listening = False

    @classmethod
    def start(cls) -> None:
        with cls._lock:
            if cls._listening:
                return
            cls._listening = True
        monitoring.register_event_duration_secs_listener(cls._on_duration)
        monitoring.register_event_listener(cls._on_event)

    @classmethod
    def _on_event(cls, event: str, **_) -> None:
        if event == CACHE_HIT:
            cls._thread.hit = True

    @classmethod
    def _on_duration(cls, event: str, seconds: float, **_) -> None:
        with cls._lock:
            if event == BACKEND_COMPILE and getattr(cls._thread, "hit", False):
                cls._thread.hit = False
                cls._totals["cache_hits"] += 1
                cls._totals["cache_load_seconds"] += seconds
            elif event == BACKEND_COMPILE:
                cls._totals["programs"] += 1
                cls._totals["compile_seconds"] += seconds
            elif event in (TRACE, LOWER):
                cls._totals["trace_lower_seconds"] += seconds

    @classmethod
    def snapshot(cls) -> dict:
        with cls._lock:
            return dict(cls._totals)

    @classmethod
    def since(cls, snapshot: dict) -> dict:
        now = cls.snapshot()
        return {k: round(now[k] - snapshot[k], 2) if isinstance(now[k], float)
                else now[k] - snapshot[k] for k in now}


def compile_ahead(jobs: Sequence[tuple[str, Callable, tuple]], log: Callable[[str], None],
                  workers: int = 2) -> float:
    """Trace and compile each (name, jitted function, example args) before it is first
    called; XLA compiles `workers` programs at a time (tracing stays serial). The
    programs land in jit's caches (and the persistent cache), so the first real call
    runs at once. Returns the wall seconds."""
    started = time.time()
    done = 0

    def compile_one(name: str, lowered) -> None:
        nonlocal done
        job_started = time.time()
        lowered.compile()
        done += 1
        log(f"compiled {name} in {time.time() - job_started:.1f} s [{done}/{len(jobs)}]")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(compile_one, name, jitted.lower(*args))
                   for name, jitted, args in jobs]
        for future in futures:
            future.result()
    return time.time() - started
