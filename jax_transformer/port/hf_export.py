"""Our checkpoint directory -> a Hugging Face Marian directory (the inverse of marian.py).

    OUT/config.json              a full MarianConfig, written as JSON (no transformers needed)
    OUT/generation_config.json   the start/end/pad ids, no forced end token, no length bound
    OUT/model.safetensors        MarianMTModel's names, the keys save_pretrained writes
    OUT/source.spm, target.spm   our tokenizer.model (a SentencePiece model), twice
    OUT/vocab.json               every piece -> our id; <pad>, </s>, <unk> at our ids
    OUT/tokenizer_config.json    MarianTokenizer and its special tokens

`transformers.MarianMTModel.from_pretrained(OUT)` and `MarianTokenizer.from_pretrained(OUT)`
load it. A checkpoint that came from Marian (it holds source.spm + vocab.json) gets
those files copied instead. A config Marian cannot compute is a PortError naming the
field: MarianMTModel is post-LN, without final norms, with LayerNorm eps 1e-5 and
half-split sinusoids. A model with interleaved sinusoids (train.py's default) is written
as the half-split model that computes the same function (`half_split_equivalent`).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.bart_config import ACTIVATIONS
from jax_transformer.port.marian import (MARIAN_FIXED_FLAGS, MARIAN_TOKENIZER_FILES,
                                         marian_layer_modules)
from transformer_core.marian_tokenizer import MarianTokenizer
from jax_transformer.port.options import Format
from jax_transformer.port.reading import PortError
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import half_split_order

TARGETS = ("hf-marian",)
HF_ACTIVATIONS = {ours: hf for hf, ours in ACTIVATIONS.items() if hf != "silu"}  # swish
# What MarianMTModel computes, for the fields it cannot change.
MARIAN_FIXED = {"pre_norm": False, "final_norm": False, "layer_norm_eps": 1e-5}
# Marian's sinusoids are half_split; interleaved ones are the same columns reordered.
EXPORTED_LAYOUTS = ("half_split", "interleaved")
# Fields Marian expresses, written into config.json below (position_layout: into the
# weights' column order); activation and position_layout at the values checked below.
MARIAN_FREE = {"src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff",
               "num_encoder_layers", "num_decoder_layers", "dropout", "max_len", "pad_id",
               "bos_id", "eos_id", "activation", "position_layout", "scale_embeddings",
               "share_embeddings", "tie_output", "output_bias", "init_std"}
# Fields of how a new model is drawn, which a trained model's weights no longer depend on.
INITIALISATION = {"weight_init"}
# Our modules that read the residual stream (d_model is their weight's input axis) and
# those that add to it (their weight's output axis and their bias).
READ_FROM_STREAM = {"W_q", "W_k", "W_v", "W_1", "output_projection"}
WRITE_TO_STREAM = {"W_o", "W_2"}


def check_marian_expressible(config: TransformerConfig) -> None:
    """Raise PortError, naming the field, unless MarianMTModel computes this model."""
    for name, value in MARIAN_FIXED.items():
        if getattr(config, name) != value:
            raise PortError(f"cannot export to Marian: {name}={getattr(config, name)!r} "
                            f"(MarianMTModel has {name}={value!r})")
    if config.position_layout not in EXPORTED_LAYOUTS:
        raise PortError(f"cannot export to Marian: position_layout={config.position_layout!r} "
                        "(the export takes half_split, MarianMTModel's own, or interleaved, "
                        "its columns reordered)")
    if config.activation not in HF_ACTIVATIONS:
        raise PortError(f"cannot export to Marian: activation={config.activation!r} "
                        f"(supported: {', '.join(sorted(HF_ACTIVATIONS))})")
    for field in dataclasses.fields(TransformerConfig):  # fields added later: defaults only
        if field.name not in (*MARIAN_FIXED, *MARIAN_FREE, *INITIALISATION):
            if getattr(config, field.name) != field.default:
                raise PortError(f"cannot export to Marian: {field.name}="
                                f"{getattr(config, field.name)!r} (the Marian export knows "
                                f"only its default, {field.default!r})")


def hf_marian_config(config: TransformerConfig, dtype: str = "float32") -> dict[str, Any]:
    """Our config -> MarianConfig's config.json (as a dict), or PortError."""
    check_marian_expressible(config)
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"],
        "vocab_size": config.src_vocab_size, "decoder_vocab_size": config.tgt_vocab_size,
        "share_encoder_decoder_embeddings": config.share_embeddings,
        "tie_word_embeddings": config.tie_output, "d_model": config.d_model,
        "encoder_layers": config.num_encoder_layers, "decoder_layers": config.num_decoder_layers,
        "encoder_attention_heads": config.num_heads, "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff, "decoder_ffn_dim": config.d_ff,
        "activation_function": HF_ACTIVATIONS[config.activation],
        "scale_embedding": config.scale_embeddings,
        "max_position_embeddings": config.max_len,
        # One dropout rate drops embeddings, sublayer outputs, attention weights and the FFN.
        "dropout": config.dropout, "attention_dropout": config.dropout,
        "activation_dropout": config.dropout, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
        "pad_token_id": config.pad_id, "eos_token_id": config.eos_id, "bos_token_id": None,
        "decoder_start_token_id": config.bos_id,
        "forced_eos_token_id": None,  # our searches do not force an end token at max length
        **MARIAN_FIXED_FLAGS, "is_encoder_decoder": True, "is_decoder": False,
        "use_cache": True, "init_std": config.init_std, "dtype": dtype,
    }


