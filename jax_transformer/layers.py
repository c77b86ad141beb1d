"""The Transformer's layers in Flax NNX: attention, feed-forward, residual
connections, encoder and decoder layers and stacks.

Read it side by side with torch_reference/layers.py: same modules, same names,
same steps in the same order. The operations (Linear, LayerNorm, Dropout,
attention, project_qkv, feed_forward) come from jax_transformer/kernels,
where their fast versions live. The stacks run their layers one after another
with `run_layers` (jax_transformer/scanned.py): a loop, as in torch, or one scan
over layers stacked on a leading axis. Shapes: B batch, S source length, T target
length, D d_model, H heads, Dh head dim, F d_ff.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.kernels.attention import (attention, attention_heads_first, project_kv,
                                               project_qkv)
from jax_transformer.kernels.dropout import Dropout
from jax_transformer.kernels.feed_forward import feed_forward
from jax_transformer.kernels.layer_norm import LayerNorm
from jax_transformer.kernels.linear import Linear
from jax_transformer.scanned import run_layers
from transformer_core.config import TransformerConfig


def linear(config: TransformerConfig, n_in: int, n_out: int, *, rngs: nnx.Rngs, dtype,
           param_dtype, bias: bool = True):
    """A Linear layer, its kernel drawn as config.weight_init says, its bias 0."""
    kernel_init = (nnx.initializers.xavier_uniform() if config.weight_init == "xavier"
                   else nnx.initializers.normal(config.init_std))
    return Linear(n_in, n_out, use_bias=bias, kernel_init=kernel_init, rngs=rngs, dtype=dtype,
                  param_dtype=param_dtype)


def heads_first(x):  # (B, L, H, Dh) -> (B, H, L, Dh)
    return x.transpose(0, 2, 1, 3)


class KVCache:
    """An attention sublayer's keys and values (B, H, L, Dh) while decoding (heads
    first, the layout attention reads them in), one position a step: self-attention's
    buffers for every position, which `append` fills at `position`, or
    cross-attention's, the memory's projected once. It lives for one step
    (Decoder.decode_step): `append` rebinds k and v to the updated arrays, which the
    step returns as the new cache."""

    def __init__(self, k, v, position=None):
        self.k, self.v, self.position = k, v, position

    def append(self, k, v):  # (B, 1, H, Dh) each, written at `position` of (B, H, L, Dh)
        self.k = jax.lax.dynamic_update_slice_in_dim(self.k, heads_first(k), self.position,
                                                     axis=2)
        self.v = jax.lax.dynamic_update_slice_in_dim(self.v, heads_first(v), self.position,
                                                     axis=2)


class MultiHeadAttention(nnx.Module):
    """softmax(Q K^T / sqrt(Dh)) V over H heads, with explicit W_q, W_k, W_v, W_o."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, kw = config.d_model, dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.W_q, self.W_k, self.W_v, self.W_o = (linear(config, d, d, **kw) for _ in range(4))
        self.dropout = Dropout(config.dropout, rngs=rngs)
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim

    def split_heads(self, x):  # (B, L, D) -> (B, L, H, Dh)
        return x.reshape(*x.shape[:2], self.num_heads, self.head_dim)

    def project_q(self, query):  # (B, Tq, D) -> (B, Tq, H, Dh)
        return self.split_heads(self.W_q(query))

    def project_kv(self, key_value):  # (B, Tk, D) -> k, v (B, Tk, H, Dh)
        k, v = project_kv(key_value, self.W_k, self.W_v)
        return self.split_heads(k), self.split_heads(v)

    def project(self, query, key_value):  # -> q (B, Tq, H, Dh), k and v (B, Tk, H, Dh)
        q, k, v = project_qkv(query, key_value, self.W_q, self.W_k, self.W_v)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def attend(self, q, k, v, mask=None):  # -> (B, Tq, D), weights (B, H, Tq, Tk)
        out, weights = attention(q, k, v, mask, self.dropout)  # (B, Tq, H, Dh)
        return self.W_o(out.reshape(*out.shape[:2], -1)), weights

    def attend_cache(self, q, cache: KVCache, mask):  # -> (B, Tq, D), weights (B, H, Tq, L)
        out, weights = attention_heads_first(q, cache.k, cache.v, mask, self.dropout)
        return self.W_o(out.reshape(*out.shape[:2], -1)), weights

    def __call__(self, query, key_value, mask=None, cache: KVCache | None = None):
        """query (B, Tq, D), key_value (B, Tk, D) -> (B, Tq, D), weights (B, H, Tq, Tk).
        While decoding, self-attention adds its keys/values to `cache` and attends to
        all it holds; cross-attention (key_value None) reads the memory's from it."""
        if cache is None:
            return self.attend(*self.project(query, key_value), mask)
        if key_value is None:
            return self.attend_cache(self.project_q(query), cache, mask)
        q, k, v = self.project(query, key_value)
        cache.append(k, v)
        return self.attend_cache(q, cache, mask)


