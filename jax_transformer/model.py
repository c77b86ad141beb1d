"""The Transformer (Vaswani et al. 2017) in Flax NNX, in three architectures:
the encoder-decoder translator, an encoder-only stack and a decoder-only
language model, built from the layers in jax_transformer/layers.py.

Read it side by side with torch_reference/model.py: same modules, same names,
same steps in the same order. Shapes: B batch, S source length, T target
length, L any length, D d_model, H heads, Dh head dim, V vocabulary.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer import pretrained
from jax_transformer.kernels import linear as linear_kernels
from jax_transformer.kernels.dropout import Dropout
from jax_transformer.layers import Decoder, Encoder, linear
from jax_transformer.masks import causal_mask, padding_mask
from transformer_core.checkpoint_dir import CONFIG_FILE
from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.positions import position_rows


def table_init(config: TransformerConfig):
    """An embedding table's initialiser, as config.weight_init says."""
    return nnx.initializers.normal(config.d_model ** -0.5 if config.weight_init == "xavier"
                                   else config.init_std)


def token_table_init(config: TransformerConfig):
    """A token table's initialiser: table_init's, with padding's row 0 for weight_init
    normal (Marian's)."""
    draw = table_init(config)
    if config.weight_init == "xavier":
        return draw
    def init(key, shape, dtype=jnp.float32):  # (V, D), padding's row 0
        kept = np.arange(shape[0]) != config.pad_id  # a host mask: no scalar staged
        return draw(key, shape, dtype) * kept[:, None].astype(dtype)
    return init


class TokenModel(nnx.Module):
    """What the three architectures share: token embeddings and positions, the
    output projection, and the checkpoint directory.

    `dtype` is the compute dtype (bfloat16 for mixed precision); parameters are
    kept in `param_dtype`. Use `nnx.view(model, deterministic=True)` for eval.
    """

    architecture = "encoder_decoder"  # the config.architecture each subclass builds

    def init_embeddings(self, config: TransformerConfig, **kw):
        if config.architecture != self.architecture:
            raise ConfigError(f"the config is {config.architecture!r}, but "
                              f"{type(self).__name__} builds {self.architecture!r} models "
                              f"(build_model(config) picks the class)")
        self.config = config
        embed = functools.partial(nnx.Embed, features=config.d_model, **kw)
        token_embed = functools.partial(embed, embedding_init=token_table_init(config))
        if config.share_embeddings:
            self.shared_embed = token_embed(config.src_vocab_size)
        else:
            self.src_embed = token_embed(config.src_vocab_size)
            self.tgt_embed = token_embed(config.tgt_vocab_size)
        if config.position_encoding == "learned":
            self.position_embed = embed(config.max_len + config.position_offset,
                                        embedding_init=table_init(config))
        self.embed_dropout = Dropout(config.dropout, rngs=kw["rngs"])

    def init_output(self, config: TransformerConfig, **kw):
        if not config.tie_output:
            self.output_projection = linear(config, config.d_model, config.tgt_vocab_size,
                                            bias=config.output_bias, **kw)
        elif config.output_bias:
            self.output_bias = nnx.Param(jnp.zeros((config.tgt_vocab_size,),
                                                   kw["param_dtype"]))

    def source_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.src_embed

    def target_embedding(self) -> nnx.Embed:
        return self.shared_embed if self.config.share_embeddings else self.tgt_embed

    def position_vectors(self, positions, dtype):  # (B|1, L) -> (B|1, L, D), or None
        """What is added to the token embeddings at `positions`."""
        if self.config.position_encoding == "none":
            return None
        if self.config.position_encoding == "learned":
            return self.position_embed(positions + self.config.position_offset)
        return jnp.asarray(position_rows(self.config), dtype)[positions]  # (max_len, D) rows

    def embed(self, table: nnx.Embed, ids, positions=None):  # (B, L) -> (B, L, D)
        """Token embeddings plus each position's vector: 0..L-1 by default, or
        `positions` (B, L) (packed rows restart at 0 for each sequence)."""
        if ids.shape[1] > self.config.max_len:
            raise ValueError(f"sequence length {ids.shape[1]} exceeds max_len "
                             f"{self.config.max_len}")
        x = table(ids)
        if self.config.scale_embeddings:
            x = x * math.sqrt(self.config.d_model)
        if positions is None:
            positions = jnp.arange(ids.shape[1])[None]  # (1, L)
        pe = self.position_vectors(positions, x.dtype)
        return self.embed_dropout(x if pe is None else x + pe)

    def embed_step(self, table: nnx.Embed, ids, position):  # (B, 1) ids at `position` -> (B, 1, D)
        return self.embed(table, ids, jnp.reshape(position, (1, 1)))

    def project(self, hidden):  # (B, T, D) -> (B, T, V)
        if self.config.tie_output:
            table = self.target_embedding().embedding[...].astype(hidden.dtype)  # (V, D)
            bias = (self.output_bias[...].astype(hidden.dtype) if self.config.output_bias
                    else None)
            return linear_kernels.linear(hidden, table.T, bias)
        return self.output_projection(hidden)

    # The checkpoint directory format (see transformer_core.checkpoint_dir).
    @classmethod
    def from_pretrained(cls, directory, **kwargs):
        """Build from a checkpoint directory (see jax_transformer.pretrained.load_pretrained)."""
        return pretrained.load_pretrained(cls, directory, **kwargs)

    def save_pretrained(self, directory, tokenizer=None):
        return pretrained.save_pretrained(self, directory, tokenizer=tokenizer)


