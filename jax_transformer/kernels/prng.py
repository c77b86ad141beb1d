"""Dropout's random bits on CPU: threefry with its rounds unrolled.

On CPU, JAX lowers threefry's 5 round groups as a rolled while loop (smaller
programs), so XLA cannot fuse across rounds and streams each (B, L, D) counter
array through memory per round: about 15% of a base-model training step here.
Registering the unrolled lowering that JAX uses on GPU/TPU gives bit-identical
random numbers (the same hash, computed in one fusion). It is registered once,
for the CPU platform only, when jax_transformer.kernels is imported. Private
JAX API: if it moves, the default lowering stays.
"""

from __future__ import annotations


def unroll_threefry_on_cpu() -> bool:
    """Register the unrolled threefry lowering for CPU; False if JAX's internals moved."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32
        mlir.register_lowering(threefry2x32.threefry2x32_p,
                               threefry2x32._threefry2x32_lowering_rule, platform="cpu")
    except (ImportError, AttributeError):  # pragma: no cover
        return False
    return True