def hf_generation_config(config: TransformerConfig) -> dict[str, Any]:
    """generation_config.json: our ids, and no length bound, as transformers' own
    save_pretrained writes for Marian: generate() takes max_new_tokens or max_length from
    its caller alone. (A max_length here made generate(max_new_tokens=N) warn that both
    seem to have been set; a max_new_tokens here overrides a caller's max_length.)"""
    return {"decoder_start_token_id": config.bos_id, "eos_token_id": config.eos_id,
            "pad_token_id": config.pad_id, "forced_eos_token_id": None}


def hf_marian_tensors(tensors: dict[str, np.ndarray],
                      config: TransformerConfig) -> dict[str, np.ndarray]:
    """Our torch-named tensors -> MarianMTModel's state dict, the keys save_pretrained
    writes: no sinusoid tables, no tied copies (for shared but untied embeddings,
    transformers keeps three tables, so all three are written)."""
    if config.position_layout == "interleaved":
        tensors = half_split_equivalent(tensors, config)
    out: dict[str, np.ndarray] = {}
    if config.share_embeddings:
        table = tensors["shared_embed.weight"]
        out["model.shared.weight"] = table
        if not config.tie_output:
            out["model.encoder.embed_tokens.weight"] = table
            out["model.decoder.embed_tokens.weight"] = table
    else:
        table = tensors["tgt_embed.weight"]
        out["model.encoder.embed_tokens.weight"] = tensors["src_embed.weight"]
        out["model.decoder.embed_tokens.weight"] = table
    for hf_name, ours in marian_layer_modules(config):
        for leaf in ("weight", "bias"):
            out[f"model.{hf_name}.{leaf}"] = tensors[f"{ours}.{leaf}"]
    if config.tie_output:
        bias = tensors.get("output_bias")
    else:
        out["lm_head.weight"] = tensors["output_projection.weight"]
        bias = tensors.get("output_projection.bias")
    if bias is None:  # no output bias: Marian's always-present bias is zero
        bias = np.zeros((config.tgt_vocab_size,), table.dtype)
    out["final_logits_bias"] = bias.reshape(1, -1)
    return out


def half_split_equivalent(tensors: Mapping[str, np.ndarray],
                          config: TransformerConfig) -> dict[str, np.ndarray]:
    """The tensors (our torch names) of the half_split model that computes what
    `config`'s interleaved model computes with `tensors`.

    The two layouts hold the same sinusoids in other columns (`half_split_order`). Every
    operation on the residual stream commutes with a permutation of its d_model axis, so
    permuting that axis wherever a tensor has it gives a model whose stream is the
    original's, permuted the same way: the token tables' columns (their sqrt(d_model)
    scale is one number), a Linear's input columns where it reads the stream and its
    output rows and bias where it adds to it, a LayerNorm's scale and bias (its mean and
    variance are sums over the axis). The attention heads' query, key and value
    dimensions, the feed-forward's inner width and the vocabulary are not on the stream
    and keep their order. The logits are the same function of the input; in floating
    point only the order in which sums over d_model add differs.
    """
    order = half_split_order(config.d_model)
    permuted = {}
    for key, value in tensors.items():
        axis = _model_axis(key)
        permuted[key] = value if axis is None else np.take(value, order, axis=axis)
    return permuted


def _model_axis(key: str) -> int | None:
    """The d_model axis of our tensor `key` (torch layout), None where it has none."""
    path, _, leaf = key.rpartition(".")
    module = path.rpartition(".")[2]
    if module.endswith("_norm") or module in WRITE_TO_STREAM:
        return 0
    if leaf == "weight" and (module.endswith("_embed") or module in READ_FROM_STREAM):
        return 1
    return None  # output_bias, the biases of Linears that read the stream


