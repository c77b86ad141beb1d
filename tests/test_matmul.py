"""jax_transformer.matmul: the ordinary matmul gradients, in a layout XLA:CPU runs fast."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer import matmul


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("x_shape", [(6, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_gradients_equal_autodiff(float64, x_shape):
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], x_shape, jnp.float64)
    kernel = jax.random.normal(keys[1], (5, 7), jnp.float64)
    dy = jax.random.normal(keys[2], x_shape[:-1] + (7,), jnp.float64)

    def grads(f):
        y, vjp = jax.vjp(jax.jit(f), x, kernel)
        return (y, *vjp(dy))

    ours = grads(matmul.matmul)
    reference = grads(lambda a, b: a @ b)
    for got, want in zip(ours, reference, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_bfloat16_cotangents_keep_the_primal_dtypes():
    x = jnp.ones((4, 8), jnp.bfloat16)
    kernel = jnp.ones((8, 3), jnp.bfloat16)
    dx, d_kernel = jax.grad(lambda a, b: matmul.matmul(a, b).astype(jnp.float32).sum(),
                            argnums=(0, 1))(x, kernel)
    assert dx.dtype == d_kernel.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(d_kernel, np.float32), 4.0)


def test_dot_general_routes_only_the_linear_case():
    x, kernel = jnp.ones((2, 3, 4)), jnp.ones((4, 5))
    linear = (((2,), (0,)), ((), ()))
    np.testing.assert_array_equal(matmul.dot_general(x, kernel, linear), x @ kernel)
    other = (((1,), (1,)), ((0,), (0,)))  # a batched contraction: plain lax.dot_general
    a, b = jnp.arange(24.0).reshape(2, 3, 4), jnp.arange(30.0).reshape(2, 3, 5)
    np.testing.assert_array_equal(matmul.dot_general(a, b, other),
                                  jax.lax.dot_general(a, b, other))


def _weight_gradient_dots(linear_backward):
    """The dots in the compiled backward of a (32, 16, 64) -> 128 Linear layer."""
    layer = nnx.Linear(64, 128, rngs=nnx.Rngs(0), dot_general=linear_backward)
    x = jnp.ones((32, 16, 64))

    def loss(layer, x):
        return (layer(x) ** 2).sum()

    hlo = jax.jit(nnx.grad(loss)).lower(layer, x).compile().as_text()
    return re.findall(r"dot\([^)]*\), lhs_contracting_dims=\{(\d+)\}", hlo)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the layout targets XLA:CPU")
def test_cpu_weight_gradient_contracts_the_last_axis_of_its_left_operand():
    """XLA:CPU's fast matmul kernels (YNNPACK) need the left operand contracted
    along its last axis; autodiff's x^T @ dy contracts x along its first."""
    assert "0" in _weight_gradient_dots(jax.lax.dot_general)  # the problem exists
    ours = _weight_gradient_dots(matmul.dot_general)
    assert ours and "0" not in ours
