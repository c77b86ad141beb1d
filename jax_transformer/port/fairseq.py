"""Hugging Face FSMT and M2M100 (fairseq's translation models) -> our checkpoint directory.

FSMT (FSMTForConditionalGeneration: fairseq's WMT19 models) is post-LN with
separate source/target vocabularies and an output projection without bias,
tied to the target embedding (and the vocabularies shared) only under
tie_word_embeddings. M2M100 (M2M100ForConditionalGeneration, which NLLB's
dense models also use) is pre-LN with a LayerNorm after each stack and one
vocabulary (language codes are ordinary tokens), lm_head tied to it. Both scale
embeddings by sqrt(d_model), start decoding with eos (decoder_start_token_id)
and add fairseq's sinusoids from row pad_id + 1 on: position_layout "fairseq",
position_offset pad_id + 1. Stored position tables are checked, not copied.

fairseq numbers positions by counting non-pad tokens: a pad gets the (zero)
pad row, and left padding shifts the positions. Ours are indices, equal at
every real token of a right-padded row; pads differ, but they are masked.
FSMT's, M2M100's and NLLB's tokenizers are converted with the weights (fairseq_tokens.py)
when the directory has them, and checked to load and fit the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.bart_config import BartConfig
# BART's layer names are Marian's.
from jax_transformer.port.marian import marian_layer_modules
from jax_transformer.port.fairseq_tokens import (fsmt_tokenizer, m2m100_tokenizer,
                                                 write_fsmt_tokenizer, write_m2m100_tokenizer)
from jax_transformer.port.options import Format
from jax_transformer.port.reading import (PortError, TensorConsumer, read_hf_weights,
                                          read_json_object)
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import sinusoidal_positions
from transformer_core.tokenizer import TokenizerError

# transformers computes fairseq's table in float32: the angle's rounding error grows
# with the row, ~1.2e-7 * row (7e-5 at row 1025); a wrong formula is off by O(1).
POSITION_TOLERANCE_PER_ROW = 2.0 ** -22


# ------------------------------------------------------------------ configs

def fsmt_config(hf: Mapping[str, Any], source: str = "FSMT config") -> TransformerConfig:
    """Map a Hugging Face FSMTConfig (config.json as a dict, read from `source`) to ours,
    or raise PortError."""
    bart = BartConfig(hf, "FSMT", source)
    tie = bool(bart.get("tie_word_embeddings", False))
    src, tgt = bart.get("src_vocab_size", 42024), bart.get("tgt_vocab_size", 42024)
    # tie_word_embeddings ties the encoder's table and the output projection to the decoder's.
    bart.require(not tie or src == tgt,
                 f"tie_word_embeddings with src_vocab_size {src} != tgt_vocab_size {tgt}")
    return _config(bart, "fsmt", ("FSMTForConditionalGeneration", "FSMTModel"),
                   src_vocab_size=src, tgt_vocab_size=tgt, pre_norm=False, final_norm=False,
                   share_embeddings=tie, tie_output=tie)


def m2m100_config(hf: Mapping[str, Any], source: str = "M2M100 config") -> TransformerConfig:
    """Map a Hugging Face M2M100Config (M2M100, NLLB dense; config.json as a dict, read
    from `source`) to ours, or raise PortError."""
    bart = BartConfig(hf, "M2M100", source)
    tie = bool(bart.get("tie_word_embeddings", True))
    vocab = bart.get("vocab_size", 128112)
    # Untied, M2M100 has separate encoder/decoder tables (`shared` unused) and lm_head.
    return _config(bart, "m2m_100", ("M2M100ForConditionalGeneration", "M2M100Model"),
                   src_vocab_size=vocab, tgt_vocab_size=vocab, pre_norm=True, final_norm=True,
                   share_embeddings=tie, tie_output=tie)


def _config(bart: BartConfig, model_type: str, architectures: tuple[str, ...],
            **fields) -> TransformerConfig:
    """What FSMT and M2M100 share beyond BART's fields; defaults are transformers' (both
    classes agree): fairseq's positions, numbered after the pad id."""
    bart.check_model(model_type, architectures)
    activation = bart.check_layers("relu")
    ids = bart.special_ids(pad=1, eos=2, start=2)  # pad: an integer, the offset is pad + 1
    bart.require(ids["bos_id"] != ids["pad_id"], f"decoder_start_token_id {ids['bos_id']} "
                 "equals pad_token_id: fairseq positions skip pad tokens, which ours "
                 "(indices) cannot express")
    return bart.build(**ids, **bart.layer_fields(activation, scale_embedding=True, stacklevel=4),
                      position_layout="fairseq", position_offset=ids["pad_id"] + 1,
                      output_bias=False, **fields)


# ------------------------------------------------------------------ tensors

