"""x @ kernel for the Linear layers, with a backward pass laid out for fast CPU kernels.

The maths is the ordinary matmul and its ordinary gradients:
    y = x @ W,   dx = dy @ W^T,   dW = x^T @ dy   (rows of x flattened).
What changes is how dW is laid out on CPU. Left to itself, XLA folds x^T into
the dot's dimension numbers; XLA:CPU's fast matmul library (YNNPACK) does not
take a left operand contracted along its first axis, so every weight gradient
falls back to a slower Eigen kernel (about half the speed inside a training
step). Here x^T is materialised first (a copy of the activations, small next
to the matmul) behind an optimization barrier, so XLA cannot fold it back. On
other platforms the plain transposed dot is used: their matmul libraries take
transposed operands directly.
"""

from __future__ import annotations

import jax


@jax.custom_vjp
def matmul(x, kernel):  # (..., K) @ (K, N) -> (..., N)
    return x @ kernel


def _matmul_fwd(x, kernel):
    return x @ kernel, (x, kernel)


def _kernel_grad_cpu(x, dy):  # (M, K), (M, N) -> (K, N)
    return jax.lax.optimization_barrier(x.T) @ dy  # x^T copied row-major: (K, M) @ (M, N)


def _kernel_grad(x, dy):  # (M, K), (M, N) -> (K, N)
    return x.T @ dy


def _matmul_bwd(residuals, dy):
    x, kernel = residuals
    dx = (dy @ kernel.T).astype(x.dtype)  # (..., N) @ (N, K) -> (..., K)
    x_rows = x.reshape(-1, x.shape[-1])  # (M, K)
    dy_rows = dy.reshape(-1, dy.shape[-1])  # (M, N)
    d_kernel = jax.lax.platform_dependent(x_rows, dy_rows, cpu=_kernel_grad_cpu,
                                          default=_kernel_grad)
    return dx, d_kernel.astype(kernel.dtype)


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                out_sharding=None):
    """A drop-in `dot_general` for nnx.Linear (which contracts the last axis of its
    input with the first of its kernel) that routes that case through `matmul`."""
    (lhs_contract, rhs_contract), batch = dimension_numbers
    if (tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) == (0,)
            and batch == ((), ()) and rhs.ndim == 2 and precision is None
            and preferred_element_type is None and out_sharding is None):
        return matmul(lhs, rhs)
    return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                               preferred_element_type=preferred_element_type,
                               out_sharding=out_sharding)