class Transformer(TokenModel):
    """The encoder-decoder: source and target token ids in, next-token logits out."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.init_embeddings(config, **kw)
        self.encoder = Encoder(config, **kw)
        self.decoder = Decoder(config, **kw)
        self.init_output(config, **kw)

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


class EncoderOnlyTransformer(TokenModel):
    """One bidirectional stack: token ids in, hidden states (`encode`) or logits out."""

    architecture = "encoder_only"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.init_embeddings(config, **kw)
        self.encoder = Encoder(config, **kw)
        self.init_output(config, **kw)

    def encode(self, ids, mask=None, positions=None):
        """(B, L) ids -> hidden states (B, L, D) and each layer's attention weights.
        The default mask hides pad keys."""
        if mask is None:
            mask = padding_mask(ids, self.config.pad_id)  # (B, 1, 1, L)
        return self.encoder(self.embed(self.shared_embed, ids, positions), mask)

    def __call__(self, ids, mask=None, return_attention: bool = False, *, positions=None):
        """(B, L) ids -> logits (B, L, V); with `return_attention`, also
        {"encoder_self": a (B, H, L, L) list, one per layer}."""
        hidden, weights = self.encode(ids, mask, positions)
        logits = self.project(hidden)
        return (logits, {"encoder_self": weights}) if return_attention else logits


class DecoderOnlyTransformer(TokenModel):
    """A causal stack without cross-attention: a language model over token ids."""

    architecture = "decoder_only"

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.init_embeddings(config, **kw)
        self.decoder = Decoder(config, **kw)
        self.init_output(config, **kw)

    def decode(self, ids, mask=None, positions=None):
        """(B, L) ids -> hidden states (B, L, D) and each layer's attention weights.
        The default mask is causal only: sequences are right-padded, so no real
        query sees a pad key."""
        if mask is None:
            mask = causal_mask(ids.shape[1])  # (1, 1, L, L)
        hidden, weights, _ = self.decoder(self.embed(self.shared_embed, ids, positions), None,
                                          None, mask)
        return hidden, weights

    def __call__(self, ids, mask=None, return_attention: bool = False, *, positions=None):
        """(B, L) ids -> next-token logits (B, L, V); with `return_attention`, also
        {"decoder_self": a (B, H, L, L) list, one per layer}."""
        hidden, weights = self.decode(ids, mask, positions)
        logits = self.project(hidden)
        return (logits, {"decoder_self": weights}) if return_attention else logits

    def init_cache(self, batch_size: int, max_len: int, dtype=jnp.float32):
        """Empty self-attention buffers "self_k"/"self_v" (B, H, max_len, Dh), one
        dict per layer, filled as decoding goes. `dtype`: the compute dtype."""
        if max_len > self.config.max_len:
            raise ValueError(f"decoding length {max_len} exceeds max_len {self.config.max_len}")
        return self.decoder.init_self_cache(batch_size, max_len, dtype)

    def decode_step(self, ids, cache, position):
        """Incremental decoding: ids (B, 1) at `position` (a scalar, may be traced)
        -> next-token logits (B, V) and the updated cache. Feeding positions
        0, 1, ... in turn gives the same logits as the whole prefix at once."""
        x = self.embed_step(self.shared_embed, ids, position)  # (B, 1, D)
        hidden, cache = self.decoder.decode_step(x, cache, position, None)
        return self.project(hidden)[:, 0], cache  # (B, V)


MODEL_CLASSES = {"encoder_decoder": Transformer, "encoder_only": EncoderOnlyTransformer,
                 "decoder_only": DecoderOnlyTransformer}


def build_model(config: TransformerConfig, *, rngs: nnx.Rngs, **kwargs) -> TokenModel:
    """The model class for `config.architecture`, built."""
    return MODEL_CLASSES[config.architecture](config, rngs=rngs, **kwargs)


def from_pretrained(directory, **kwargs) -> TokenModel:
    """Any architecture's checkpoint directory, as the model class its config names."""
    config = TransformerConfig.from_json(Path(directory) / CONFIG_FILE)
    return MODEL_CLASSES[config.architecture].from_pretrained(directory, **kwargs)
