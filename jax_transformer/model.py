"""The encoder-decoder Transformer (Vaswani et al. 2017) in Flax NNX.

Read it side by side with torch_reference/model.py: same modules, same names,
same steps in the same order. The operations (Linear, LayerNorm, Dropout,
attention, project_qkv, feed_forward) come from jax_transformer/kernels,
where their fast versions live. Shapes: B batch, S source length, T target
length, D d_model, H heads, Dh head dim, F d_ff, V vocabulary.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer import pretrained
from jax_transformer.kernels.attention import attention, project_kv, project_qkv
from jax_transformer.kernels.dropout import Dropout
from jax_transformer.kernels.feed_forward import feed_forward
from jax_transformer.kernels.layer_norm import LayerNorm
from jax_transformer.kernels.linear import Linear
from jax_transformer.masks import causal_mask, padding_mask
from transformer_core.config import TransformerConfig
from transformer_core.positions import position_rows


def linear(n_in: int, n_out: int, *, rngs: nnx.Rngs, dtype, param_dtype, bias: bool = True):
    return Linear(n_in, n_out, use_bias=bias, kernel_init=nnx.initializers.xavier_uniform(),
                  rngs=rngs, dtype=dtype, param_dtype=param_dtype)


class MultiHeadAttention(nnx.Module):
    """softmax(Q K^T / sqrt(Dh)) V over H heads, with explicit W_q, W_k, W_v, W_o."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, kw = config.d_model, dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.W_q, self.W_k, self.W_v, self.W_o = (linear(d, d, **kw) for _ in range(4))
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

    def __call__(self, query, key_value, mask=None):  # (B, Tq, D), (B, Tk, D) -> (B, Tq, D)
        return self.attend(*self.project(query, key_value), mask)


class FeedForward(nnx.Module):
    """FFN(x) = W_2 dropout(act(W_1 x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.W_1 = linear(config.d_model, config.d_ff, **kw)
        self.W_2 = linear(config.d_ff, config.d_model, **kw)
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
    """The residual connection around each sublayer f, with LayerNorm after it
    (post-LN, the paper): LN(x + dropout(f(x))), or before it (pre-LN):
    x + dropout(f(LN(x))). Used as: h = norm_input(x); h = f(h); x = add_residual(x, h)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.pre_norm = config.pre_norm
        self.dropout = Dropout(config.dropout, rngs=rngs)

    def norm_input(self, x, norm):
        return norm(x) if self.pre_norm else x

    def add_residual(self, x, sublayer_out, norm):
        x = x + self.dropout(sublayer_out)
        return x if self.pre_norm else norm(x)


