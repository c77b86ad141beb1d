"""Models built on torch.nn.TransformerEncoder -> our decoder_only or encoder_only
checkpoint directory.

The defaults follow the PyTorch language-modelling tutorial's model: `embedding`
(times sqrt(d_model)), a PositionalEncoding buffer `pos_encoder.pe`, an
nn.TransformerEncoder, a `linear` head. Whether its forward passes a square
subsequent mask is not in the state dict: `architecture` says it (decoder_only:
causal, a language model; encoder_only: bidirectional). The encoder's layers
become ours (under `decoder.` in a decoder_only model); its `norm`, when
present, is final_norm. Positions: "sinusoidal" checks a stored table against
our layouts (computed, not copied), "learned" copies the table into
position_embed, "none" has none. batch_first changes no weight: a batch_first=False
model takes (L, B) ids where ours take (B, L).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.fairseq import POSITION_TOLERANCE_PER_ROW
from jax_transformer.port.options import Format, defaults, like, option
from jax_transformer.port.reading import PortError, TensorConsumer, read_weights
from jax_transformer.port.torch_nn import (LayerCopier, TorchNNMapping, count_layers,
                                           find_prefix, merge_spec, strip)
from transformer_core import checkpoint_dir
from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.errors import listing
from transformer_core.positions import sinusoidal_positions

ARCHITECTURES = ("decoder_only", "encoder_only")
POSITIONS = ("sinusoidal", "learned", "none")

SOURCE = "torch-nn-encoder"


@dataclasses.dataclass(frozen=True)
class TorchNNEncoderMapping:
    """--from torch-nn-encoder's mapping: what the model's forward passes (the
    architecture), where it keeps its tensors (module prefixes or full ".weight" keys),
    then what the state dict cannot say; the fields it shares with torch-nn-transformer
    are TorchNNMapping's (like()), with their help and, unless given here, default."""
    architecture: str | None = option(None, "decoder_only when the forward passes a square "
                                      "subsequent mask (a language model), else "
                                      "encoder_only; required", choices=ARCHITECTURES)
    encoder: str | None = option(None, "the nn.TransformerEncoder's module prefix",
                                 flag="--encoder-prefix", unset="found in the state dict")
    embed: str = option("embedding", "token embedding module or key")
    output: str = like(TorchNNMapping, "output", "linear")
    positions: str = option("sinusoidal", "a stored sinusoid table, checked; a learned one, "
                            "copied; or none", choices=POSITIONS)
    position_key: str = option("pos_encoder.pe", "the position table's key; '' for sinusoids "
                               "the forward makes")
    ignore: list[str] = like(TorchNNMapping, "ignore")
    num_heads: int | None = like(TorchNNMapping, "num_heads")
    activation: str = like(TorchNNMapping, "activation")
    norm_first: bool = like(TorchNNMapping, "norm_first")
    layer_norm_eps: float = like(TorchNNMapping, "layer_norm_eps")
    scale_embeddings: bool = like(TorchNNMapping, "scale_embeddings")
    position_layout: str | None = like(TorchNNMapping, "position_layout", None,
                                       unset="the one a stored table matches")
    max_len: int | None = like(TorchNNMapping, "max_len", None,
                               unset="the position table's rows, 512 without one")
    dropout: float = like(TorchNNMapping, "dropout")
    pad_id: int = like(TorchNNMapping, "pad_id")
    bos_id: int = like(TorchNNMapping, "bos_id")
    eos_id: int = like(TorchNNMapping, "eos_id")


TORCH_NN_ENCODER_DEFAULTS: dict[str, Any] = defaults(TorchNNEncoderMapping)
LAYER_KEYS = ("self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
              "linear2.weight", "norm1.weight", "norm2.weight")


