"""The encoder-decoder Transformer (Vaswani et al. 2017) in PyTorch.

The reference for jax_transformer/model.py: same modules, same names, same
steps in the same order, each operation written out as the paper states it.
Shapes: B batch, S source length, T target length, D d_model, H heads, Dh head
dim, F d_ff, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import position_rows
from torch_reference.masks import causal_mask, padding_mask


def linear(n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.xavier_uniform_(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def attention(q, k, v, mask, dropout: nn.Dropout):
    """softmax(q k^T / sqrt(Dh)) v for every head: q (B, Tq, H, Dh), k and v (B, Tk, H, Dh)
    -> out (B, Tq, H, Dh), weights (B, H, Tq, Tk). Masked scores get finfo.min."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, L, Dh)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32))
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (B, H, Tq, Tk)
    out = dropout(weights).to(v.dtype) @ v  # (B, H, Tq, Dh)
    return out.transpose(1, 2), weights  # (B, Tq, H, Dh)


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(Dh)) V over H heads, with explicit W_q, W_k, W_v, W_o."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        d = config.d_model
        self.W_q, self.W_k, self.W_v, self.W_o = linear(d, d), linear(d, d), linear(d, d), linear(d, d)
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

    def forward(self, query, key_value, mask=None):  # (B, Tq, D), (B, Tk, D) -> (B, Tq, D)
        return self.attend(*self.project(query, key_value), mask)


