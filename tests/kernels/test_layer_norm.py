"""jax_transformer/kernels/layer_norm.py: nnx.LayerNorm's outputs bit for bit, autodiff's
gradients to float64 rounding, in fewer passes over the activations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.kernels.layer_norm import LayerNorm, layer_norm


def _layers(d, **kw):
    """Ours and nnx's, with the same (non-trivial) scale and bias."""
    layers = LayerNorm(d, use_fast_variance=False, rngs=nnx.Rngs(0), **kw), \
        nnx.LayerNorm(d, use_fast_variance=False, rngs=nnx.Rngs(0), **kw)
    keys = jax.random.split(jax.random.key(1), 2)
    for layer in layers:
        layer.scale[...] = 1 + jax.random.normal(keys[0], (d,), layer.scale.dtype)
        layer.bias[...] = jax.random.normal(keys[1], (d,), layer.bias.dtype)
    return layers


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_outputs_are_nnx_layer_norms_bit_for_bit(dtype):
    ours, reference = _layers(64, dtype=dtype)
    x = (3 + 2 * jax.random.normal(jax.random.key(2), (4, 5, 64))).astype(dtype)
    y = jax.jit(lambda m, x: m(x))(ours, x)
    assert y.dtype == dtype
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(jax.jit(lambda m, x: m(x))(reference, x), np.float32))


def test_gradients_equal_autodiff_in_float64():
    with jax.enable_x64(True):
        ours, reference = _layers(48, param_dtype=jnp.float64)
        x = 3 + 2 * jax.random.normal(jax.random.key(2), (3, 7, 48), jnp.float64)
        w = jax.random.normal(jax.random.key(3), (3, 7, 48), jnp.float64)

        def loss(layer, x):
            return jnp.sum(jnp.sin(layer(x)) * w)

        got, want = (jax.jit(nnx.grad(loss, argnums=(0, 1)))(layer, x)
                     for layer in (ours, reference))
        leaves = jax.tree.leaves(got), jax.tree.leaves(want)
        assert len(leaves[0]) == len(leaves[1]) == 3  # d_scale, d_bias, dx
        for g, r in zip(*leaves, strict=True):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-12)


def test_bfloat16_cotangents_keep_the_primal_dtypes():
    x = jnp.ones((2, 8), jnp.bfloat16).at[:, 0].set(3)
    scale, bias = jnp.ones((8,), jnp.bfloat16), jnp.ones((8,), jnp.bfloat16)
    grads = jax.grad(lambda *a: layer_norm(*a, 1e-5).astype(jnp.float32).sum(),
                     argnums=(0, 1, 2))(x, scale, bias)
    assert all(g.dtype == jnp.bfloat16 for g in grads)


def test_configurations_it_does_not_implement_are_refused():
    with pytest.raises(NotImplementedError):
        LayerNorm(8, use_fast_variance=True, rngs=nnx.Rngs(0))(jnp.ones((2, 8)))
