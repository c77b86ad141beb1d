"""The Transformer's layers in PyTorch: attention, feed-forward, residual
connections, encoder and decoder layers and stacks.

The reference for jax_transformer/layers.py: same modules, same names, same
steps in the same order, each operation written out as the paper states it.
Shapes: B batch, S source length, T target length, D d_model, H heads, Dh head
dim, F d_ff.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_core.config import TransformerConfig


def linear(config: TransformerConfig, n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    """A Linear layer, its weight drawn as config.weight_init says, its bias 0."""
    layer = nn.Linear(n_in, n_out, bias=bias)
    if config.weight_init == "xavier":
        nn.init.xavier_uniform_(layer.weight)
    else:
        nn.init.normal_(layer.weight, std=config.init_std)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def attention(q, k, v, mask, dropout: nn.Dropout):
    """softmax(q k^T / sqrt(Dh)) v for every head: q (B, Tq, H, Dh), k and v (B, Tk, H, Dh)
    -> out (B, Tq, H, Dh), weights (B, H, Tq, Tk). Masked scores get finfo.min."""
    return attention_heads_first(q, k.transpose(1, 2), v.transpose(1, 2), mask, dropout)


def attention_heads_first(q, k, v, mask, dropout: nn.Dropout):
    """attention over keys and values (B, H, Tk, Dh), the layout a decoding cache
    keeps them in (no copy of the whole cache into it at every step)."""
    q = q.transpose(1, 2)  # (B, H, Tq, Dh)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
    out = dropout(weights).to(v.dtype) @ v  # (B, H, Tq, Dh)
    return out.transpose(1, 2), weights  # (B, Tq, H, Dh)


def heads_first(x):  # (B, L, H, Dh) -> (B, H, L, Dh)
    return x.transpose(1, 2)


class KVCache:
    """An attention sublayer's keys and values (B, H, L, Dh) while decoding (heads
    first, the layout attention reads them in), one position a step: self-attention's
    buffers for every position, which `append` fills at `position`, or
    cross-attention's, the memory's projected once. It lives for one step
    (Decoder.decode_step): `append` writes into the buffers in place (JAX rebinds k
    and v to updated arrays)."""

    def __init__(self, k, v, position=None):
        self.k, self.v, self.position = k, v, position

    def append(self, k, v):  # (B, 1, H, Dh) each, written at `position` of (B, H, L, Dh)
        self.k[:, :, self.position] = k[:, 0]
        self.v[:, :, self.position] = v[:, 0]


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(Dh)) V over H heads, with explicit W_q, W_k, W_v, W_o."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.W_q, self.W_k, self.W_v, self.W_o = (linear(config, d, d) for _ in range(4))
        self.dropout = nn.Dropout(config.dropout)
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim

    def split_heads(self, x):  # (B, L, D) -> (B, L, H, Dh)
        return x.unflatten(-1, (self.num_heads, self.head_dim))

    def project_q(self, query):  # (B, Tq, D) -> (B, Tq, H, Dh)
        return self.split_heads(self.W_q(query))

    def project_kv(self, key_value):  # (B, Tk, D) -> k, v (B, Tk, H, Dh)
        return self.split_heads(self.W_k(key_value)), self.split_heads(self.W_v(key_value))

    def project(self, query, key_value):  # -> q (B, Tq, H, Dh), k and v (B, Tk, H, Dh)
        return self.project_q(query), *self.project_kv(key_value)

    def attend(self, q, k, v, mask=None):  # -> (B, Tq, D), weights (B, H, Tq, Tk)
        out, weights = attention(q, k, v, mask, self.dropout)  # (B, Tq, H, Dh)
        return self.W_o(out.flatten(2)), weights

    def attend_cache(self, q, cache: KVCache, mask):  # -> (B, Tq, D), weights (B, H, Tq, L)
        out, weights = attention_heads_first(q, cache.k, cache.v, mask, self.dropout)
        return self.W_o(out.flatten(2)), weights

    def forward(self, query, key_value, mask=None, cache: KVCache | None = None):
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


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.W_1 = linear(config, config.d_model, config.d_ff)
        self.W_2 = linear(config, config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}[config.activation]

    def forward(self, x):  # (B, L, D) -> (B, L, F) -> (B, L, D)
        return self.W_2(self.dropout(self.activation(self.W_1(x))))


def layer_norm(config: TransformerConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class Residual(nn.Module):
    """The residual connection around a sublayer f, with the layer's LayerNorm after
    the sum (post-LN, the paper): LN(x + Dropout(f(x))), or before f (pre-LN):
    x + Dropout(f(LN(x))). The norm is passed in, so its parameters stay the
    layer's; f maps h (B, L, D) to its output (B, L, D) and its attention
    weights (None for the FFN), which are returned beside the new x."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, norm, sublayer):  # (B, L, D) -> (B, L, D), weights
        if self.pre_norm:
            out, weights = sublayer(norm(x))
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return norm(x + self.dropout(out)), weights


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_norm = layer_norm(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.residual = Residual(config)

    def forward(self, x, src_mask):  # (B, S, D) -> (B, S, D)
        x, self_weights = self.residual(x, self.self_attn_norm,
                                        lambda h: self.self_attn(h, h, src_mask))
        x, _ = self.residual(x, self.ffn_norm, lambda h: (self.ffn(h), None))
        return x, self_weights


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_norm = layer_norm(config)
        if config.architecture == "encoder_decoder":
            self.cross_attn = MultiHeadAttention(config)
            self.cross_attn_norm = layer_norm(config)
        else:  # decoder-only: no memory to attend to
            self.cross_attn = self.cross_attn_norm = None
        self.ffn = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.residual = Residual(config)

    def forward(self, x, memory, memory_mask, tgt_mask, cache=None):
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
        cache = self.init_self_cache(cross_k.shape[0], max_len, cross_k.dtype, cross_k.device)
        return {**cache, "cross_k": cross_k, "cross_v": cross_v}

    def init_self_cache(self, batch_size: int, max_len: int, dtype, device):
        """Empty self-attention key/value buffers (B, H, max_len, Dh)."""
        shape = (batch_size, self.self_attn.num_heads, max_len, self.self_attn.head_dim)
        return {"self_k": torch.zeros(shape, dtype=dtype, device=device),
                "self_v": torch.zeros(shape, dtype=dtype, device=device)}


class Encoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([EncoderLayer(config) for _ in range(config.num_encoder_layers)])
        self.final_norm = layer_norm(config) if config.final_norm else None

    def forward(self, x, src_mask):
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, src_mask)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


