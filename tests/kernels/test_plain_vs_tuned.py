"""Each tuned kernel (attention, projections, activation + dropout, the FFN) gives
its plain version's values and gradients; the switch picks them; and the whole
model gives the same loss and gradients with either set. (linear, layer_norm and
relu_dropout have their own files.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jax_transformer import kernels
from jax_transformer.kernels import attention as attention_kernels
from jax_transformer.kernels import dropout as dropout_kernels
from jax_transformer.kernels import feed_forward as feed_forward_kernels
from jax_transformer.kernels import switch
from jax_transformer.kernels.dropout import Dropout
from jax_transformer.kernels.linear import Linear
from jax_transformer.model import Transformer
from jax_transformer.train.step import label_smoothed_cross_entropy
from transformer_core.config import TransformerConfig

B, TQ, TK, H, DH = 2, 5, 7, 3, 4


def _qkv(seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (B, TQ, H, DH), jnp.float64)
    k, v = (jax.random.normal(key, (B, TK, H, DH), jnp.float64) for key in keys[1:])
    return q, k, v


@pytest.mark.parametrize("rate", [0.0, 0.3])
def test_attention_heads_in_place_equals_plain(rate):
    with jax.enable_x64(True):
        q, k, v = _qkv()
        mask = jnp.arange(TK)[None, None, None, :] < jnp.array([4, 7])[:, None, None, None]
        cotangent = jax.random.normal(jax.random.key(9), (B, TQ, H, DH), jnp.float64)

        def run(fn):  # a new Dropout per call: the same dropout stream for both
            def attend(*qkv):
                return fn(*qkv, mask, Dropout(rate, rngs=nnx.Rngs(3)))
            (out, weights), vjp = jax.vjp(attend, q, k, v)
            return out, weights, vjp((cotangent, jnp.zeros_like(weights)))

        plain, tuned = run(attention_kernels.attention_plain), \
            run(attention_kernels.attention_heads_in_place)
        for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(tuned)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
        assert tuned[1].shape == (B, H, TQ, TK) and tuned[0].shape == (B, TQ, H, DH)
        assert float(jnp.max(tuned[1][0, :, :, 4:])) == 0.0  # masked keys: exactly 0 weight


def test_stacked_projections_equal_separate_ones():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(0), (B, TQ, 8), jnp.float64)
        memory = jax.random.normal(jax.random.key(1), (B, TK, 8), jnp.float64)
        W_q, W_k, W_v = (Linear(8, 8, param_dtype=jnp.float64, rngs=nnx.Rngs(i))
                         for i in range(3))
        for query, key_value in ((x, x), (x, memory)):  # self- and cross-attention
            plain = attention_kernels.project_qkv_plain(query, key_value, W_q, W_k, W_v)
            tuned = attention_kernels.project_qkv_stacked(query, key_value, W_q, W_k, W_v)
            for a, b in zip(plain, tuned):
                np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)
        for a, b in zip(attention_kernels.project_kv_plain(memory, W_k, W_v),
                        attention_kernels.project_kv_stacked(memory, W_k, W_v)):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("activation", [jax.nn.relu, jax.nn.silu])
def test_activation_dropout_fused_equals_plain(activation):
    h = jax.random.normal(jax.random.key(0), (6, 40))
    cotangent = jax.random.normal(jax.random.key(1), (6, 40))

    @jax.jit  # as in training: both compiled
    def run_both(h, cotangent):
        def run(fn):
            y, vjp = jax.vjp(lambda h: fn(h, activation, Dropout(0.25, rngs=nnx.Rngs(5))), h)
            return y, vjp(cotangent)[0]
        return (run(dropout_kernels.activation_dropout_plain),
                run(dropout_kernels.activation_dropout_fused))


    plain, fused = run_both(h, cotangent)
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)


def test_feed_forward_on_rows_equals_plain():
    x = jax.random.normal(jax.random.key(0), (3, 5, 8))
    cotangent = jax.random.normal(jax.random.key(1), (3, 5, 8))
    W_1, W_2 = Linear(8, 16, rngs=nnx.Rngs(0)), Linear(16, 8, rngs=nnx.Rngs(1))

    @jax.jit
    def run_both(x, cotangent):
        def run(fn):
            def ffn(x):
                return fn(x, W_1, W_2, jax.nn.relu, Dropout(0.3, rngs=nnx.Rngs(2)))
            y, vjp = jax.vjp(ffn, x)
            return y, vjp(cotangent)[0]
        return (run(feed_forward_kernels.feed_forward_plain),
                run(feed_forward_kernels.feed_forward_rows))

    plain, rows = run_both(x, cotangent)
    for a, b in zip(plain, rows):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    assert rows[0].shape == x.shape


def test_switch_chooses_per_kernel_and_by_environment(monkeypatch):
    backend = jax.default_backend()
    assert kernels.chosen("attention") == kernels.KERNELS_BY_BACKEND[backend]
    assert kernels.chosen("dropout_mask") == switch.KERNEL_EXCEPTIONS["dropout_mask"].get(
        backend, kernels.KERNELS_BY_BACKEND[backend])
    with kernels.override(attention="plain"):
        assert kernels.chosen("attention") == "plain"
        assert kernels.chosen("linear") == kernels.KERNELS_BY_BACKEND[backend]
    monkeypatch.setenv("JAX_TRANSFORMER_KERNELS", "tuned")
    assert kernels.chosen("dropout_mask") == "tuned"
    monkeypatch.setenv("JAX_TRANSFORMER_KERNELS", "plain")
    assert kernels.chosen("linear") == "plain"
    monkeypatch.setenv("JAX_TRANSFORMER_KERNELS", "fast")
    with pytest.raises(ValueError, match="JAX_TRANSFORMER_KERNELS='fast'"):
        kernels.chosen("linear")


@pytest.mark.slow  # eager float64 through every custom VJP: ~25 s here
def test_model_loss_and_gradients_are_the_same_with_plain_and_tuned_kernels(monkeypatch):
    """Training mode, dropout on: same parameters, same dropout stream and masks (the
    hash generator, which draws other masks, has its own tests), so every kernel's
    tuned version must reproduce the plain maths to float64 rounding."""
    config = TransformerConfig(src_vocab_size=23, tgt_vocab_size=23, d_model=12, num_heads=3,
                               d_ff=20, num_encoder_layers=1, num_decoder_layers=1,
                               dropout=0.2, max_len=16, output_bias=True)
    rng = np.random.default_rng(0)
    src = jnp.asarray(rng.integers(4, 23, (3, 6)), jnp.int32).at[0, 4:].set(0)
    tgt = jnp.asarray(rng.integers(4, 23, (3, 5)), jnp.int32)

    def loss_and_grads(kernel_set):
        monkeypatch.setenv("JAX_TRANSFORMER_KERNELS", kernel_set)
        model = Transformer(config, rngs=nnx.Rngs(0), dtype=jnp.float64,
                            param_dtype=jnp.float64)
        loss = lambda m: label_smoothed_cross_entropy(m(src, tgt), tgt, 0)[0]  # noqa: E731
        return nnx.value_and_grad(loss)(model)

    with jax.enable_x64(True), kernels.override(dropout_mask="plain"):
        plain_loss, plain_grads = loss_and_grads("plain")
        tuned_loss, tuned_grads = loss_and_grads("tuned")
    np.testing.assert_allclose(tuned_loss, plain_loss, rtol=1e-13)
    plain_flat, tuned_flat = nnx.to_flat_state(plain_grads), nnx.to_flat_state(tuned_grads)
    assert [p for p, _ in plain_flat] == [p for p, _ in tuned_flat]
    for (path, a), (_, b) in zip(plain_flat, tuned_flat):
        np.testing.assert_allclose(b.get_value(), a.get_value(), rtol=1e-10, atol=1e-12,
                                   err_msg=str(path))
