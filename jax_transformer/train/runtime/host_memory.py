"""Keep the host memory XLA frees between steps, instead of handing it back to the kernel.

XLA:CPU allocates a step's buffers when it runs it and frees them at its end.
glibc's malloc hands large blocks straight back to the kernel: blocks over
its mmap threshold (at most 32 MB), every block too large for a thread's own
arena (XLA's threads allocate there), and the heap's free top. The next step
faults the same memory in again, page by page, each page zeroed by the kernel:
kernel time in every step that keeping the memory saves (docs/performance.md,
"Host memory").

    keep_freed_memory()   before JAX starts its threads: glibc keeps what is freed

It sets, through mallopt, what GLIBC_TUNABLES would name glibc.malloc.arena_max=1
(every thread allocates from the main heap), mmap_max=0 (no block mapped on its
own) and a 2 GiB trim_threshold (the heap's free top kept). The process's
resident memory then stays at its peak instead of shrinking between steps, and
the one heap's holes raise that peak.
It does nothing where the C library is not glibc, where GLIBC_TUNABLES already
sets malloc, with JAX_TRANSFORMER_KEEP_FREED_MEMORY=0, or where JAX will run on an
accelerator (JAX_PLATFORMS names one first, or, unset, a plugin for one is
installed): a GPU's or TPU's step buffers are device memory, and the one heap
slows every thread that allocates at once, as XLA's compiles do (docs/performance.md
has the figures).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import pkgutil
import platform
from typing import Mapping

ENVIRONMENT_VARIABLE = "JAX_TRANSFORMER_KEEP_FREED_MEMORY"
# mallopt's parameter numbers (glibc's malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
SETTINGS = {M_ARENA_MAX: 1, M_MMAP_MAX: 0, M_TRIM_THRESHOLD: 2 ** 31 - 1}


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to set glibc's malloc: glibc, JAX on the CPU, and nobody chose otherwise."""
    return (platform.libc_ver()[0] == "glibc"
            and environ.get(ENVIRONMENT_VARIABLE, "1") != "0"
            and "glibc.malloc." not in environ.get("GLIBC_TUNABLES", "")
            and not accelerator_expected(environ))


def accelerator_expected(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether JAX will run on an accelerator, told before it starts: the first of
    JAX_PLATFORMS, or without it, an accelerator's plugin installed where JAX looks
    for one (CUDA's and ROCm's: a jax_plugins entry point or a module of the
    jax_plugins namespace package; TPUs': libtpu)."""
    platforms = environ.get("JAX_PLATFORMS", "").split(",")[0].strip()
    if platforms:
        return platforms != "cpu"
    namespace = importlib.util.find_spec("jax_plugins")
    return (bool(importlib.metadata.entry_points(group="jax_plugins"))
            or (namespace is not None
                and any(pkgutil.iter_modules(namespace.submodule_search_locations)))
            or importlib.util.find_spec("libtpu") is not None)


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory (see the module's docstring); whether it
    did. Threads that already have an arena of their own keep it: call this before
    JAX starts its backends (their threads run the steps)."""
    if not wanted():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    return all(mallopt(parameter, value) == 1 for parameter, value in SETTINGS.items())
