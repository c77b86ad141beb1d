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
from jax_transformer.port.bart_config import BartConfig
from jax_transformer.port.reading import (PortError, TensorConsumer, read_hf_weights,
                                          read_json_object)
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import sinusoidal_positions

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
    bart = BartConfig(hf, "Marian", source)
    get, require = bart.get, bart.require
    bart.check_model("marian", ("MarianMTModel", "MarianModel"),
                     "only MarianMTModel / MarianModel are encoder-decoders")
    activation = bart.check_layers("gelu")
    for flag, ok in MARIAN_FIXED_FLAGS.items():
        require(get(flag, ok) == ok, f"{flag}={hf.get(flag)!r} (Marian's MarianMTModel needs {ok})")
    eps = get("layer_norm_eps", 1e-5)
    require(eps == 1e-5, f"layer_norm_eps={eps!r}: MarianMTModel ignores it and uses torch's "
            "1e-5, so the checkpoint's meaning is ambiguous")
    share = bool(get("share_encoder_decoder_embeddings", True))
    vocab = get("vocab_size", 58101)
    decoder_vocab = get("decoder_vocab_size", vocab)
    require(not share or decoder_vocab == vocab,
            f"share_encoder_decoder_embeddings with decoder_vocab_size {decoder_vocab} != "
            f"vocab_size {vocab}")
    ids = bart.special_ids(pad=None, eos=0, start=None)  # decoding starts from the pad id
    return bart.build(
        src_vocab_size=vocab, tgt_vocab_size=vocab if share else decoder_vocab, **ids,
        **bart.layer_fields(activation, scale_embedding=False, stacklevel=3),
        pre_norm=False, final_norm=False, position_layout="half_split",
        share_embeddings=share, tie_output=bool(get("tie_word_embeddings", True)),
        output_bias=True)


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
