"""Models wrapping torch.nn.Transformer -> our checkpoint directory.

What a state dict cannot say (heads, activation, norm_first, embedding scaling,
position layout, special ids) comes from a mapping (flags or a JSON file);
the defaults follow torch.nn.Transformer and the PyTorch translation tutorial.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.options import Format, defaults, option, types
from jax_transformer.port.reading import (PortError, TensorConsumer, check_field_types,
                                          read_weights)
from transformer_core import checkpoint_dir
from transformer_core.config import ConfigError, TransformerConfig


SOURCE = "torch-nn-transformer"
ACTIVATIONS = ("relu", "gelu", "silu")
POSITION_LAYOUTS = ("interleaved", "half_split")


@dataclasses.dataclass(frozen=True)
class TorchNNMapping:
    """--from torch-nn-transformer's mapping (flags, or a --mapping JSON file): where
    the wrapper keeps its tensors (module prefixes or full ".weight" keys), then what
    the state dict cannot say (the wrapper's forward, nn.Transformer's arguments).
    torch_nn_encoder.TorchNNEncoderMapping takes most of these fields (like())."""
    transformer: str | None = option(None, "the nn.Transformer's module prefix",
                                     flag="--transformer-prefix",
                                     unset="found in the state dict")
    src_embed: str = option("src_embed", "source embedding module or key")
    tgt_embed: str = option("tgt_embed", "target embedding module or key; the src_embed "
                            "name for a shared table")
    output: str = option("generator", "output nn.Linear; the embedding's name if tied; "
                         "torch-nn-encoder encoder_only: '' for none")
    ignore: list[str] = option(help="drop keys with this prefix (repeatable)", factory=list,
                               action="append")
    num_heads: int | None = option(None, "attention heads; required: nhead is not in the "
                                   "state dict")
    activation: str = option("relu", "the layers' activation", choices=ACTIVATIONS)
    norm_first: bool = option(False, "pre-LN layers, nn.Transformer's norm_first")
    layer_norm_eps: float = option(1e-5, "the LayerNorms' epsilon")
    scale_embeddings: bool = option(True, "embeddings times sqrt(d_model), as in the "
                                    "PyTorch tutorials")
    position_layout: str | None = option("interleaved", "the sinusoids' layout",
                                         choices=POSITION_LAYOUTS)
    max_len: int | None = option(512, "the positions the model takes")
    dropout: float = option(0.1, "the dropout rate, for training")
    pad_id: int = option(0, "padding token id")
    bos_id: int = option(2, "start token id, the decoder's first input")
    eos_id: int = option(3, "end token id")


TORCH_NN_DEFAULTS: dict[str, Any] = defaults(TorchNNMapping)


def torch_nn_transformer_tensors(sd: Mapping[str, np.ndarray], spec: Mapping[str, Any]
                                 ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """A state dict of a model wrapping torch.nn.Transformer -> (our config, our tensors).

    Attention's packed `in_proj_weight` is split (LayerCopier). Decoder layers'
    norm1/norm2/norm3 are our self-attn, cross-attn and FFN norms; nn.Transformer
    always has a final LayerNorm after each stack.
    """
    spec = merge_spec(spec, TorchNNMapping, SOURCE)
    prefix = find_prefix(sd, spec["transformer"], "encoder.layers.0.self_attn.in_proj_weight",
                         "nn.Transformer", "--transformer-prefix",
                         exclude="decoder.layers.0.self_attn.in_proj_weight")
    ignore = tuple(spec["ignore"])
    c = TensorConsumer({k: v for k, v in sd.items() if not (ignore and k.startswith(ignore))},
                       "torch.nn.Transformer state dict")
    t = lambda name: f"{prefix}{name}"  # noqa: E731
    n_enc, n_dec = count_layers(c, t("encoder.")), count_layers(c, t("decoder."))
    if not n_enc or not n_dec:
        raise PortError(f"no encoder/decoder layers under {prefix!r}")
    copy = LayerCopier(c, c.tensors[t("encoder.layers.0.self_attn.in_proj_weight")])
    out, norm, d = copy.out, copy.norm, copy.d

    for i in range(n_enc):
        copy.encoder_layer(t(f"encoder.layers.{i}"), f"encoder.layers.{i}")
    for i in range(n_dec):
        s, o = t(f"decoder.layers.{i}"), f"decoder.layers.{i}"
        copy.attention(f"{s}.self_attn", f"{o}.self_attn")
        norm(f"{s}.norm1", f"{o}.self_attn_norm")
        copy.attention(f"{s}.multihead_attn", f"{o}.cross_attn")
        norm(f"{s}.norm2", f"{o}.cross_attn_norm")
        copy.linear(f"{s}.linear1", f"{o}.ffn.W_1"); copy.linear(f"{s}.linear2", f"{o}.ffn.W_2")
        norm(f"{s}.norm3", f"{o}.ffn_norm")
    norm(t("encoder.norm"), "encoder.final_norm")
    norm(t("decoder.norm"), "decoder.final_norm")

    src_name, tgt_name = strip(spec["src_embed"]), strip(spec["tgt_embed"])
    out_name = strip(spec["output"])
    src_table = c.take(f"{src_name}.weight")
    tgt_table = c.take(f"{tgt_name}.weight")
    share = src_name == tgt_name or (src_table.shape == tgt_table.shape
                                     and np.array_equal(src_table, tgt_table))
    if share:
        out["shared_embed.weight"] = src_table
    else:
        out["src_embed.weight"], out["tgt_embed.weight"] = src_table, tgt_table
    head = c.take(f"{out_name}.weight")
    has_bias = f"{out_name}.bias" in c
    # Tied when named so, or when the weights are equal (then tying computes the same).
    tie = out_name == tgt_name or (head.shape == tgt_table.shape and np.array_equal(head, tgt_table))
    if tie:
        if has_bias:
            out["output_bias"] = c.take(f"{out_name}.bias")
    else:
        out["output_projection.weight"] = head
        if has_bias:
            out["output_projection.bias"] = c.take(f"{out_name}.bias")
    c.check_all_used(hint="; name them in the mapping (src_embed, tgt_embed, output) or drop "
                          "them with --ignore PREFIX")
    try:  # the mapping's values as given: the config checks their types
        config = TransformerConfig(
            src_vocab_size=src_table.shape[0], tgt_vocab_size=tgt_table.shape[0], d_model=d,
            num_heads=spec["num_heads"], d_ff=out["encoder.layers.0.ffn.W_1.weight"].shape[0],
            num_encoder_layers=n_enc, num_decoder_layers=n_dec, dropout=spec["dropout"],
            max_len=spec["max_len"], pad_id=spec["pad_id"], bos_id=spec["bos_id"],
            eos_id=spec["eos_id"], pre_norm=spec["norm_first"], final_norm=True,
            activation=spec["activation"], layer_norm_eps=spec["layer_norm_eps"],
            scale_embeddings=spec["scale_embeddings"],
            position_layout=spec["position_layout"], share_embeddings=share, tie_output=tie,
            output_bias=has_bias)
    except ConfigError as e:
        raise PortError(f"torch.nn.Transformer mapping gives an invalid config: {e}") from e
    return config, out


def convert_torch_nn_transformer(src: str | Path, out_dir: str | Path,
                                 spec: Mapping[str, Any]) -> TransformerConfig:
    config, tensors = torch_nn_transformer_tensors(read_weights(src), spec)
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:
        checkpoint_dir.save_dir(tmp, config, tensors)
    return config


FORMAT = Format(SOURCE, convert_torch_nn_transformer, TorchNNMapping)


# ------------------------------------------------------------------ shared with torch_nn_encoder.py

def merge_spec(spec: Mapping[str, Any], mapping: type, source: str) -> dict:
    """The mapping over the defaults of `mapping` (TorchNNMapping or TorchNNEncoderMapping);
    unknown fields and values of another type than its fields' are errors."""
    fields = defaults(mapping)
    merged = {**fields, **{k: v for k, v in spec.items() if v is not None}}
    unknown = sorted(set(merged) - set(fields))
    if unknown:
        raise PortError(f"unknown {source} mapping field(s): {', '.join(unknown)}")
    check_field_types(merged, types(mapping), f"{source} mapping")
    if merged["num_heads"] is None:
        raise PortError("--num-heads is required: nhead is not in the state dict")
    return merged