class FeedForward(nn.Module):
    """FFN(x) = W_2 dropout(act(W_1 x))."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.W_1 = linear(config.d_model, config.d_ff)
        self.W_2 = linear(config.d_ff, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.activation = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}[config.activation]

    def forward(self, x):  # (B, L, D) -> (B, L, F) -> (B, L, D)
        return self.W_2(self.dropout(self.activation(self.W_1(x))))


def layer_norm(config: TransformerConfig) -> nn.LayerNorm:
    return nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)


class Residual(nn.Module):
    """The residual connection around each sublayer f, with LayerNorm after it
    (post-LN, the paper): LN(x + dropout(f(x))), or before it (pre-LN):
    x + dropout(f(LN(x))). Used as: h = norm_input(x); h = f(h); x = add_residual(x, h)."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.pre_norm = config.pre_norm
        self.dropout = nn.Dropout(config.dropout)

    def norm_input(self, x, norm):
        return norm(x) if self.pre_norm else x

    def add_residual(self, x, sublayer_out, norm):
        x = x + self.dropout(sublayer_out)
        return x if self.pre_norm else norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_norm = layer_norm(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.residual = Residual(config)

    def forward(self, x, src_mask):  # (B, S, D) -> (B, S, D)
        h = self.residual.norm_input(x, self.self_attn_norm)
        h, self_weights = self.self_attn(h, h, src_mask)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, self_weights


class DecoderLayer(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.self_attn_norm = layer_norm(config)
        self.cross_attn = MultiHeadAttention(config)
        self.cross_attn_norm = layer_norm(config)
        self.ffn = FeedForward(config)
        self.ffn_norm = layer_norm(config)
        self.residual = Residual(config)

    def forward(self, x, memory, memory_mask, tgt_mask):  # (B, T, D), (B, S, D) -> (B, T, D)
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
        empty = cross_k.new_zeros(B, max_len, H, Dh)  # (B, L, H, Dh)
        return {"self_k": empty, "self_v": empty.clone(), "cross_k": cross_k, "cross_v": cross_v}

    def decode_step(self, x, cache, position, src_mask):
        """x (B, 1, D) at `position` -> (B, 1, D) and the cache with this position's
        self-attention key/value written in (in place here; JAX returns a new one).
        Same steps as forward."""
        h = self.residual.norm_input(x, self.self_attn_norm)
        q, k, v = self.self_attn.project(h, h)  # (B, 1, H, Dh) each
        self_k, self_v = cache["self_k"], cache["self_v"]  # (B, L, H, Dh)
        self_k[:, position] = k[:, 0]
        self_v[:, position] = v[:, 0]
        visible = (torch.arange(self_k.shape[1], device=x.device) <= position)[None, None, None, :]  # (1, 1, 1, L)
        h, _ = self.self_attn.attend(q, self_k, self_v, visible)
        x = self.residual.add_residual(x, h, self.self_attn_norm)
        h = self.residual.norm_input(x, self.cross_attn_norm)
        q = self.cross_attn.project_q(h)  # (B, 1, H, Dh)
        h, _ = self.cross_attn.attend(q, cache["cross_k"], cache["cross_v"], src_mask)
        x = self.residual.add_residual(x, h, self.cross_attn_norm)
        h = self.residual.norm_input(x, self.ffn_norm)
        x = self.residual.add_residual(x, self.ffn(h), self.ffn_norm)
        return x, {**cache, "self_k": self_k, "self_v": self_v}


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

    def forward(self, x, memory, memory_mask, tgt_mask):
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


class Transformer(nn.Module):
    """Token ids in, next-token logits out. Use `model.eval()` for eval mode."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config

        def embed(vocab_size):
            table = nn.Embedding(vocab_size, config.d_model)
            nn.init.normal_(table.weight, std=config.d_model ** -0.5)
            return table

        if config.share_embeddings:
            self.shared_embed = embed(config.src_vocab_size)
        else:
            self.src_embed = embed(config.src_vocab_size)
            self.tgt_embed = embed(config.tgt_vocab_size)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        if not config.tie_output:
            self.output_projection = linear(config.d_model, config.tgt_vocab_size,
                                            bias=config.output_bias)
        elif config.output_bias:
            self.output_bias = nn.Parameter(torch.zeros(config.tgt_vocab_size))

    def source_embedding(self) -> nn.Embedding:
        return self.shared_embed if self.config.share_embeddings else self.src_embed

    def target_embedding(self) -> nn.Embedding:
        return self.shared_embed if self.config.share_embeddings else self.tgt_embed

    @property
    def device(self) -> torch.device:
        """Where the parameters live; decoding makes its tensors there."""
        return self.target_embedding().weight.device

    def embed(self, table: nn.Embedding, ids, positions=None):  # (B, L) -> (B, L, D)
        """Token embeddings plus the sinusoid of each position: 0..L-1 by default, or
        `positions` (B, L) (packed rows restart at 0 for each pair)."""
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len "
                             f"{self.config.max_len}")
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        table_pe = torch.tensor(position_rows(self.config), dtype=x.dtype,
                                device=x.device)  # (max_len, D)
        pe = table_pe[: ids.shape[1]] if positions is None else table_pe[positions]  # (L|B, L, D)
        return self.embed_dropout(x + pe)

    def embed_step(self, table: nn.Embedding, ids, position):  # (B, 1) ids at `position` -> (B, 1, D)
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        positions = position_rows(self.config)  # (max_len, D)
        row = torch.tensor(positions[position:position + 1], dtype=x.dtype, device=x.device)  # (1, D)
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
            tgt_mask = causal_mask(tgt_ids.shape[1], tgt_ids.device)  # (1, 1, T, T)
        return self.decoder(self.embed(self.target_embedding(), tgt_ids, positions), memory,
                            memory_mask, tgt_mask)

    def init_cache(self, memory, max_len: int):
        """The decoding cache for `memory` (B, S, D): one dict per decoder layer with
        self-attention buffers "self_k"/"self_v" (B, max_len, H, Dh), filled as
        decoding goes, and "cross_k"/"cross_v" (B, S, H, Dh), projected here once."""
        if max_len > self.config.max_len:
            raise ValueError(f"decoding length {max_len} exceeds max_len {self.config.max_len}")
        return self.decoder.init_cache(memory, max_len)

    def decode_step(self, tgt_ids, cache, position: int, src_mask):
        """Incremental decoding: tgt_ids (B, 1) at `position` -> next-token logits
        (B, V) and the updated cache. Feeding positions 0, 1, ... in turn gives
        the same logits as `project(decode(...))` on the whole prefix with the
        default (causal) target mask."""
        x = self.embed_step(self.target_embedding(), tgt_ids, position)  # (B, 1, D)
        hidden, cache = self.decoder.decode_step(x, cache, position, src_mask)
        return self.project(hidden)[:, 0], cache  # (B, V)

    def project(self, hidden):  # (B, T, D) -> (B, T, V)
        if self.config.tie_output:
            logits = hidden @ self.target_embedding().weight.T
            if self.config.output_bias:
                logits = logits + self.output_bias
            return logits
        return self.output_projection(hidden)

    def forward(self, src_ids, tgt_ids, src_mask=None, tgt_mask=None,
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

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """torch's load_state_dict, but with every key and shape checked before any
        tensor is copied, so a bad state dict leaves the model untouched."""
        if strict:
            checkpoint_dir.check_state_dict(state_dict, self.config)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    # The checkpoint directory format (see transformer_core.checkpoint_dir).
    @classmethod
    def from_pretrained(cls, directory, dtype: torch.dtype | None = None,
                        device: torch.device | str | None = None) -> "Transformer":
        """Build from a checkpoint directory; `dtype` defaults to the file's,
        `device` to the CPU."""
        config, tensors = checkpoint_dir.load_dir(directory)
        state_dict = {k: torch.from_numpy(v) for k, v in tensors.items()}
        model = cls(config).to(device=device, dtype=dtype or next(iter(state_dict.values())).dtype)
        model.load_state_dict(state_dict, strict=True)
        return model

    def save_pretrained(self, directory, tokenizer=None):
        tensors = {k: v.detach().cpu().numpy() for k, v in self.state_dict().items()}
        return checkpoint_dir.save_dir(directory, self.config, tensors, tokenizer=tokenizer)