def export_hf_marian(src_dir: str | Path, out_dir: str | Path) -> tuple[TransformerConfig, str]:
    """Write `src_dir` (our checkpoint directory) as a Marian directory; returns the
    config and how the tokenizer was written ("copied", "converted" or "none")."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    try:
        config, tensors = checkpoint_dir.load_dir(src_dir)
    except checkpoint_dir.CheckpointError as e:
        raise PortError(str(e)) from e
    dtype = str(next(iter(tensors.values())).dtype)
    hf_config = hf_marian_config(config, dtype)  # refusals come before anything is written
    hf = hf_marian_tensors(tensors, config)
    marian_files = MarianTokenizer.is_present(src_dir)
    vocab = None if marian_files else _vocab_from_sentencepiece(src_dir, config)
    with checkpoint_dir.directory_written_whole(out_dir) as tmp:  # a failure leaves nothing
        tokenizer = _write_marian_dir(tmp, src_dir, config, hf_config, hf, marian_files, vocab)
    return config, tokenizer


def to_hf_marian(src_dir: str, out_dir: str, options: Mapping[str, Any]) -> str:
    """--to hf-marian: what was written, for jaxformer-port's "wrote OUT ..." line."""
    config, tokenizer = export_hf_marian(src_dir, out_dir)
    return f"as a Hugging Face Marian model ({config.summary()}), tokenizer {tokenizer}"


FORMAT = Format(TARGETS[0], to_hf_marian)


def _write_marian_dir(out_dir: Path, src_dir: Path, config: TransformerConfig,
                      hf_config: dict, hf: dict, marian_files: bool,
                      vocab: dict[str, int] | None) -> str:
    """The Marian directory's files, in `out_dir`; how the tokenizer was written."""
    checkpoint_dir.write_safetensors(out_dir / "model.safetensors",
                                     {k: np.ascontiguousarray(v) for k, v in hf.items()},
                                     metadata={"format": "pt"})
    _write_json(out_dir / "config.json", hf_config)
    _write_json(out_dir / "generation_config.json", hf_generation_config(config))
    if marian_files:
        for name in MARIAN_TOKENIZER_FILES:
            if (src_dir / name).is_file():
                checkpoint_dir.write_atomically(
                    out_dir / name, lambda p, name=name: shutil.copyfile(
                        checkpoint_dir.file_to_copy(src_dir, name), p))
        MarianTokenizer(out_dir).check_fits(config)
        return "copied"
    if vocab is None:
        return "none"
    for name in ("source.spm", "target.spm"):
        checkpoint_dir.write_atomically(out_dir / name, lambda p: shutil.copyfile(
            src_dir / checkpoint_dir.TOKENIZER_FILE, p))
    _write_json(out_dir / "vocab.json", vocab)
    _write_json(out_dir / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "pad_token": "<pad>", "eos_token": "</s>",
        "unk_token": "<unk>", "separate_vocabs": False, "model_max_length": config.max_len})
    MarianTokenizer(out_dir).check_fits(config)
    return "converted"


def _vocab_from_sentencepiece(src_dir: Path, config: TransformerConfig) -> dict[str, int] | None:
    """vocab.json for our tokenizer.model: piece -> id (our ids are SentencePiece's),
    with Marian's names for the pad, end and unknown pieces; None without a tokenizer."""
    path = checkpoint_dir.tokenizer_path(src_dir)
    if path is None:
        return None
    from transformer_core.tokenizer import Tokenizer
    sp = Tokenizer(path).sp
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) > min(config.src_vocab_size, config.tgt_vocab_size):
        raise PortError(f"{path} has {len(pieces)} pieces, the model's vocabulary "
                        f"{config.src_vocab_size}/{config.tgt_vocab_size}")
    for name, ours, theirs in (("<pad>", config.pad_id, sp.pad_id()),
                               ("</s>", config.eos_id, sp.eos_id()),
                               ("<unk>", sp.unk_id(), sp.unk_id())):
        if ours != theirs:
            raise PortError(f"{path} has {name} at id {theirs}, the model at {ours}")
        pieces[ours] = name
    if len(set(pieces)) != len(pieces):
        raise PortError(f"{path} names two pieces alike, so vocab.json cannot map them")
    return {piece: i for i, piece in enumerate(pieces)}


def _write_json(path: Path, values: dict) -> None:
    checkpoint_dir.write_atomically(path, lambda p: p.write_text(
        json.dumps(values, indent=2, sort_keys=True, ensure_ascii=False) + "\n"))