class FeedForward(nnx.Module):
    """FFN(x) = W_2 dropout(act(W_1 x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.W_1 = linear(config, config.d_model, config.d_ff, **kw)
        self.W_2 = linear(config, config.d_ff, config.d_model, **kw)
        self.dropout = Dropout(config.dropout, rngs=rngs)
        self.activation = {"relu": jax.nn.relu, "silu": jax.nn.silu,
                           "gelu": functools.partial(jax.nn.gelu, approximate=False),
                           }[config.activation]

    def __call__(self, x):  # (B, L, D) -> (B, L, F) -> (B, L, D)
        return feed_forward(x, self.W_1, self.W_2, self.activation, self.dropout)


def layer_norm(config: TransformerConfig, *, rngs, dtype, param_dtype):
    return LayerNorm(config.d_model, epsilon=config.layer_norm_eps, use_fast_variance=False,
                     rngs=rngs, dtype=dtype, param_dtype=param_dtype)


class Residual(nnx.Module):
    """The residual connection around a sublayer f, with the layer's LayerNorm after
    the sum (post-LN, the paper): LN(x + Dropout(f(x))), or before f (pre-LN):
    x + Dropout(f(LN(x))). The norm is passed in, so its parameters stay the
    layer's; f maps h (B, L, D) to its output (B, L, D) and its attention
    weights (None for the FFN), which are returned beside the new x."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.pre_norm = config.pre_norm
        self.dropout = Dropout(config.dropout, rngs=rngs)

    def __call__(self, x, norm, sublayer):  # (B, L, D) -> (B, L, D), weights
        if self.pre_norm:
            out, weights = sublayer(norm(x))
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return norm(x + self.dropout(out)), weights


class EncoderLayer(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.self_attn = MultiHeadAttention(config, **kw)
        self.self_attn_norm = layer_norm(config, **kw)
        self.ffn = FeedForward(config, **kw)
        self.ffn_norm = layer_norm(config, **kw)
        self.residual = Residual(config, rngs=rngs)

    def __call__(self, x, src_mask):  # (B, S, D) -> (B, S, D)
        x, self_weights = self.residual(x, self.self_attn_norm,
                                        lambda h: self.self_attn(h, h, src_mask))
        x, _ = self.residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, self_weights


class DecoderLayer(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.self_attn = MultiHeadAttention(config, **kw)
        self.self_attn_norm = layer_norm(config, **kw)
        if config.architecture == "encoder_decoder":
            self.cross_attn = MultiHeadAttention(config, **kw)
            self.cross_attn_norm = layer_norm(config, **kw)
        else:  # decoder-only: no memory to attend to
            self.cross_attn = self.cross_attn_norm = None
        self.ffn = FeedForward(config, **kw)
        self.ffn_norm = layer_norm(config, **kw)
        self.residual = Residual(config, rngs=rngs)

    def __call__(self, x, memory, memory_mask, tgt_mask, cache=None):
        """x (B, T, D), memory (B, S, D) -> (B, T, D), self- and cross-attention weights.
        memory is None in a decoder-only model; the cross weights are then None.
        Decoder.decode_step passes one position (B, 1, D), memory None and `cache`,
        this layer's (self-attention, cross-attention) KVCaches."""
        self_cache, cross_cache = cache or (None, None)
        x, self_weights = self.residual(x, self.self_attn_norm,
                                        lambda h: self.self_attn(h, h, tgt_mask, self_cache))
        cross_weights = None
        if self.cross_attn is not None:
            x, cross_weights = self.residual(x, self.cross_attn_norm, lambda h: self.cross_attn(
                h, memory, memory_mask, cross_cache))
        x, _ = self.residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, self_weights, cross_weights

    # Incremental decoding: one target position at a time, with a key/value cache.
    def init_cache(self, memory, max_len: int):
        """Cross-attention keys/values of `memory` (B, S, D), projected once per
        sentence, and empty self-attention buffers for `max_len` positions."""
        cross_k, cross_v = map(heads_first, self.cross_attn.project_kv(memory))  # (B, H, S, Dh)
        cache = self.init_self_cache(cross_k.shape[0], max_len, cross_k.dtype)
        return {**cache, "cross_k": cross_k, "cross_v": cross_v}

    def init_self_cache(self, batch_size: int, max_len: int, dtype):
        """Empty self-attention key/value buffers (B, H, max_len, Dh)."""
        empty = jnp.zeros((batch_size, self.self_attn.num_heads, max_len,
                           self.self_attn.head_dim), dtype)
        return {"self_k": empty, "self_v": empty}


class Encoder(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([EncoderLayer(config, **kw)
                                for _ in range(config.num_encoder_layers)])
        self.final_norm = layer_norm(config, **kw) if config.final_norm else None

    def __call__(self, x, src_mask):
        x, all_weights = run_layers(self.layers, x, src_mask)  # each layer in turn
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


class Decoder(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([DecoderLayer(config, **kw)
                                for _ in range(config.num_decoder_layers)])
        self.final_norm = layer_norm(config, **kw) if config.final_norm else None

    def __call__(self, x, memory, memory_mask, tgt_mask, cache=None):
        """`cache`: while decoding (decode_step), each layer's pair of KVCaches."""
        x, all_self, all_cross = run_layers(self.layers, x, memory, memory_mask, tgt_mask,
                                            per_layer=cache)  # each layer in turn
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_self, [weights for weights in all_cross if weights is not None]

    def init_cache(self, memory, max_len: int):
        return [layer.init_cache(memory, max_len) for layer in self.layers]

    def init_self_cache(self, batch_size: int, max_len: int, dtype):
        return [layer.init_self_cache(batch_size, max_len, dtype) for layer in self.layers]

    def decode_step(self, x, cache, position, src_mask):  # (B, 1, D) -> (B, 1, D)
        """__call__ on the one position `position`: each layer's self-attention writes
        its key/value there and attends to positions 0..position, cross-attention
        reads the memory's keys/values; -> the hidden state and the updated cache."""
        caches = [(KVCache(c["self_k"], c["self_v"], position),
                   KVCache(c["cross_k"], c["cross_v"]) if "cross_k" in c else None)
                  for c in cache]
        L = cache[0]["self_k"].shape[2]
        visible = (jnp.arange(L) <= position).reshape(1, 1, 1, L)
        x, _, _ = self(x, None, src_mask, visible, caches)
        return x, [{**c, "self_k": kv.k, "self_v": kv.v} for c, (kv, _) in zip(cache, caches)]