class Decoder(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.num_decoder_layers)])
        self.final_norm = layer_norm(config) if config.final_norm else None

    def forward(self, x, memory, memory_mask, tgt_mask, cache=None):
        """`cache`: while decoding (decode_step), each layer's pair of KVCaches."""
        all_self, all_cross = [], []
        for layer, layer_cache in zip(self.layers, cache or [None] * len(self.layers)):
            x, self_weights, cross_weights = layer(x, memory, memory_mask, tgt_mask, layer_cache)
            all_self.append(self_weights)
            if cross_weights is not None:
                all_cross.append(cross_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_self, all_cross

    def init_cache(self, memory, max_len: int):
        return [layer.init_cache(memory, max_len) for layer in self.layers]

    def init_self_cache(self, batch_size: int, max_len: int, dtype, device):
        return [layer.init_self_cache(batch_size, max_len, dtype, device)
                for layer in self.layers]

    def decode_step(self, x, cache, position, src_mask):  # (B, 1, D) -> (B, 1, D)
        """forward on the one position `position`: each layer's self-attention writes
        its key/value there and attends to positions 0..position, cross-attention
        reads the memory's keys/values; -> the hidden state and the updated cache."""
        caches = [(KVCache(c["self_k"], c["self_v"], position),
                   KVCache(c["cross_k"], c["cross_v"]) if "cross_k" in c else None)
                  for c in cache]
        L = cache[0]["self_k"].shape[2]
        visible = (torch.arange(L, device=x.device) <= position).reshape(1, 1, 1, L)
        x, _, _ = self(x, None, src_mask, visible, caches)
        return x, [{**c, "self_k": kv.k, "self_v": kv.v} for c, (kv, _) in zip(cache, caches)]