def torch_nn_encoder_tensors(sd: Mapping[str, np.ndarray], spec: Mapping[str, Any]
                             ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """A state dict of a model built on torch.nn.TransformerEncoder -> (our config,
    our tensors)."""
    spec = merge_spec(spec, TorchNNEncoderMapping, SOURCE)
    arch, kind = spec["architecture"], spec["positions"]
    if arch not in ARCHITECTURES:
        raise PortError("--architecture is required: decoder_only (the encoder runs under "
                        "a square subsequent mask: a language model) or encoder_only "
                        f"(bidirectional), got {arch!r}")
    if kind not in POSITIONS:
        raise PortError(f"positions must be one of {', '.join(POSITIONS)}, got {kind!r}")
    if spec["position_layout"] is not None and kind != "sinusoidal":
        raise PortError(f"--position-layout applies to sinusoidal positions, not {kind!r}")
    prefix = find_prefix(sd, spec["encoder"], "layers.0.self_attn.in_proj_weight",
                         "nn.TransformerEncoder", "--encoder-prefix")
    ignore = tuple(spec["ignore"])
    c = TensorConsumer({k: v for k, v in sd.items() if not (ignore and k.startswith(ignore))},
                       "torch.nn.TransformerEncoder state dict")
    n = count_layers(c, prefix)
    embed = strip(spec["embed"])
    head = strip(spec["output"]) if spec["output"] else None
    pos_key = (spec["position_key"] or None) if kind != "none" else None
    if kind == "learned" and pos_key is None:
        raise PortError("--positions learned needs the table's key: --position-key")
    needed = [f"{embed}.weight", *([f"{head}.weight"] if head else []),
              *([pos_key] if pos_key else []),
              *(f"{prefix}layers.{i}.{k}" for i in range(max(n, 1)) for k in LAYER_KEYS)]
    missing = [k for k in needed if k not in c]
    if missing:
        raise PortError(f"the state dict has no {listing(missing)}; name the modules with "
                        "--embed, --output, --position-key, --encoder-prefix (or --mapping)")
    if head is None and arch == "decoder_only":
        raise PortError("a decoder_only model needs its output projection: name it with "
                        "--output (an encoder_only model may have none)")

    copy = LayerCopier(c, c.tensors[f"{prefix}layers.0.self_attn.in_proj_weight"])
    out, d = copy.out, copy.d
    stack = "decoder" if arch == "decoder_only" else "encoder"
    for i in range(n):
        copy.encoder_layer(f"{prefix}layers.{i}", f"{stack}.layers.{i}")
    final_norm = f"{prefix}norm.weight" in c
    if final_norm:
        copy.norm(f"{prefix}norm", f"{stack}.final_norm")
    out["shared_embed.weight"] = table = c.take(f"{embed}.weight")
    if table.ndim != 2 or table.shape[1] != d:
        raise PortError(f"{embed}.weight has shape {table.shape}, expected (vocab, {d})")
    tie, has_bias = copy_head(c, out, head, embed, table)
    layout, max_len = positions(c, out, spec, pos_key, d)
    c.check_all_used(hint="; name them in the mapping (embed, output, position_key) or drop "
                          "them with --ignore PREFIX")
    vocab = table.shape[0]
    if not 0 <= spec["pad_id"] < vocab:  # before the config's own, less specific check
        raise PortError(f"--pad-id {spec['pad_id']} is not a token of the {vocab}-row "
                        f"embedding table {embed}.weight")
    layers = {"num_decoder_layers" if arch == "decoder_only" else "num_encoder_layers": n}
    try:  # the mapping's values as given: the config checks their types
        config = TransformerConfig(
            architecture=arch, src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=d,
            num_heads=spec["num_heads"], d_ff=out[f"{stack}.layers.0.ffn.W_1.weight"].shape[0],
            dropout=spec["dropout"], max_len=max_len, pad_id=spec["pad_id"],
            bos_id=spec["bos_id"], eos_id=spec["eos_id"], pre_norm=spec["norm_first"],
            final_norm=final_norm, activation=spec["activation"],
            layer_norm_eps=spec["layer_norm_eps"], scale_embeddings=spec["scale_embeddings"],
            position_encoding=kind, position_layout=layout, share_embeddings=True,
            tie_output=tie, output_bias=has_bias, **layers)
    except ConfigError as e:
        raise PortError(f"torch.nn.TransformerEncoder mapping gives an invalid config: {e}") from e
    return config, out


def copy_head(c: TensorConsumer, out: dict, head: str | None, embed: str,
              table: np.ndarray) -> tuple[bool, bool]:
    """The output projection -> (tie_output, output_bias). No head (encoder_only) is
    written as tied without bias: ours then has logits the source never computed."""
    if head is None:
        return True, False
    has_bias = f"{head}.bias" in c
    weight = c.take(f"{head}.weight")
    if weight.shape != table.shape:
        raise PortError(f"{head}.weight has shape {weight.shape}, but the embedding table "
                        f"{embed}.weight has {table.shape}: ours has one vocabulary, and "
                        "the head maps d_model to it")
    # Tied when named so, or when the weights are equal (then tying computes the same).
    tie = head == embed or np.array_equal(weight, table)
    if not tie:
        out["output_projection.weight"] = weight
    if has_bias:
        out["output_bias" if tie else "output_projection.bias"] = c.take(f"{head}.bias")
    return tie, has_bias


def positions(c: TensorConsumer, out: dict, spec: Mapping[str, Any], key: str | None,
              d: int) -> tuple[str, int]:
    """Check (sinusoidal) or copy (learned) the position table -> (layout, max_len)."""
    layout, max_len = spec["position_layout"], spec["max_len"]
    if key is None:  # no positions, or sinusoids the forward computes
        return layout or "interleaved", max_len or 512
    table = position_table(c.take(key), key, d)  # (rows, D)
    if max_len is None:
        max_len = table.shape[0]
    if spec["positions"] == "learned":
        if max_len != table.shape[0]:
            raise PortError(f"--max-len {max_len} differs from the {table.shape[0]} rows of "
                            f"the learned table {key}")
        out["position_embed.weight"] = table
        return "interleaved", max_len
    if max_len > table.shape[0]:
        raise PortError(f"--max-len {max_len} is longer than the {table.shape[0]} rows of {key}")
    return check_sinusoids(table, key, layout), max_len


def position_table(value: np.ndarray, key: str, d: int) -> np.ndarray:
    """A stored table as (rows, D): the tutorial's (max_len, 1, D) (batch_first=False)
    and (1, max_len, D) (batch_first=True) buffers, or an embedding's (rows, D)."""
    if value.ndim == 3 and 1 in value.shape[:2] and value.shape[2] == d:
        return value.reshape(-1, d)
    if value.ndim == 2 and value.shape[1] == d:
        return value
    raise PortError(f"{key} has shape {value.shape}; expected (max_len, {d}), "
                    f"(max_len, 1, {d}) or (1, max_len, {d})")


def check_sinusoids(table: np.ndarray, key: str, layout: str | None) -> str:
    """The layout whose sinusoids `table` holds (the given one, or either of ours),
    up to float32 rounding; a PortError naming the first difference otherwise."""
    rows, d = table.shape
    tolerance = 1e-6 + POSITION_TOLERANCE_PER_ROW * np.arange(rows)  # (rows,)
    differences = []
    for name in [layout] if layout else ["interleaved", "half_split"]:
        ours = sinusoidal_positions(rows, d, name)
        diff = np.abs(table.astype(np.float64) - ours)  # (rows, D)
        bad = np.flatnonzero(diff.max(axis=1) > tolerance)
        if not bad.size:
            return name
        r = bad[0]
        col = int(diff[r].argmax())
        differences.append(f"{name} layout: position {r}, column {col} holds "
                           f"{table[r, col]:.6g}, ours {ours[r, col]:.6g}")
    raise PortError(f"{key} is not one of our sinusoid tables ({'; '.join(differences)}); "
                    "sinusoids are checked, not copied: copy a trained table with "
                    "--positions learned")


def encoder_spec(encoder) -> dict[str, Any]:
    """The mapping fields a live nn.TransformerEncoder knows about itself: heads,
    norm_first, activation, LayerNorm eps and dropout (its first layer's)."""
    layer = encoder.layers[0]
    activation = {1: "relu", 2: "gelu"}.get(getattr(layer, "activation_relu_or_gelu", 0))
    if activation is None:
        raise PortError(f"the encoder's activation {layer.activation!r} is neither relu nor gelu")
    return dict(num_heads=layer.self_attn.num_heads, norm_first=layer.norm_first,
                activation=activation, layer_norm_eps=layer.norm1.eps, dropout=layer.dropout.p)


def detect_scale_embeddings(forward, config: TransformerConfig, tensors: Mapping[str, np.ndarray],
                            ids: np.ndarray) -> TransformerConfig:
    """`config` with the scale_embeddings that reproduces the source model: `forward`
    maps (B, L) ids to its logits (B, L, V), or hidden states without a head;
    torch_reference computes both choices on `ids` (no pad ids in an encoder_only
    batch: ours masks them) and the one within 1e-4 (relative) is kept."""
    import torch
    from torch_reference.model import build_model
    expected = np.asarray(torch.as_tensor(forward(ids)).detach().cpu(), np.float64)
    hidden = expected.shape[-1] != config.vocab_size  # no head: compare encode()'s states
    differences = {}
    for scale in (config.scale_embeddings, not config.scale_embeddings):
        model = build_model(config.replace(scale_embeddings=scale)).eval()
        model.load_state_dict({k: torch.from_numpy(np.asarray(v, np.float32))
                               for k, v in tensors.items()})
        with torch.no_grad():
            ids_t = torch.as_tensor(ids)
            got = (model.encode(ids_t)[0] if hidden else model(ids_t)).numpy()
        differences[scale] = np.abs(got - expected).max() / (1 + np.abs(expected).max())
        if differences[scale] <= 1e-4:
            return config.replace(scale_embeddings=scale)
    raise PortError("the converted model matches the source's outputs with neither embedding "
                    f"scale (relative max |diff|: {differences[True]:.3g} scaled, "
                    f"{differences[False]:.3g} unscaled): check the other flags")


def convert_torch_nn_encoder(src: str | Path, out_dir: str | Path,
                             spec: Mapping[str, Any]) -> TransformerConfig:
    config, tensors = torch_nn_encoder_tensors(read_weights(src), spec)
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:
        checkpoint_dir.save_dir(tmp, config, tensors)
    return config


FORMAT = Format(SOURCE, convert_torch_nn_encoder, TorchNNEncoderMapping)
