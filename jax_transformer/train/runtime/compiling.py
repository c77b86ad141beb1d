"""Compile once: JAX's persistent compilation cache, ahead-of-time compiles, and counts.

    use_compilation_cache(dir)   compiled programs are kept in `dir`; a repeated or
                                 resumed run loads them instead of compiling; its
                                 faults are one warning line at most (CacheWarnings)
    compile_ahead(jobs, log)     compiles every (name, jitted, args) before training,
                                 several at a time, one progress line each
    CompileCounter               programs XLA compiled and seconds; persistent-cache hits

The counts come from jax.monitoring's events, so they cover every program of the
process (train and eval steps, decoding, small eager ops).
"""

from __future__ import annotations

import concurrent.futures
import glob
import math
import os
import re
import sys
import tempfile
import threading
import time
import warnings
import zlib
from pathlib import Path
from typing import Callable, Sequence

import jax
from jax import monitoring

from transformer_core.errors import TrainError

BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"  # XLA compiled a program
TRACE, LOWER = "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"


def use_compilation_cache(directory: str | os.PathLike | None,
                          warn: Callable[[str], None] | None = None,
                          default: str | os.PathLike | None = None) -> Path | None:
    """Keep every compiled program (however quick to compile) in `directory`, or
    turn JAX's persistent cache off with None; returns the directory used, or None. A
    --compile-cache that cannot be made is a TrainError naming the flag; the flag's
    `default` (under HOME, XDG_CACHE_HOME or JAX_COMPILATION_CACHE_DIR, which the user may
    not have chosen) that cannot is no cache, said in one line through `warn`; one that cannot be
    written is used read-only (its programs load, new ones are not kept), said in one
    line."""
    if directory is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    directory = Path(directory)
    problem = ("is a file, not a directory" if directory.exists() and not directory.is_dir()
               else _cannot_make(directory))
    if problem is not None and default is not None and directory == Path(default):
        (warn or _say)(f"warning: the compilation cache {directory} (the default, under "
                       f"{default_cache_source()}) {problem}: every program is compiled afresh "
                       "and none is kept (--compile-cache DIR chooses another directory, "
                       "--no-compile-cache turns the cache off)")
        return use_compilation_cache(None)
    if problem is not None:
        raise TrainError(f"--compile-cache {directory} {problem}; choose another directory "
                         "or --no-compile-cache")
    writable = _can_write(directory)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # JAX keeps programs that took this long to compile: all of them, or (read-only) none.
    jax.config.update("jax_persistent_cache_min_compile_time_secs",
                      0.0 if writable is None else math.inf)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    reporter = CacheWarnings.install(directory, warn)
    if writable is not None:
        reporter.report(f"warning: --compile-cache {directory} is not writable ({writable}): "
                        "programs found there are loaded, new ones are compiled and not kept")
    return directory


def _cannot_make(directory: Path) -> str | None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"cannot be created ({e.strerror})"
    return None


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def default_cache_source() -> str:
    """The variable the default compilation cache's directory comes from."""
    return next(name for name in ("JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME", "HOME")
                if os.environ.get(name) or name == "HOME")


def _can_write(directory: Path) -> str | None:
    """None when a file can be made in `directory`, else why not."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


class CacheWarnings:
    """JAX warns once per program when its persistent cache cannot be read or written:
    ~150 warnings for a run on a read-only cache, and the same warning in every run for
    a damaged entry, which JAX never overwrites (it writes a key only when absent). Here
    they become one line per run at most, and a damaged entry is removed when JAX meets
    it, so that the program JAX then compiles is kept in its place."""

    PREFIXES = ("Error reading persistent compilation cache entry",
                "Error writing persistent compilation cache entry")
    _installed: "CacheWarnings | None" = None

    def __init__(self, directory: Path, warn: Callable[[str], None] | None):
        self.directory, self.reported = directory, False
        self.warn = warn or (lambda line: print(line, file=sys.stderr))
        self.lock = threading.Lock()

    @classmethod
    def install(cls, directory: Path, warn: Callable[[str], None] | None) -> "CacheWarnings":
        """Route JAX's cache warnings to a reporter for `directory` (the latest one
        installed; one hook on warnings.showwarning for the process)."""
        if cls._installed is None:
            show = warnings.showwarning

            def showwarning(message, category, filename, lineno, file=None, line=None):
                reporter = cls._installed
                if not (reporter and str(message).startswith(cls.PREFIXES)):
                    return show(message, category, filename, lineno, file, line)
                reporter.handle(str(message))

            warnings.showwarning = showwarning
        cls._installed = cls(directory, warn)
        return cls._installed

    def report(self, line: str) -> None:
        """Say `line`, unless this run already said one."""
        with self.lock:
            if not self.reported:
                self.reported = True
                self.warn(line)

    def handle(self, message: str) -> None:
        reason = message.split(": ", 1)[-1]
        found = re.search(r"entry for '([^']+)'", message)
        if not (message.startswith(self.PREFIXES[0]) and found):
            self.report(f"warning: --compile-cache {self.directory} cannot be written "
                        f"({reason}): compiled programs are not kept")
            return
        removed = self.remove_damaged(found.group(1))
        self.report(f"warning: --compile-cache {self.directory}: "
                    + (f"removed {removed} damaged entr{'y' if removed == 1 else 'ies'} for "
                       f"{found.group(1)} ({reason}); this run compiles it and keeps it afresh"
                       if removed else f"cannot read the entry for {found.group(1)} ({reason}); "
                       "it is compiled afresh"))

    def remove_damaged(self, module: str) -> int:
        """Remove `module`'s entries that do not decompress (JAX names each entry
        '<module>-<hash>-cache' and compresses it with zstandard or zlib); how many."""
        removed = 0
        with self.lock:
            for path in self.directory.glob(f"{glob.escape(module)}-*-cache"):
                try:
                    if not _decompresses(path.read_bytes()):
                        path.unlink()
                        removed += 1
                except OSError:
                    pass  # gone, or not ours to remove: JAX compiles the program anyway
        return removed


def _decompresses(data: bytes) -> bool:
    """Whether `data` is a whole stream of one of the compressions JAX writes its
    entries with: zstandard (Python's compression.zstd or the zstandard package), zlib."""
    decompressors = [zlib.decompress]
    try:
        from compression import zstd  # Python 3.14+
        decompressors.append(zstd.decompress)
    except ImportError:
        pass
    try:
        import zstandard
        decompressors.append(zstandard.ZstdDecompressor().decompress)
    except ImportError:
        pass
    for decompress in decompressors:
        try:
            decompress(data)
            return True
        except Exception:  # zlib.error, ZstdError: each library its own
            continue
    return False


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
    called: the programs are traced and lowered here, in order (Python work, which
    threads would only interleave), and each goes to XLA as soon as it is lowered, so
    the first compiles while the next is traced; XLA compiles `workers` of them at a
    time. The programs land in jit's caches (and the persistent cache), so the first
    real call runs at once. Returns the wall seconds."""
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
