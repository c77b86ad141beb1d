"""Models wrapping torch.nn.Transformer -> our checkpoint directory.

What a state dict cannot say (heads, activation, norm_first, embedding scaling,
position layout, special ids) comes from a mapping (flags or a JSON file);
the defaults follow torch.nn.Transformer and the PyTorch translation tutorial.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.reading import PortError, TensorConsumer, read_weights
from transformer_core import checkpoint_dir
from transformer_core.config import ConfigError, TransformerConfig


TORCH_NN_DEFAULTS: dict[str, Any] = {
    # Where the wrapper keeps its tensors (module prefixes or full ".weight" keys).
    "transformer": None,  # prefix of the nn.Transformer; found automatically when None
    "src_embed": "src_embed",
    "tgt_embed": "tgt_embed",  # same as src_embed for a shared table
    "output": "generator",  # an nn.Linear; the tgt_embed name for a tied projection
    "ignore": [],  # key prefixes to drop (e.g. a positional-encoding buffer)
    # What the state dict cannot say: the wrapper's forward and nn.Transformer's args.
    "num_heads": None,  # required
    "activation": "relu",  # nn.Transformer's default
    "norm_first": False,  # nn.Transformer's default (post-LN)
    "layer_norm_eps": 1e-5,
    "scale_embeddings": True,  # embedding * sqrt(d_model), as in the PyTorch tutorial
    "position_layout": "interleaved",
    "max_len": 512,
    "dropout": 0.1,
    "pad_id": 0, "bos_id": 2, "eos_id": 3,
}


def torch_nn_transformer_tensors(sd: Mapping[str, np.ndarray], spec: Mapping[str, Any]
                                 ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """A state dict of a model wrapping torch.nn.Transformer -> (our config, our tensors).

    nn.Transformer packs Q, K, V into one `in_proj_weight` (3D, D), rows in that
    order; they are split here. Its norm1/norm2/norm3 are our self-attn, cross-attn
    (decoder) and FFN norms; it always has a final LayerNorm after each stack.
    Biases that the source lacks (bias=False) become zeros.
    """
    spec = {**TORCH_NN_DEFAULTS, **{k: v for k, v in spec.items() if v is not None}}
    unknown = sorted(set(spec) - set(TORCH_NN_DEFAULTS))
    if unknown:
        raise PortError(f"unknown torch-nn-transformer mapping field(s): {', '.join(unknown)}")
    if spec["num_heads"] is None:
        raise PortError("--num-heads is required: nn.Transformer's nhead is not in the state dict")
    if not isinstance(spec["norm_first"], bool):  # the config's pre_norm, under another name
        raise PortError(f"mapping field norm_first must be a boolean (true or false), got "
                        f"{spec['norm_first']!r}")
    prefix = spec["transformer"]
    if prefix is None:
        hits = [k[: -len("encoder.layers.0.self_attn.in_proj_weight")] for k in sd
                if k.endswith("encoder.layers.0.self_attn.in_proj_weight")
                and not k.endswith("decoder.layers.0.self_attn.in_proj_weight")]
        if len(hits) != 1:
            raise PortError("cannot find one nn.Transformer in the state dict (looked for "
                            f"'*encoder.layers.0.self_attn.in_proj_weight', found {len(hits)}); "
                            "name it with --transformer-prefix")
        prefix = hits[0]
    elif prefix and not prefix.endswith("."):
        prefix += "."
    ignore = tuple(spec["ignore"])
    c = TensorConsumer({k: v for k, v in sd.items() if not (ignore and k.startswith(ignore))},
                  "torch.nn.Transformer state dict")
    t = lambda name: f"{prefix}{name}"  # noqa: E731

    def count(stack):
        n = 0
        while t(f"{stack}.layers.{n}.self_attn.in_proj_weight") in c:
            n += 1
        return n

    n_enc, n_dec = count("encoder"), count("decoder")
    if not n_enc or not n_dec:
        raise PortError(f"no encoder/decoder layers under {prefix!r}")
    w = c.tensors[t("encoder.layers.0.self_attn.in_proj_weight")]
    d = w.shape[1]
    dtype = w.dtype
    out: dict[str, np.ndarray] = {}

    def bias_or_zeros(key, n):
        return c.take(key) if key in c else np.zeros((n,), dtype)

    def linear(src, ours):
        out[f"{ours}.weight"] = weight = c.take(f"{src}.weight")
        out[f"{ours}.bias"] = bias_or_zeros(f"{src}.bias", weight.shape[0])

    def norm(src, ours):
        out[f"{ours}.weight"] = c.take(f"{src}.weight")
        out[f"{ours}.bias"] = bias_or_zeros(f"{src}.bias", d)

    def attention(src, ours):
        for separate in ("q_proj_weight", "k_proj_weight", "v_proj_weight", "bias_k", "bias_v"):
            if f"{src}.{separate}" in c:
                raise PortError(f"{src}.{separate}: attention with kdim/vdim != d_model or "
                                "add_bias_kv is not supported")
        in_w = c.take(f"{src}.in_proj_weight")  # (3D, D): rows are Q, then K, then V
        in_b = bias_or_zeros(f"{src}.in_proj_bias", 3 * d)
        for j, name in enumerate(("W_q", "W_k", "W_v")):
            out[f"{ours}.{name}.weight"] = in_w[j * d:(j + 1) * d]
            out[f"{ours}.{name}.bias"] = in_b[j * d:(j + 1) * d]
        linear(f"{src}.out_proj", f"{ours}.W_o")

    for i in range(n_enc):
        s, o = t(f"encoder.layers.{i}"), f"encoder.layers.{i}"
        attention(f"{s}.self_attn", f"{o}.self_attn"); norm(f"{s}.norm1", f"{o}.self_attn_norm")
        linear(f"{s}.linear1", f"{o}.ffn.W_1"); linear(f"{s}.linear2", f"{o}.ffn.W_2")
        norm(f"{s}.norm2", f"{o}.ffn_norm")
    for i in range(n_dec):
        s, o = t(f"decoder.layers.{i}"), f"decoder.layers.{i}"
        attention(f"{s}.self_attn", f"{o}.self_attn"); norm(f"{s}.norm1", f"{o}.self_attn_norm")
        attention(f"{s}.multihead_attn", f"{o}.cross_attn")
        norm(f"{s}.norm2", f"{o}.cross_attn_norm")
        linear(f"{s}.linear1", f"{o}.ffn.W_1"); linear(f"{s}.linear2", f"{o}.ffn.W_2")
        norm(f"{s}.norm3", f"{o}.ffn_norm")
    norm(t("encoder.norm"), "encoder.final_norm")
    norm(t("decoder.norm"), "decoder.final_norm")

    strip = lambda name: name[: -len(".weight")] if name.endswith(".weight") else name  # noqa
    src_name, tgt_name, out_name = strip(spec["src_embed"]), strip(spec["tgt_embed"]), strip(spec["output"])
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
    checkpoint_dir.save_dir(out_dir, config, tensors)
    return config


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A --mapping JSON file: an object with any of TORCH_NN_DEFAULTS' fields."""
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise PortError(f"--mapping {path} is not valid JSON: {e}") from e
    if not isinstance(spec, dict):
        raise PortError(f"--mapping {path} must hold a JSON object")
    return spec
