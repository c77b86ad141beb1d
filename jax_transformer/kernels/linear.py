"""Linear layers: x @ W + b, with a backward pass laid out for fast CPU kernels.

The maths is the ordinary affine map and its ordinary gradients:
    y = x @ W + b,   dx = dy @ W^T,   dW = x^T @ dy,   db = sum of dy's rows
(rows of x and dy flattened). What changes is how they are laid out:
- dW on CPU. Left to itself, XLA folds x^T into the dot's dimension numbers;
  XLA:CPU's fast matmul library (YNNPACK) does not take a left operand
  contracted along its first axis, so every weight gradient falls back to a
  slower Eigen kernel (docs/performance.md, "What made the JAX step fast"). Here the
  narrower of x and dy is materialised transposed first (a copy of activations,
  small next to the matmul) behind an optimization barrier, so XLA cannot fold
  it back: x^T @ dy, or (dy^T @ x)^T where dy has fewer columns (a layer into
  d_model from d_ff). The output projection's dy is as wide as the vocabulary,
  so its x^T is copied, not dy^T. On other platforms the plain transposed dot is
  used: their matmul libraries take transposed operands directly.
- db is computed as ones @ dy, a matrix-vector product (as Caffe did), not as a
  reduction. All three gradients are then dots reading one (rows, N) dy, and XLA
  computes dy once (with whatever element-wise work produced it, e.g. a
  dropout mask), instead of once for the dots and again inside db's reduction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.kernels import switch


def affine(x, kernel, bias):  # (..., K) @ (K, N) + (N,) -> (..., N); bias may be None
    """The plain map, differentiated by autodiff."""
    y = x @ kernel
    return y if bias is None else y + bias


@jax.custom_vjp
def linear_tuned(x, kernel, bias):
    """`affine` with the backward pass below."""
    return affine(x, kernel, bias)


def _linear_fwd(x, kernel, bias):
    return affine(x, kernel, bias), (x, kernel, bias)


def _kernel_grad_cpu(x, dy):  # (M, K), (M, N) -> (K, N)
    if x.shape[1] <= dy.shape[1]:  # copy the narrower of the two transposed
        return jax.lax.optimization_barrier(x.T) @ dy  # x^T copied row-major: (K, M) @ (M, N)
    return (jax.lax.optimization_barrier(dy.T) @ x).T  # ((N, M) @ (M, K))^T


def _kernel_grad(x, dy):  # (M, K), (M, N) -> (K, N)
    return x.T @ dy


def _bias_grad(dy):  # (M, N) -> (N,)
    # ones (1, M) @ dy, a matrix-vector product rather than a reduction: XLA then
    # reads the one materialised dy, as the two other gradients' dots do.
    return (jnp.ones((1, dy.shape[0]), dy.dtype) @ dy)[0]


def _linear_bwd(residuals, dy):  # x (..., K), dy (..., N)
    x, kernel, bias = residuals
    x_rows = x.reshape(-1, x.shape[-1])  # (M, K)
    dy_rows = dy.reshape(-1, dy.shape[-1])  # (M, N)
    dx = (dy_rows @ kernel.T).reshape(x.shape).astype(x.dtype)  # (M, N) @ (N, K)
    d_kernel = jax.lax.platform_dependent(x_rows, dy_rows, cpu=_kernel_grad_cpu,
                                          default=_kernel_grad)
    d_bias = None if bias is None else _bias_grad(dy_rows).astype(bias.dtype)
    return dx, d_kernel.astype(kernel.dtype), d_bias


linear_tuned.defvjp(_linear_fwd, _linear_bwd)
linear = switch.kernel("linear", plain=affine, tuned=linear_tuned)


def stacked(x, *layers):
    """x through several Linear layers of the same input size in one matmul:
    x @ [W_a | W_b | ...] + [b_a | b_b | ...], split back into one output per
    layer. Each output column is the same dot product as in W_a(x) etc.; one
    wide matmul runs faster (on CPU) than several narrow ones. The parameters
    stay separate, so the checkpoint format does not change."""
    kernel = jnp.concatenate([layer.kernel[...] for layer in layers], axis=1)  # (K, n*N)
    bias = jnp.concatenate([layer.bias[...] for layer in layers])  # (n*N,)
    x, kernel, bias = layers[0].promote_dtype((x, kernel, bias), dtype=layers[0].dtype)
    return jnp.split(linear(x, kernel, bias), len(layers), axis=-1)  # n x (..., N)


class Linear(nnx.Linear):
    """nnx.Linear (same parameters, same dtype promotion) computed by `linear`, for
    the settings the model uses: its `precision`, `preferred_element_type` and
    `dot_general` are not read."""

    def __call__(self, inputs):
        kernel = self.kernel[...]
        bias = self.bias[...] if self.bias is not None else None
        inputs, kernel, bias = self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
        return linear(inputs, kernel, bias)
