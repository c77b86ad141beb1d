"""Scaled dot-product attention over heads, and the Q/K/V projections that feed it.

    attention(q, k, v, mask, dropout) = softmax(q k^T / sqrt(Dh)) v per head
        q (B, Tq, H, Dh), k and v (B, Tk, H, Dh) -> out (B, Tq, H, Dh), weights (B, H, Tq, Tk)
    attention_heads_first(q, k, v, mask, dropout)   the same with k and v (B, H, Tk, Dh),
        as a decoding cache holds them
    project_qkv(query, key_value, W_q, W_k, W_v) = W_q(query), W_k(key_value), W_v(key_value)
    project_kv(key_value, W_k, W_v) = W_k(key_value), W_v(key_value)

Plain versions transpose the heads out, as torch_reference does. The tuned ones:
- `attention_heads_in_place` keeps the heads where the projections left them
  and lets the einsums contract around them: the same products without a copy
  of q, k, v and of the output per layer.
- `project_qkv_stacked` and `project_kv_stacked` run Q, K and V (self-attention:
  `query is key_value`) or K and V as one wide matmul (linear.stacked).
What each saves: docs/performance.md, "What made the JAX step fast".
Scores are computed in at least float32; masked scores get finfo.min, never
-inf, so a fully masked row stays finite.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from jax_transformer.kernels import switch
from jax_transformer.kernels.linear import stacked


def _softmax(scores, mask):  # (B, H, Tq, Tk) -> (B, H, Tq, Tk), at least float32
    scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))
    if mask is not None:
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)


def attention_heads_first(q, k, v, mask, dropout):
    """attention over keys and values (B, H, Tk, Dh), the layout a decoding cache
    keeps them in: attending to (B, Tk, H, Dh) copies all of them into this one
    first, at every step of a search (a third of a greedy step on XLA:CPU)."""
    q = q.transpose(0, 2, 1, 3)  # (B, H, Tq, Dh)
    weights = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]), mask)
    out = dropout(weights).astype(v.dtype) @ v  # (B, H, Tq, Dh)
    return out.transpose(0, 2, 1, 3), weights  # (B, Tq, H, Dh)


def attention_plain(q, k, v, mask, dropout):
    return attention_heads_first(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), mask,
                                 dropout)


def attention_heads_in_place(q, k, v, mask, dropout):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    weights = _softmax(scores, mask)
    out = jnp.einsum("bhqk,bkhd->bqhd", dropout(weights).astype(v.dtype), v)  # (B, Tq, H, Dh)
    return out, weights


def project_qkv_plain(query, key_value, W_q, W_k, W_v):
    return W_q(query), W_k(key_value), W_v(key_value)


def project_qkv_stacked(query, key_value, W_q, W_k, W_v):
    if query is key_value:  # self-attention
        return tuple(stacked(query, W_q, W_k, W_v))
    return W_q(query), *stacked(key_value, W_k, W_v)


def project_kv_plain(key_value, W_k, W_v):
    return W_k(key_value), W_v(key_value)


def project_kv_stacked(key_value, W_k, W_v):
    return tuple(stacked(key_value, W_k, W_v))


attention = switch.kernel("attention", plain=attention_plain, tuned=attention_heads_in_place)
project_qkv = switch.kernel("project_qkv", plain=project_qkv_plain, tuned=project_qkv_stacked)
project_kv = switch.kernel("project_kv", plain=project_kv_plain, tuned=project_kv_stacked)
