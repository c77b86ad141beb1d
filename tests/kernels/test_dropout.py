"""jax_transformer/kernels/dropout.py: the same masks as nnx.Dropout, and relu_dropout's values
and gradients equal to autodiff's through relu then nnx.Dropout, bit for bit."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.kernels.dropout import Dropout, relu_dropout


def _inputs(shape=(6, 40), seed=0):
    h = np.random.RandomState(seed).randn(*shape).astype(np.float32)
    h[0, :5] = 0.0  # relu's kink: autodiff's derivative there is 0
    return jnp.asarray(h)


def test_keep_mask_is_the_mask_nnx_dropout_applies():
    h = jnp.ones((8, 64))
    ours, reference = Dropout(0.3, rngs=nnx.Rngs(7)), nnx.Dropout(0.3, rngs=nnx.Rngs(7))
    for _ in range(3):  # and the streams advance alike
        keep = ours.keep_mask(h)
        assert keep.dtype == jnp.bool_ and keep.shape == h.shape
        np.testing.assert_array_equal(keep, reference(h) != 0)
    assert 0 < int(keep.sum()) < keep.size


def test_keep_mask_is_none_when_dropout_is_off():
    h = jnp.ones((2, 3))
    assert Dropout(0.1, deterministic=True, rngs=nnx.Rngs(0)).keep_mask(h) is None
    assert Dropout(0.0, rngs=nnx.Rngs(0)).keep_mask(h) is None


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_relu_dropout_equals_autodiff_of_relu_then_nnx_dropout(rate):
    h, cotangent = _inputs(), _inputs(seed=1)

    def reference(h):
        return nnx.Dropout(rate, rngs=nnx.Rngs(3))(jax.nn.relu(h))

    def fused(h):
        return relu_dropout(h, Dropout(rate, rngs=nnx.Rngs(3)).keep_mask(h), rate)

    y_ref, vjp_ref = jax.vjp(jax.jit(reference), h)
    y, vjp = jax.vjp(jax.jit(fused), h)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_array_equal(vjp(cotangent)[0], vjp_ref(cotangent)[0])
    assert np.any(y == 0) and np.any(y > 0)


def _random_bit_draws(f, *args) -> int:
    """How many times f's compiled gradient hashes counters into random bits: on
    XLA:CPU each draw is one rolled threefry loop in the entry computation."""
    hlo = jax.jit(jax.grad(f)).lower(*args).compile().as_text()
    entry = next(c for c in re.split(r"\n(?=\S)", hlo) if c.startswith("ENTRY"))
    return entry.count(" while(")


@pytest.mark.jax_pinned  # counts what XLA:CPU compiles: re-check on a JAX upgrade
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's lowering of threefry")
def test_relu_dropout_backward_draws_no_random_bits():
    """The custom backward reads only the output: the mask is drawn once, in the
    forward pass, as autodiff's gradient draws it."""
    h, w = _inputs((64, 256)), _inputs((256, 32), seed=1)

    def autodiff(h):
        return jnp.sum((nnx.Dropout(0.1, rngs=nnx.Rngs(0))(jax.nn.relu(h)) @ w) ** 2)

    def fused(h):
        keep = Dropout(0.1, rngs=nnx.Rngs(0)).keep_mask(h)
        return jnp.sum((relu_dropout(h, keep, 0.1) @ w) ** 2)

    assert _random_bit_draws(autodiff, h) == _random_bit_draws(fused, h) == 1
