"""The one switch that picks each kernel's implementation: "plain" or "tuned".

    KERNELS_BY_BACKEND     the default per JAX backend (jax.default_backend())
    KERNEL_EXCEPTIONS      a kernel whose default differs from it, per backend
    JAX_TRANSFORMER_KERNELS=plain|tuned   environment variable: one choice for every kernel
    with override(linear="plain"): ...    one kernel, for a block of code (tests, benchmarks)

The choice is read when a function is traced, so it holds for what jit compiles
inside it; an already-compiled step keeps the kernels it was traced with.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Callable

import jax

IMPLEMENTATIONS = ("plain", "tuned")
ENVIRONMENT_VARIABLE = "JAX_TRANSFORMER_KERNELS"
# The tuned kernels are made for XLA:CPU (docs/performance.md). On GPU and TPU they
# compute the same values; linear.py's weight-gradient layout is CPU-only.
KERNELS_BY_BACKEND = {"cpu": "tuned", "gpu": "tuned", "tpu": "tuned"}
# dropout_mask's tuned generator (a counter hash) draws other masks than nnx's threefry;
# it is faster on XLA:CPU and on GPUs (docs/performance.md, "Dropout masks from a
# counter hash"). On TPU threefry stays until the hash is shown faster there.
KERNEL_EXCEPTIONS = {"dropout_mask": {"tpu": "plain"}}

_overrides: dict[str, str] = {}


def chosen(kernel: str) -> str:
    """The implementation `kernel` uses if traced now."""
    backend = jax.default_backend()
    name = (_overrides.get(kernel) or os.environ.get(ENVIRONMENT_VARIABLE)
            or KERNEL_EXCEPTIONS.get(kernel, {}).get(backend)
            or KERNELS_BY_BACKEND.get(backend, "plain"))
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={name!r}: expected one of {IMPLEMENTATIONS}")
    return name


@contextlib.contextmanager
def override(**choices: str):
    """Use the given implementation for the named kernels inside the block."""
    for kernel, name in choices.items():
        if name not in IMPLEMENTATIONS:
            raise ValueError(f"{kernel}={name!r}: expected one of {IMPLEMENTATIONS}")
    saved = dict(_overrides)
    _overrides.update(choices)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def kernel(name: str, *, plain: Callable, tuned: Callable) -> Callable:
    """The function the model calls: `plain` or `tuned`, as the switch says."""
    @functools.wraps(plain)
    def call(*args, **kwargs):
        return (tuned if chosen(name) == "tuned" else plain)(*args, **kwargs)
    call.plain, call.tuned = plain, tuned
    return call
