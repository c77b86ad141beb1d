"""Hugging Face Marian (opus-mt) checkpoints -> our checkpoint directory.

Marian (MarianMTModel) is the paper's post-LN model with silu ("swish"),
half-split sinusoids, sqrt(d_model) embedding scaling, shared embeddings, a
tied output projection and a `final_logits_bias`. Its tokenizer files
(source.spm / target.spm, vocab.json) are copied next to our checkpoint and
read by `transformer_core.marian_tokenizer.MarianTokenizer`.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from transformer_core.marian_tokenizer import MARIAN_TOKENIZER_FILES, MarianTokenizer
from jax_transformer.port.options import Format
from jax_transformer.port.reading import (HF_CONFIG_TYPES, PortError, TensorConsumer,
                                          check_field_types, read_hf_weights, read_json_object)
from transformer_core import checkpoint_dir
from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.positions import sinusoidal_positions

MARIAN_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
# Config flags of the BART family that MarianMTModel does not implement: only these values.
MARIAN_FIXED_FLAGS = {"normalize_before": False, "normalize_embedding": False,
                      "add_final_layer_norm": False, "add_bias_logits": False,
                      "static_position_embeddings": True}
MARIAN_ATTENTION = (("q_proj", "W_q"), ("k_proj", "W_k"), ("v_proj", "W_v"), ("out_proj", "W_o"))


def marian_layer_modules(config: TransformerConfig) -> list[tuple[str, str]]:
    """(Marian module, our module) for every Linear and LayerNorm of the layers, each
    with a weight and a bias; Marian names without "model.". Both directions use it."""
    pairs = []
    for stack, n in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        for i in range(n):
            p = f"{stack}.layers.{i}"
            blocks = [("self_attn", "self_attn", "self_attn_layer_norm", "self_attn_norm")]
            if stack == "decoder":
                blocks.append(("encoder_attn", "cross_attn", "encoder_attn_layer_norm",
                               "cross_attn_norm"))
            for hf_attn, our_attn, hf_norm, our_norm in blocks:
                pairs += [(f"{p}.{hf_attn}.{h}", f"{p}.{our_attn}.{o}") for h, o in MARIAN_ATTENTION]
                pairs.append((f"{p}.{hf_norm}", f"{p}.{our_norm}"))
            pairs += [(f"{p}.fc1", f"{p}.ffn.W_1"), (f"{p}.fc2", f"{p}.ffn.W_2"),
                      (f"{p}.final_layer_norm", f"{p}.ffn_norm")]
    return pairs


def marian_config(hf: Mapping[str, Any], source: str = "Marian config") -> TransformerConfig:
    """Map a Hugging Face MarianConfig (config.json as a dict, read from `source`) to
    ours, or raise PortError."""
    check_field_types(hf, HF_CONFIG_TYPES, source)

    def get(name, default=None):
        value = hf.get(name, default)
        return default if value is None else value

    def require(condition, message):
        if not condition:
            raise PortError(f"unsupported Marian config: {message}")

    require(get("model_type") == "marian", f"model_type is {hf.get('model_type')!r}, not 'marian'")
    archs = get("architectures", [])
    require(all(a in ("MarianMTModel", "MarianModel") for a in archs),
            f"architectures {archs} (only MarianMTModel / MarianModel are encoder-decoders)")
    act = get("activation_function", "gelu")
    require(act in MARIAN_ACTIVATIONS, f"activation_function {act!r}; supported: "
            f"{sorted(MARIAN_ACTIVATIONS)} (gelu means exact erf GELU)")
    for flag, ok in MARIAN_FIXED_FLAGS.items():
        require(get(flag, ok) == ok, f"{flag}={hf.get(flag)!r} (Marian's MarianMTModel needs {ok})")
    require(get("encoder_attention_heads", 16) == get("decoder_attention_heads", 16),
            "encoder_attention_heads != decoder_attention_heads")
    require(get("encoder_ffn_dim", 4096) == get("decoder_ffn_dim", 4096),
            "encoder_ffn_dim != decoder_ffn_dim")
    eps = get("layer_norm_eps", 1e-5)
    require(eps == 1e-5, f"layer_norm_eps={eps!r}: MarianMTModel ignores it and uses torch's "
            "1e-5, so the checkpoint's meaning is ambiguous")
    share = bool(get("share_encoder_decoder_embeddings", True))
    vocab = get("vocab_size", 58101)
    decoder_vocab = get("decoder_vocab_size", vocab)
    require(not share or decoder_vocab == vocab,
            f"share_encoder_decoder_embeddings with decoder_vocab_size {decoder_vocab} != "
            f"vocab_size {vocab}")
    pad = get("pad_token_id")
    require(pad is not None, "pad_token_id is missing")
    eos = get("eos_token_id", 0)
    if isinstance(eos, list):
        require(len(eos) == 1, f"eos_token_id {eos} (one end token expected)")
        eos = eos[0]
    dropout = float(get("dropout", 0.1))
    for name in ("attention_dropout", "activation_dropout", "encoder_layerdrop",
                 "decoder_layerdrop"):
        if float(get(name, 0.0)) not in (0.0, dropout):
            warnings.warn(f"Marian {name}={hf[name]} is not expressed (our model uses one "
                          f"dropout rate, {dropout}); this affects training only", stacklevel=2)
    try:
        return TransformerConfig(
            src_vocab_size=vocab, tgt_vocab_size=vocab if share else decoder_vocab,
            d_model=get("d_model", 1024), num_heads=get("encoder_attention_heads", 16),
            d_ff=get("encoder_ffn_dim", 4096), num_encoder_layers=get("encoder_layers", 12),
            num_decoder_layers=get("decoder_layers", 12), dropout=dropout,
            max_len=get("max_position_embeddings", 1024), pad_id=pad,
            bos_id=get("decoder_start_token_id", pad), eos_id=eos,
            pre_norm=False, final_norm=False, activation=MARIAN_ACTIVATIONS[act],
            layer_norm_eps=1e-5, scale_embeddings=bool(get("scale_embedding", False)),
            position_layout="half_split", share_embeddings=share,
            tie_output=bool(get("tie_word_embeddings", True)), output_bias=True)
    except ConfigError as e:
        raise PortError(f"Marian config maps to an invalid config: {e}") from e


def marian_tensors(hf_tensors: Mapping[str, np.ndarray],
                   config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF MarianMTModel / MarianModel state dict -> our torch-named tensors."""
    # MarianMTModel prefixes the body with "model."; a bare MarianModel does not.
    src = {(k[len("model."):] if k.startswith("model.") else k): v for k, v in hf_tensors.items()}
    c = TensorConsumer(src, "Marian state dict")
    out: dict[str, np.ndarray] = {}

    if config.share_embeddings:
        out["shared_embed.weight"] = c.take_tied("shared.weight", "encoder.embed_tokens.weight",
                                                 "decoder.embed_tokens.weight")
    else:
        out["src_embed.weight"] = c.take("encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = c.take("decoder.embed_tokens.weight")
        if "shared.weight" in c:
            c.ignore("shared.weight")  # unused by MarianModel when not shared
    for hf_name, ours in marian_layer_modules(config):
        for leaf in ("weight", "bias"):
            out[f"{ours}.{leaf}"] = c.take(f"{hf_name}.{leaf}")
    for stack in ("encoder", "decoder"):
        # The sinusoidal table is static in Marian; ours is computed, so check they agree.
        key = f"{stack}.embed_positions.weight"
        if key in c:
            _check_marian_positions(c.take(key), config, key)

    target_vocab = config.tgt_vocab_size
    bias = c.take("final_logits_bias") if "final_logits_bias" in c else np.zeros((1, target_vocab))
    bias = np.asarray(bias).reshape(-1)
    embed_dtype = out.get("shared_embed.weight", out.get("tgt_embed.weight")).dtype
    bias = bias.astype(embed_dtype)
    if config.tie_output:
        if "lm_head.weight" in c:  # HF re-ties lm_head to the embedding on load
            head, table = c.take("lm_head.weight"), out.get("shared_embed.weight",
                                                             out.get("tgt_embed.weight"))
            if not np.array_equal(head, table):
                warnings.warn("lm_head.weight differs from the embedding, but "
                              "tie_word_embeddings is true: using the embedding, as "
                              "transformers does", stacklevel=2)
        out["output_bias"] = bias
    else:
        out["output_projection.weight"] = c.take("lm_head.weight")
        out["output_projection.bias"] = bias
    c.check_all_used()
    return out


def _check_marian_positions(table: np.ndarray, config: TransformerConfig, key: str) -> None:
    ours = sinusoidal_positions(table.shape[0], config.d_model, "half_split")
    if table.shape != ours.shape:
        raise PortError(f"{key} has shape {table.shape}, expected {ours.shape}")
    diff = float(np.max(np.abs(table.astype(np.float64) - ours)))
    if diff > 1e-5:
        raise PortError(f"{key} is not the half-split sinusoid table (max |diff| {diff:.3g}); "
                        "learned position embeddings are not supported")


def convert_hf_marian(src_dir: str | Path, out_dir: str | Path) -> TransformerConfig:
    src_dir = Path(src_dir)
    if not (src_dir / "config.json").is_file():
        raise PortError(f"{src_dir} has no config.json (expected a Hugging Face Marian directory)")
    config = marian_config(read_json_object(src_dir / "config.json"), str(src_dir / "config.json"))
    tensors = marian_tensors(read_hf_weights(src_dir), config)
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:  # a failure leaves nothing
        checkpoint_dir.save_dir(tmp, config, tensors)
        copied = [name for name in MARIAN_TOKENIZER_FILES if (src_dir / name).is_file()]
        for name in copied:
            shutil.copyfile(checkpoint_dir.file_to_copy(src_dir, name), tmp / name)
        if "vocab.json" in copied:
            MarianTokenizer(tmp).check_fits(config)
    return config


FORMAT = Format("hf-marian", lambda src, out, options: convert_hf_marian(src, out))