class EncoderLayer(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.self_attn = MultiHeadAttention(config, **kw)
        self.self_attn_norm = layer_norm(config, **kw)
        self.ffn = FeedForward(config, **kw)
        self.ffn_norm = layer_norm(config, **kw)
        self.residual = Residual(config, rngs=rngs)

    def __call__(self, x, src_mask):  # (B, S, D) -> (B, S, D)
        h = self.residual.norm_input(x, self.self_attn_norm)
        h, self_weights = self.self_attn(h, h, src_mask)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, self_weights


class DecoderLayer(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.self_attn = MultiHeadAttention(config, **kw)
        self.self_attn_norm = layer_norm(config, **kw)
        self.cross_attn = MultiHeadAttention(config, **kw)
        self.cross_attn_norm = layer_norm(config, **kw)
        self.ffn = FeedForward(config, **kw)
        self.ffn_norm = layer_norm(config, **kw)
        self.residual = Residual(config, rngs=rngs)

    def __call__(self, x, memory, memory_mask, tgt_mask):  # (B, T, D), (B, S, D) -> (B, T, D)
        h = self.residual.norm_input(x, self.self_attn_norm)
        h, self_weights = self.self_attn(h, h, tgt_mask)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.cross_attn_norm)
        h, cross_weights = self.cross_attn(h, memory, memory_mask)
        x = self.residual.add_residual(x, h, self.cross_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, self_weights, cross_weights

    # Incremental decoding: one target position at a time, with a key/value cache.
    def init_cache(self, memory, max_len: int):
        """Cross-attention keys/values of `memory` (B, S, D), projected once per
        sentence, and empty self-attention buffers for `max_len` positions."""
        cross_k, cross_v = self.cross_attn.project_kv(memory)  # (B, S, H, Dh)
        B, _, H, Dh = cross_k.shape
        empty = jnp.zeros((B, max_len, H, Dh), cross_k.dtype)  # (B, L, H, Dh)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def decode_step(self, x, cache, position, src_mask):
        """x (B, 1, D) at `position` -> (B, 1, D) and the cache with this position's
        self-attention key/value written in. Same steps as __call__."""
        h = self.residual.norm_input(x, self.self_attn_norm)
        q, k, v = self.self_attn.project(h, h)  # (B, 1, H, Dh) each
        self_k = jax.lax.dynamic_update_slice_in_dim(cache["self_k"], k, position, axis=1)
        self_v = jax.lax.dynamic_update_slice_in_dim(cache["self_v"], v, position, axis=1)
        visible = (jnp.arange(self_k.shape[1]) <= position)[None, None, None, :]  # (1, 1, 1, L)
        h, _ = self.self_attn.attend(q, self_k, self_v, visible)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.cross_attn_norm)
        q = self.cross_attn.project_q(h)  # (B, 1, H, Dh)
        h, _ = self.cross_attn.attend(q, cache["cross_k"], cache["cross_v"], src_mask)
        x = self.residual.add_residual(x, h, self.cross_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, {**cache, "self_k": self_k, "self_v": self_v}


class Encoder(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([EncoderLayer(config, **kw)
                                for _ in range(config.num_encoder_layers)])
        self.final_norm = layer_norm(config, **kw) if config.final_norm else None

    def __call__(self, x, src_mask):
        all_weights = []
        for layer in self.layers:
            x, weights = layer(x, src_mask)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_weights


class Decoder(nnx.Module):
    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([DecoderLayer(config, **kw)
                                for _ in range(config.num_decoder_layers)])
        self.final_norm = layer_norm(config, **kw) if config.final_norm else None

    def __call__(self, x, memory, memory_mask, tgt_mask):
        all_self, all_cross = [], []
        for layer in self.layers:
            x, self_weights, cross_weights = layer(x, memory, memory_mask, tgt_mask)
            all_self.append(self_weights)
            all_cross.append(cross_weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, all_self, all_cross

    def init_cache(self, memory, max_len: int):
        return [layer.init_cache(memory, max_len) for layer in self.layers]

    def decode_step(self, x, cache, position, src_mask):  # (B, 1, D) -> (B, 1, D)
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache):
            x, layer_cache = layer.decode_step(x, layer_cache, position, src_mask)
            new_cache.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, new_cache


class Transformer(nnx.Module):
    """Token ids in, next-token logits out.

    `dtype` is the compute dtype (bfloat16 for mixed precision); parameters are
    kept in `param_dtype`. Use `nnx.view(model, deterministic=True)` for eval.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        self.config = config
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        embed = functools.partial(nnx.Embed, features=config.d_model, **kw,
                                  embedding_init=nnx.initializers.normal(config.d_model ** -0.5))
        if config.share_embeddings:
            self.shared_embed = embed(config.src_vocab_size)
        else:
            self.src_embed = embed(config.src_vocab_size)
            self.tgt_embed = embed(config.tgt_vocab_size)
        self.embed_dropout = Dropout(config.dropout, rngs=rngs)
        self.encoder = Encoder(config, **kw)
        self.decoder = Decoder(config, **kw)
        if not config.tie_output:
            self.output_projection = linear(config.d_model, config.tgt_vocab_size,
                                            bias=config.output_bias, **kw)
        elif config.output_bias:
            self.output_bias = nnx.Param(jnp.zeros((config.tgt_vocab_size,), param_dtype))

    def source_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.src_embed

    def target_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.tgt_embed

    def embed(self, table: nnx.Embed, ids, positions=None):  # (B, L) -> (B, L, D)
        """Token embeddings plus the sinusoid of each position: 0..L-1 by default, or
        `positions` (B, L) (packed rows restart at 0 for each pair)."""
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len "
                             f"{self.config.max_len}")
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        table_pe = jnp.asarray(position_rows(self.config), x.dtype)  # (max_len, D)
        pe = table_pe[: ids.shape[1]] if positions is None else table_pe[positions]  # (L|B, L, D)
        return self.embed_dropout(x + pe)

    def embed_step(self, table: nnx.Embed, ids, position):  # (B, 1) ids at `position` -> (B, 1, D)
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = position_rows(self.config)  # (max_len, D)
        row = jax.lax.dynamic_slice_in_dim(jnp.asarray(positions, x.dtype), position, 1)  # (1, D)
        return self.embed_dropout(x + row)

    def encode(self, src_ids, src_mask=None, positions=None):
        """(B, S) ids -> memory (B, S, D) and each layer's self-attention weights."""
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.config.pad_id)  # (B, 1, 1, S)
        return self.encoder(self.embed(self.source_embedding(), src_ids, positions), src_mask)

    def decode(self, tgt_ids, memory, memory_mask, tgt_mask=None, positions=None):
        """(B, T) ids and memory -> hidden (B, T, D), self- and cross-attention weights.
        `memory_mask` (cross-attention) is usually the source padding mask.

        The default target mask is causal only: targets are right-padded, so
        causality already hides every pad key from every real query (and pad
        positions are ignored by the loss). This also serves models whose
        decoder start token is the pad id (Marian).
        """
        if tgt_mask is None:
            tgt_mask = causal_mask(tgt_ids.shape[1])  # (1, 1, T, T)
        return self.decoder(self.embed(self.target_embedding(), tgt_ids, positions), memory,
                            memory_mask, tgt_mask)

    def init_cache(self, memory, max_len: int):
        """The decoding cache for `memory` (B, S, D): one dict per decoder layer with
        self-attention buffers "self_k"/"self_v" (B, max_len, H, Dh), filled as
        decoding goes, and "cross_k"/"cross_v" (B, S, H, Dh), projected here once."""
        if max_len > self.config.max_len:
            raise ValueError(f"decoding length {max_len} exceeds max_len {self.config.max_len}")
        return self.decoder.init_cache(memory, max_len)

    def decode_step(self, tgt_ids, cache, position, src_mask):
        """Incremental decoding: tgt_ids (B, 1) at `position` (a scalar, may be traced)
        -> next-token logits (B, V) and the updated cache. Feeding positions
        0, 1, ... in turn gives the same logits as `project(decode(...))` on the
        whole prefix with the default (causal) target mask."""
        x = self.embed_step(self.target_embedding(), tgt_ids, position)  # (B, 1, D)
        hidden, cache = self.decoder.decode_step(x, cache, position, src_mask)
        return self.project(hidden)[:, 0], cache  # (B, V)

    def project(self, hidden):  # (B, T, D) -> (B, T, V)
        if self.config.tie_output:
            table = self.target_embedding().embedding[...].astype(hidden.dtype)
            logits = hidden @ table.T
            if self.config.output_bias:
                logits = logits + self.output_bias[...].astype(hidden.dtype)
            return logits
        return self.output_projection(hidden)

    def __call__(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
                 return_attention: bool = False, *, memory_mask=None, src_positions=None,
                 tgt_positions=None):
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V).

        Masks are boolean, True = may attend, broadcastable to (B, H, Tq, Tk);
        by default the source mask hides pad keys, the target mask is causal and
        the memory (cross-attention) mask is the source mask. Positions (B, L)
        default to 0..L-1. Packed batches pass all five (masks.segment_masks).
        With `return_attention`, also returns {"encoder_self", "decoder_self",
        "cross"}: lists of (B, H, Tq, Tk) weights, one per layer.
        """
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.config.pad_id)
        memory, encoder_self = self.encode(src_ids, src_mask, src_positions)
        memory_mask = src_mask if memory_mask is None else memory_mask
        hidden, decoder_self, cross = self.decode(tgt_ids, memory, memory_mask, tgt_mask,
                                                  tgt_positions)
        logits = self.project(hidden)
        if return_attention:
            return logits, {"encoder_self": encoder_self, "decoder_self": decoder_self,
                            "cross": cross}
        return logits

    # The checkpoint directory format (see transformer_core.checkpoint_dir).
    @classmethod
    def from_pretrained(cls, directory, **kwargs) -> "Transformer":
        """Build from a checkpoint directory (see jax_transformer.pretrained.load_pretrained)."""
        return pretrained.load_pretrained(cls, directory, **kwargs)

    def save_pretrained(self, directory, tokenizer=None):
        return pretrained.save_pretrained(self, directory, tokenizer=tokenizer)