def find_prefix(sd: Mapping[str, np.ndarray], prefix: str | None, suffix: str, what: str,
                flag: str, exclude: str | None = None) -> str:
    """The module prefix under which `sd` holds `suffix` ("" at the top): `prefix` as
    given, or found as the one key ending in `suffix` (and not in `exclude`)."""
    if prefix is None:
        hits = [k[: -len(suffix)] for k in sd
                if k.endswith(suffix) and not (exclude and k.endswith(exclude))]
        if len(hits) != 1:
            raise PortError(f"cannot find one {what} in the state dict (looked for "
                            f"'*{suffix}', found {len(hits)}); name it with {flag}")
        return hits[0]
    return prefix + "." if prefix and not prefix.endswith(".") else prefix


def count_layers(c: TensorConsumer, prefix: str) -> int:
    """How many `{prefix}layers.<i>` an nn.TransformerEncoder/Decoder holds."""
    n = 0
    while f"{prefix}layers.{n}.self_attn.in_proj_weight" in c:
        n += 1
    return n


def strip(name: str) -> str:
    """A module name from a module or ".weight" key name."""
    return name[: -len(".weight")] if name.endswith(".weight") else name


class LayerCopier:
    """torch.nn layers' tensors, taken from `c`, into `out` under our names.
    `like` is one attention in_proj_weight (3D, D): it gives D and the dtype.
    Biases that the source lacks (bias=False) become zeros."""

    def __init__(self, c: TensorConsumer, like: np.ndarray):
        self.c, self.d, self.dtype, self.out = c, like.shape[1], like.dtype, {}

    def bias_or_zeros(self, key: str, n: int) -> np.ndarray:
        return self.c.take(key) if key in self.c else np.zeros((n,), self.dtype)

    def linear(self, src: str, ours: str) -> None:
        self.out[f"{ours}.weight"] = weight = self.c.take(f"{src}.weight")
        self.out[f"{ours}.bias"] = self.bias_or_zeros(f"{src}.bias", weight.shape[0])

    def norm(self, src: str, ours: str) -> None:
        self.out[f"{ours}.weight"] = self.c.take(f"{src}.weight")
        self.out[f"{ours}.bias"] = self.bias_or_zeros(f"{src}.bias", self.d)

    def attention(self, src: str, ours: str) -> None:
        """nn.MultiheadAttention packs Q, K, V into one in_proj_weight (3D, D), rows in
        that order; they are split here."""
        for separate in ("q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v"):
            if f"{src}.{separate}" in self.c:
                raise PortError(f"{src}.{separate}: attention with kdim/vdim != d_model or "
                                "add_bias_kv is not supported")
        d = self.d
        in_w = self.c.take(f"{src}.in_proj_weight")  # (3D, D): rows are Q, then K, then V
        in_b = self.bias_or_zeros(f"{src}.in_proj_bias", 3 * d)
        for j, name in enumerate(("W_q", "W_k", "W_v")):
            self.out[f"{ours}.{name}.weight"] = in_w[j * d:(j + 1) * d]
            self.out[f"{ours}.{name}.bias"] = in_b[j * d:(j + 1) * d]
        self.linear(f"{src}.out_proj", f"{ours}.W_o")

    def encoder_layer(self, src: str, ours: str) -> None:
        """nn.TransformerEncoderLayer: norm1 is the self-attention's norm, norm2 the FFN's."""
        self.attention(f"{src}.self_attn", f"{ours}.self_attn")
        self.norm(f"{src}.norm1", f"{ours}.self_attn_norm")
        self.linear(f"{src}.linear1", f"{ours}.ffn.W_1")
        self.linear(f"{src}.linear2", f"{ours}.ffn.W_2")
        self.norm(f"{src}.norm2", f"{ours}.ffn_norm")
