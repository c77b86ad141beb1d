"""How parity is measured: pinned float32 numerics, and the mixed-precision rule.

Used by the parity suite (parity_tests/conftest.py pins every test) and by
`jaxformer-parity`. Imports JAX and torch only when called.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

MIXED_FACTOR = 2.0  # each side's bfloat16 error within this factor of the other's


@contextlib.contextmanager
def pinned_numerics():
    """float32 means IEEE float32 on every device while this is active, as parity
    needs: JAX matmuls at "highest" precision (on GPUs and TPUs the default runs
    float32 matmuls as TF32 or bf16 passes), torch's TF32 off, torch's
    deterministic algorithms on, torch.nn.MultiheadAttention's fused inference
    path off. Previous settings come back on exit."""
    import jax
    import torch
    # cuBLAS reads this when CUDA starts; deterministic matmuls need it.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
             torch.are_deterministic_algorithms_enabled())
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    # torch.nn.MultiheadAttention's fused inference path: on CUDA its float32
    # logits were 1.2e-4 from float64 where the ordinary path's were 4e-6.
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with jax.default_matmul_precision("highest"):
            yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
        torch.use_deterministic_algorithms(saved[2])
        torch.backends.mha.set_fastpath_enabled(fastpath)


def relative_rms_error(x, reference) -> float:
    """||x - reference|| / ||reference||, in float64: a tensor's error level."""
    x, reference = np.asarray(x, np.float64), np.asarray(reference, np.float64)
    scale = np.sqrt(np.mean(reference ** 2)) if reference.size else 0.0
    error = np.sqrt(np.mean((x - reference) ** 2)) if reference.size else 0.0
    return float(error / scale) if scale > 0 else float(error)


def rounding_error(reference) -> float:
    """The relative RMS error of rounding `reference` once to bfloat16."""
    import ml_dtypes
    reference = np.asarray(reference, np.float64)
    return relative_rms_error(reference.astype(ml_dtypes.bfloat16), reference)


def mixed_precision_ok(jax_error: float, torch_error: float, rounding: float) -> bool:
    """Mixed-precision parity: each side's error (against float64) is within
    MIXED_FACTOR of the other's. An error under `rounding` (rounding_error of the
    float64 tensor) counts as it: a side that keeps a tensor in float32 is not
    asked of the other, which stores it in bfloat16."""
    a, b = max(jax_error, rounding), max(torch_error, rounding)
    return bool(np.isfinite(jax_error) and np.isfinite(torch_error)
                and a <= MIXED_FACTOR * b and b <= MIXED_FACTOR * a)
