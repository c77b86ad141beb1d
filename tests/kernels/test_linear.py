"""jax_transformer/kernels/linear.py: the ordinary Linear-layer gradients, in a layout XLA:CPU runs fast."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer.kernels import linear as matmul


@pytest.fixture
def float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("x_shape", [(6, 5), (3, 4, 5), (2, 3, 4, 5)])
def test_gradients_equal_autodiff(float64, x_shape, with_bias):
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], x_shape, jnp.float64)
    kernel = jax.random.normal(keys[1], (5, 7), jnp.float64)
    bias = jax.random.normal(keys[2], (7,), jnp.float64) if with_bias else None
    dy = jax.random.normal(keys[3], x_shape[:-1] + (7,), jnp.float64)

    def grads(f):
        y, vjp = jax.vjp(jax.jit(f), x, kernel, bias)
        return (y, *vjp(dy))

    ours = grads(matmul.linear)
    reference = grads(lambda a, w, b: a @ w if b is None else a @ w + b)
    assert (ours[-1] is None) == (not with_bias)
    for got, want in zip(ours, reference, strict=True):
        if want is None:
            continue
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


def test_bfloat16_cotangents_keep_the_primal_dtypes():
    x = jnp.ones((4, 8), jnp.bfloat16)
    kernel = jnp.ones((8, 3), jnp.bfloat16)
    bias = jnp.ones((3,), jnp.bfloat16)
    grads = jax.grad(lambda *a: matmul.linear(*a).astype(jnp.float32).sum(),
                     argnums=(0, 1, 2))(x, kernel, bias)
    assert all(g.dtype == jnp.bfloat16 for g in grads)
    np.testing.assert_array_equal(np.asarray(grads[1], np.float32), 4.0)
    np.testing.assert_array_equal(np.asarray(grads[2], np.float32), 4.0)


@pytest.mark.parametrize("use_bias", [True, False])
def test_linear_layer_is_nnx_linear(float64, use_bias):
    """Same parameters (so the same checkpoints), outputs and gradients."""
    ours = matmul.Linear(5, 7, use_bias=use_bias, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    reference = nnx.Linear(5, 7, use_bias=use_bias, param_dtype=jnp.float64, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (3, 4, 5), jnp.float64)

    def loss(layer, x):
        return jnp.sum(jnp.sin(layer(x)))

    got, want = (jax.jit(nnx.value_and_grad(loss))(layer, x) for layer in (ours, reference))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-13)
    assert jax.tree.structure(got[1]) == jax.tree.structure(want[1])
    for g, w in zip(jax.tree.leaves(got[1]), jax.tree.leaves(want[1]), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-13)


def _compiled_gradient(layer_class, loss):
    """The entry computation of the compiled gradient of loss(layer(x)) for a
    (32, 16, 64) -> 128 layer, and its fused computations by name."""
    layer = layer_class(64, 128, rngs=nnx.Rngs(0))
    x = jnp.ones((32, 16, 64))
    hlo = jax.jit(nnx.grad(lambda layer, x: loss(layer(x)))).lower(layer, x).compile().as_text()
    computations = {c.split(" ")[0].lstrip("%"): c for c in re.split(r"\n(?=\S)", hlo)}
    return next(c for c in computations.values() if c.startswith("ENTRY")), computations


def _weight_gradient_dots(layer_class):
    """lhs_contracting_dims of the dots that compute the (64, 128) weight gradient."""
    entry, computations = _compiled_gradient(layer_class, lambda y: (y ** 2).sum())
    return re.findall(r"f32\[64,128\]\S* dot\([^)]*\), lhs_contracting_dims=\{(\d+)\}",
                      "\n".join(computations.values()))


@pytest.mark.jax_pinned  # reads XLA:CPU's compiled dots: re-check on a JAX upgrade
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the layout targets XLA:CPU")
def test_cpu_weight_gradient_contracts_the_last_axis_of_its_left_operand():
    """XLA:CPU's fast matmul kernels (YNNPACK) need the left operand contracted
    along its last axis; autodiff's x^T @ dy contracts x along its first."""
    assert "0" in _weight_gradient_dots(nnx.Linear)  # the problem exists
    ours = _weight_gradient_dots(matmul.Linear)
    assert ours == ["1"]


@pytest.mark.jax_pinned  # counts what XLA:CPU fuses: re-check on a JAX upgrade
@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's fusion decisions")
def test_output_cotangent_is_computed_once_for_all_three_gradients():
    """dy = cos(y) here. Through nnx.Linear, XLA computes it once for the dots and
    again inside db's reduction; through kernels.linear.Linear once."""
    def kernels_computing_dy(layer_class):
        entry, computations = _compiled_gradient(layer_class, lambda y: jnp.sin(y).sum())
        names = re.findall(r"fusion\(.*?calls=%?([\w.\-]+)", entry)
        return sum("cosine(" in computations.get(name, "") for name in names)

    assert kernels_computing_dy(nnx.Linear) == 2
    assert kernels_computing_dy(matmul.Linear) == 1
