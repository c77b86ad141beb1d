"""The encoder-decoder Transformer (Vaswani et al. 2017) in Flax NNX.

Read it side by side with torch_reference/model.py: same modules, same names,
same steps in the same order. Shapes: B batch, S source length, T target
length, D d_model, H heads, Dh head dim, F d_ff, V vocabulary.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer import matmul
from jax_transformer.config import TransformerConfig
from jax_transformer.dropout import Dropout, relu_dropout
from jax_transformer.layer_norm import LayerNorm
from jax_transformer.masks import causal_mask, padding_mask

xavier = nnx.initializers.xavier_uniform()


@functools.lru_cache(maxsize=None)
def sinusoidal_positions(length: int, d_model: int, layout: str) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...), in float64.

    "interleaved" puts sin/cos in even/odd columns (the paper); "half_split"
    puts all sines first, then all cosines (Marian).
    """
    position = np.arange(length, dtype=np.float64)[:, None]  # (L, 1)
    angle = position / 10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    sin, cos = np.sin(angle), np.cos(angle[:, : d_model // 2])  # (L, ceil(D/2)), (L, D//2)
    table = np.zeros((length, d_model))
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = sin, cos
    else:
        table[:, : sin.shape[1]], table[:, sin.shape[1]:] = sin, cos
    return table  # (L, D)


class MultiHeadAttention(nnx.Module):
    """softmax(Q K^T / sqrt(Dh)) V over H heads, with explicit W_q, W_k, W_v, W_o."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        d = config.d_model
        linear = functools.partial(matmul.Linear, d, d, kernel_init=xavier, rngs=rngs,
                                   dtype=dtype, param_dtype=param_dtype)
        self.W_q, self.W_k, self.W_v, self.W_o = linear(), linear(), linear(), linear()
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim

    def split_heads(self, x):  # (B, L, D) -> (B, H, L, Dh)
        B, L, _ = x.shape
        return x.reshape(B, L, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    @staticmethod
    def project(x, *linears):
        """x through several of the stored Linear layers in one matmul:
        x @ [W_a | W_b | ...] + [b_a | b_b | ...], split back into one output per
        layer. Each output column is the same dot product as in W_a(x) etc.; one
        wide matmul just runs faster (on CPU) than several narrow ones. The
        parameters stay separate, so the checkpoint format does not change."""
        if len(linears) == 1:
            return [linears[0](x)]
        kernel = jnp.concatenate([layer.kernel[...] for layer in linears], axis=1)  # (D, n*D)
        bias = jnp.concatenate([layer.bias[...] for layer in linears])  # (n*D,)
        x, kernel, bias = linears[0].promote_dtype((x, kernel, bias), dtype=linears[0].dtype)
        return jnp.split(matmul.linear(x, kernel, bias), len(linears), axis=-1)  # n x (B, L, D)

    def project_kv(self, key_value):  # (B, Tk, D) -> k, v: (B, H, Tk, Dh) each
        k, v = self.project(key_value, self.W_k, self.W_v)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, query, k, v, mask=None, q=None, kv_layout: str = "bhkd"):
        """Attention of `query` (B, Tq, D) over projected keys/values, laid out
        (B, H, Tk, Dh) ("bhkd", the decoding cache) or (B, Tk, H, Dh) ("bkhd").
        `q`: the query already projected by W_q, if the caller has it.

        The heads stay in the einsums instead of being transposed out of D: the
        same products, without a copy of q and of the output per layer (~12%
        of a training step on CPU)."""
        B, Tq, _ = query.shape
        q = (self.W_q(query) if q is None else q).reshape(B, Tq, self.num_heads,
                                                           self.head_dim)  # (B, Tq, H, Dh)
        scores = jnp.einsum(f"bqhd,{kv_layout}->bhqk", q, k) / math.sqrt(self.head_dim)
        scores = scores.astype(jnp.promote_types(scores.dtype, jnp.float32))  # (B, H, Tq, Tk)
        if mask is not None:
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)  # (B, H, Tq, Tk)
        out = jnp.einsum(f"bhqk,{kv_layout}->bqhd", self.dropout(weights).astype(v.dtype),
                         v)  # (B, Tq, H, Dh)
        return self.W_o(out.reshape(B, Tq, -1)), weights  # (B, Tq, D)

    def __call__(self, query, key_value, mask=None):
        B, Tk, _ = key_value.shape
        if query is key_value:  # self-attention: Q, K and V in one matmul
            q, k, v = self.project(query, self.W_q, self.W_k, self.W_v)  # (B, T, D) each
        else:
            q = None
            k, v = self.project(key_value, self.W_k, self.W_v)  # (B, Tk, D) each
        k, v = (x.reshape(B, Tk, self.num_heads, self.head_dim) for x in (k, v))  # (B, Tk, H, Dh)
        return self.attend(query, k, v, mask, q=q, kv_layout="bkhd")


class FeedForward(nnx.Module):
    """FFN(x) = W_2 dropout(act(W_1 x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype, param_dtype):
        linear = functools.partial(matmul.Linear, kernel_init=xavier, rngs=rngs,
                                   dtype=dtype, param_dtype=param_dtype)
        self.W_1 = linear(config.d_model, config.d_ff)
        self.W_2 = linear(config.d_ff, config.d_model)
        self.dropout = Dropout(config.dropout, rngs=rngs)
        self.activation = {"relu": jax.nn.relu, "silu": jax.nn.silu,
                           "gelu": functools.partial(jax.nn.gelu, approximate=False),
                           }[config.activation]

    def __call__(self, x):  # (B, L, D) -> (B, L, D)
        # As rows (B*L, D): the dropout output then feeds W_2's matmul as it is, and
        # XLA keeps it for W_2's weight gradient rather than recomputing dropout
        # inside that gradient's transpose (jax_transformer/matmul.py).
        h = self.W_1(x.reshape(-1, x.shape[-1]))  # (B*L, F)
        keep = self.dropout.keep_mask(h) if self.activation is jax.nn.relu else None
        if keep is not None:  # the same values and gradients, a cheaper backward
            h = relu_dropout(h, keep, self.dropout.rate)
        else:
            h = self.dropout(self.activation(h))
        return self.W_2(h).reshape(x.shape)


def layer_norm(config: TransformerConfig, *, rngs, dtype, param_dtype):
    return LayerNorm(config.d_model, epsilon=config.layer_norm_eps, use_fast_variance=False,
                     rngs=rngs, dtype=dtype, param_dtype=param_dtype)


class Residual(nnx.Module):
    """The residual connection around each sublayer f, with LayerNorm after it
    (post-LN, the paper): LN(x + dropout(f(x))), or before it (pre-LN):
    x + dropout(f(LN(x))). Used as: h = norm_input(x); h = f(h); x = add_residual(x, h)."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.pre_norm = config.pre_norm
        self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

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

    def __call__(self, x, memory, src_mask, tgt_mask):  # (B, T, D), (B, S, D) -> (B, T, D)
        h = self.residual.norm_input(x, self.self_attn_norm)
        h, self_weights = self.self_attn(h, h, tgt_mask)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.cross_attn_norm)
        h, cross_weights = self.cross_attn(h, memory, src_mask)
        x = self.residual.add_residual(x, h, self.cross_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, self_weights, cross_weights

    # Incremental decoding: one target position at a time, with a key/value cache.
    def init_cache(self, memory, max_len: int):
        """Cross-attention keys/values of `memory` (B, S, D), projected once per
        sentence, and empty self-attention buffers for `max_len` positions."""
        cross_k, cross_v = self.cross_attn.project_kv(memory)  # (B, H, S, Dh)
        B, H, _, Dh = cross_k.shape
        empty = jnp.zeros((B, H, max_len, Dh), cross_k.dtype)  # (B, H, L, Dh)
        return {"self_k": empty, "self_v": empty, "cross_k": cross_k, "cross_v": cross_v}

    def decode_step(self, x, cache, position, src_mask):
        """x (B, 1, D) at `position` -> (B, 1, D) and the cache with this position's
        self-attention key/value written in. Same steps as __call__."""
        h = self.residual.norm_input(x, self.self_attn_norm)
        k, v = self.self_attn.project_kv(h)  # (B, H, 1, Dh)
        self_k = jax.lax.dynamic_update_slice_in_dim(cache["self_k"], k, position, axis=2)
        self_v = jax.lax.dynamic_update_slice_in_dim(cache["self_v"], v, position, axis=2)
        visible = (jnp.arange(self_k.shape[2]) <= position)[None, None, None, :]  # (1, 1, 1, L)
        h, _ = self.self_attn.attend(h, self_k, self_v, visible)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.cross_attn_norm)
        h, _ = self.cross_attn.attend(h, cache["cross_k"], cache["cross_v"], src_mask)
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

    def __call__(self, x, memory, src_mask, tgt_mask):
        all_self, all_cross = [], []
        for layer in self.layers:
            x, self_weights, cross_weights = layer(x, memory, src_mask, tgt_mask)
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
        self.dtype = dtype
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        embed = functools.partial(nnx.Embed, features=config.d_model, **kw,
                                  embedding_init=nnx.initializers.normal(config.d_model ** -0.5))
        if config.share_embeddings:
            self.shared_embed = embed(config.src_vocab_size)
        else:
            self.src_embed = embed(config.src_vocab_size)
            self.tgt_embed = embed(config.tgt_vocab_size)
        self.embed_dropout = nnx.Dropout(config.dropout, rngs=rngs)
        self.encoder = Encoder(config, **kw)
        self.decoder = Decoder(config, **kw)
        if not config.tie_output:
            self.output_projection = matmul.Linear(config.d_model, config.tgt_vocab_size,
                                                   use_bias=config.output_bias,
                                                   kernel_init=xavier, **kw)
        elif config.output_bias:
            self.output_bias = nnx.Param(jnp.zeros((config.tgt_vocab_size,), param_dtype))

    def source_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.src_embed

    def target_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.tgt_embed

    def embed(self, table: nnx.Embed, ids):  # (B, L) -> (B, L, D)
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len "
                             f"{self.config.max_len}")
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = sinusoidal_positions(ids.shape[1], self.config.d_model,
                                         self.config.position_layout)
        return self.embed_dropout(x + jnp.asarray(positions, x.dtype))

    def embed_step(self, table: nnx.Embed, ids, position):  # (B, 1) ids at `position` -> (B, 1, D)
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = sinusoidal_positions(self.config.max_len, self.config.d_model,
                                         self.config.position_layout)  # (max_len, D)
        row = jax.lax.dynamic_slice_in_dim(jnp.asarray(positions, x.dtype), position, 1)  # (1, D)
        return self.embed_dropout(x + row)

    def encode(self, src_ids, src_mask=None):
        """(B, S) ids -> memory (B, S, D) and each layer's self-attention weights."""
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.config.pad_id)  # (B, 1, 1, S)
        return self.encoder(self.embed(self.source_embedding(), src_ids), src_mask)

    def decode(self, tgt_ids, memory, src_mask, tgt_mask=None):
        """(B, T) ids and memory -> hidden (B, T, D), self- and cross-attention weights.

        The default target mask is causal only: targets are right-padded, so
        causality already hides every pad key from every real query (and pad
        positions are ignored by the loss). This also serves models whose
        decoder start token is the pad id (Marian).
        """
        if tgt_mask is None:
            tgt_mask = causal_mask(tgt_ids.shape[1])  # (1, 1, T, T)
        return self.decoder(self.embed(self.target_embedding(), tgt_ids), memory,
                            src_mask, tgt_mask)

    def init_cache(self, memory, max_len: int):
        """The decoding cache for `memory` (B, S, D): one dict per decoder layer with
        self-attention buffers "self_k"/"self_v" (B, H, max_len, Dh), filled as
        decoding goes, and "cross_k"/"cross_v" (B, H, S, Dh), projected here once."""
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
                 return_attention: bool = False):
        """src_ids (B, S), tgt_ids (B, T) -> logits (B, T, V).

        Masks are boolean, True = may attend, broadcastable to (B, H, Tq, Tk);
        by default the source mask hides pad keys and the target mask is causal.
        With `return_attention`, also returns {"encoder_self", "decoder_self",
        "cross"}: lists of (B, H, Tq, Tk) weights, one per layer.
        """
        if src_mask is None:
            src_mask = padding_mask(src_ids, self.config.pad_id)
        memory, encoder_self = self.encode(src_ids, src_mask)
        hidden, decoder_self, cross = self.decode(tgt_ids, memory, src_mask, tgt_mask)
        logits = self.project(hidden)
        if return_attention:
            return logits, {"encoder_self": encoder_self, "decoder_self": decoder_self,
                            "cross": cross}
        return logits

    # The checkpoint directory format (see jax_transformer.interchange).
    @classmethod
    def from_pretrained(cls, directory, **kwargs) -> "Transformer":
        from jax_transformer.weights import load_pretrained
        return load_pretrained(directory, **kwargs)

    def save_pretrained(self, directory, tokenizer=None):
        from jax_transformer.weights import save_pretrained
        return save_pretrained(self, directory, tokenizer=tokenizer)
