"""LayerNorm over the last axis, with its gradient written out.

Forward: nnx.LayerNorm's computation (use_fast_variance=False), op for op, so the
outputs are the same bit for bit:
    mean = mean(x),  var = mean((x - mean)^2),  rstd = rsqrt(var + eps),
    y = (x - mean) * (rstd * scale) + bias          (statistics in float32 or wider)
Backward (the tuned version, `layer_norm_closed_form`; the plain one,
`layer_norm_plain`, leaves it to autodiff): the closed form, with
xhat = (x - mean) * rstd and g = dy * scale,
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    dscale = sum over rows of dy * xhat,   dbias = sum over rows of dy.
Autodiff instead differentiates the mean and the variance as written, and XLA:CPU
compiles its gradient to more (rows, D) passes than this one's, among them a (rows, D)
broadcast of rstd * scale (docs/performance.md, "What made the JAX step fast").
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.kernels import switch


def _forward(x, scale, bias, epsilon):  # (..., D) -> (..., D), (..., 1) twice
    stats_dtype = jnp.promote_types(x.dtype, jnp.float32)
    x_stats = x.astype(stats_dtype)
    mean = jnp.mean(x_stats, axis=-1, keepdims=True)  # (..., 1)
    var = jnp.mean(jax.lax.square(x_stats - mean), axis=-1, keepdims=True)  # (..., 1)
    rstd = jax.lax.rsqrt(var + epsilon)  # (..., 1)
    y = (x - mean) * (rstd * scale) + bias
    return y.astype(jnp.result_type(x, scale, bias)), mean, rstd


def layer_norm_plain(x, scale, bias, epsilon: float):
    """Normalise x (..., D) over its last axis, then scale (D,) and shift (D,)."""
    return _forward(x, scale, bias, epsilon)[0]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm_closed_form(x, scale, bias, epsilon: float):
    """`layer_norm_plain` with the closed-form backward pass."""
    return _forward(x, scale, bias, epsilon)[0]


def _layer_norm_fwd(x, scale, bias, epsilon):
    y, mean, rstd = _forward(x, scale, bias, epsilon)
    return y, (x, scale, bias, mean, rstd)


def _layer_norm_bwd(epsilon, residuals, dy):
    x, scale, bias, mean, rstd = residuals
    dtype = rstd.dtype  # the statistics' (float32 or wider)
    xhat = (x.astype(dtype) - mean) * rstd  # (..., D)
    dy = dy.astype(dtype)
    g = dy * scale.astype(dtype)
    dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True)
                 - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
    rows = (-1, x.shape[-1])
    d_scale = jnp.sum((dy * xhat).reshape(rows), axis=0)  # (D,)
    d_bias = jnp.sum(dy.reshape(rows), axis=0)  # (D,)
    return dx.astype(x.dtype), d_scale.astype(scale.dtype), d_bias.astype(bias.dtype)


layer_norm_closed_form.defvjp(_layer_norm_fwd, _layer_norm_bwd)
layer_norm = switch.kernel("layer_norm", plain=layer_norm_plain, tuned=layer_norm_closed_form)


class LayerNorm(nnx.LayerNorm):
    """nnx.LayerNorm (same parameters, same outputs) computed by `layer_norm`. For
    the configuration the model uses: last axis, scale and bias, exact variance."""

    def __call__(self, x):
        if (self.use_fast_variance or self.scale is None or self.bias is None
                or self.reduction_axes != -1 or self.feature_axes != -1
                or self.axis_name is not None):
            raise NotImplementedError("LayerNorm: last axis, scale and bias, exact variance")
        x, scale, bias = self.promote_dtype((x, self.scale[...], self.bias[...]),
                                            dtype=self.dtype)
        return layer_norm(x, scale, bias, self.epsilon)