def fsmt_tensors(hf_tensors: Mapping[str, np.ndarray],
                 config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF FSMTForConditionalGeneration / FSMTModel state dict -> our torch-named tensors."""
    c, out = _consumer(hf_tensors, "FSMT state dict")
    if config.share_embeddings:  # tie_word_embeddings: one table, stored once or thrice
        out["shared_embed.weight"] = c.take_tied("decoder.embed_tokens.weight",
                                                 "encoder.embed_tokens.weight",
                                                 "decoder.output_projection.weight")
    else:
        out["src_embed.weight"] = c.take("encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = c.take("decoder.embed_tokens.weight")
        out["output_projection.weight"] = c.take("decoder.output_projection.weight")
    _layers(c, out, config)
    for stack in ("encoder", "decoder"):
        _check_positions(c, f"{stack}.embed_positions.weight", config)
    c.check_all_used()
    return out


def m2m100_tensors(hf_tensors: Mapping[str, np.ndarray],
                   config: TransformerConfig) -> dict[str, np.ndarray]:
    """HF M2M100ForConditionalGeneration / M2M100Model state dict -> our torch-named tensors."""
    c, out = _consumer(hf_tensors, "M2M100 state dict")
    if config.share_embeddings:
        out["shared_embed.weight"] = c.take_tied("shared.weight", "encoder.embed_tokens.weight",
                                                 "decoder.embed_tokens.weight", "lm_head.weight")
    else:
        out["src_embed.weight"] = c.take("encoder.embed_tokens.weight")
        out["tgt_embed.weight"] = c.take("decoder.embed_tokens.weight")
        out["output_projection.weight"] = c.take("lm_head.weight")
        if "shared.weight" in c:
            c.ignore("shared.weight")  # read by neither stack when untied
    _layers(c, out, config)
    for stack in ("encoder", "decoder"):
        _linear(c, out, f"{stack}.layer_norm", f"{stack}.final_norm")
        _check_positions(c, f"{stack}.embed_positions.weights", config)  # older files store it
    c.check_all_used()
    return out


def _consumer(hf_tensors, source: str) -> tuple[TensorConsumer, dict[str, np.ndarray]]:
    # ...ForConditionalGeneration prefixes the body with "model."; the bare model does not.
    body = {(k[len("model."):] if k.startswith("model.") else k): v
            for k, v in hf_tensors.items()}
    return TensorConsumer(body, source), {}


def _linear(c: TensorConsumer, out: dict, hf_name: str, ours: str) -> None:
    out[f"{ours}.weight"] = c.take(f"{hf_name}.weight")
    out[f"{ours}.bias"] = c.take(f"{hf_name}.bias")


def _layers(c: TensorConsumer, out: dict, config: TransformerConfig) -> None:
    """Every encoder/decoder layer: FSMT and M2M100 use Marian's (BART's) module names."""
    for hf_name, ours in marian_layer_modules(config):
        _linear(c, out, hf_name, ours)


def _check_positions(c: TensorConsumer, key: str, config: TransformerConfig) -> None:
    """A stored table must be fairseq's (pad row zero); ours is computed, not copied."""
    if key not in c:
        return
    table = np.asarray(c.take(key), np.float64)
    if table.ndim != 2 or table.shape[1] != config.d_model:
        raise PortError(f"{key} has shape {table.shape}, expected (rows, {config.d_model})")
    ours = sinusoidal_positions(table.shape[0], config.d_model, "fairseq").copy()
    if config.pad_id < table.shape[0]:
        ours[config.pad_id] = 0.0
    diff = np.abs(table - ours).max(axis=1)  # (rows,)
    bad = np.flatnonzero(diff > 1e-6 + POSITION_TOLERANCE_PER_ROW * np.arange(len(diff)))
    if bad.size:
        raise PortError(f"{key} is not fairseq's sinusoid table (row {bad[0]}: max |diff| "
                        f"{diff[bad[0]]:.3g}); learned position embeddings are not supported")


# ------------------------------------------------------------------ directories

def convert_hf_fsmt(src_dir: str | Path, out_dir: str | Path) -> TransformerConfig:
    return _convert(src_dir, out_dir, "FSMT", fsmt_config, fsmt_tensors, fsmt_tokenizer,
                    write_fsmt_tokenizer)


def convert_hf_m2m100(src_dir: str | Path, out_dir: str | Path) -> TransformerConfig:
    return _convert(src_dir, out_dir, "M2M100", m2m100_config, m2m100_tensors, m2m100_tokenizer,
                    write_m2m100_tokenizer)


def _convert(src_dir, out_dir, family: str, make_config, make_tensors, read_tokenizer,
             write_tokenizer) -> TransformerConfig:
    src_dir = Path(src_dir)
    if not (src_dir / "config.json").is_file():
        raise PortError(f"{src_dir} has no config.json (expected a Hugging Face {family} "
                        "directory)")
    config = make_config(read_json_object(src_dir / "config.json"), str(src_dir / "config.json"))
    tokenizer = read_tokenizer(src_dir)
    tensors = make_tensors(read_hf_weights(src_dir), config)
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:
        checkpoint_dir.save_dir(tmp, config, tensors)
        if tokenizer is not None:
            write_tokenizer(src_dir, tmp, tokenizer)
            try:
                checkpoint_dir.load_tokenizer(tmp).check_fits(config)
            except TokenizerError as e:
                raise PortError(f"{src_dir}'s tokenizer: {e}") from None
    return config


FSMT_FORMAT = Format("hf-fsmt", lambda src, out, options: convert_hf_fsmt(src, out))
M2M100_FORMAT = Format("hf-m2m100", lambda src, out, options: convert_hf_m2m100(src, out))
