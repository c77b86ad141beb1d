"""Our checkpoint directory -> a CTranslate2 model directory (a ctranslate2.Translator).

    OUT/model.bin                 the weights, as CTranslate2's TransformerSpec names them
    OUT/config.json               CTranslate2's config: special tokens, LayerNorm epsilon
    OUT/shared_vocabulary.json    every id's SentencePiece piece (source_/target_vocabulary.json
                                  when the two sizes differ)
    OUT/tokenizer.model           our tokenizer, copied, to turn text into those pieces

Built with CTranslate2's model-spec API (`TransformerSpec.from_config`, weights set from
numpy) rather than its Hugging Face converter, so transformers is not needed and no
foreign model is built on the way: each of our tensors is written once, to the spec's
variable that computes the same thing.

    ours                                      CTranslate2's TransformerSpec
    pre_norm / final_norm                     pre_norm / no_final_norm (post-LN has no final norm)
    activation relu, gelu (erf), silu         Activation.RELU, GELU, SWISH
    layer_norm_eps                            config.layer_norm_epsilon
    scale_embeddings (sqrt(d_model))          encoder/decoder.scale_embeddings
    positions (any layout, offset, learned)   position_encodings.encodings: our table, row p
                                              for position p (CTranslate2's own sinusoids
                                              start at position 1 and are fairseq's layout)
    W_q, W_k, W_v (self-attention)            linear[0]: the three stacked, (3D, D)
    W_q; W_k, W_v (cross-attention)           linear[0]; linear[1]: the two stacked, (2D, D)
    W_o                                       linear[-1]
    tie_output / output_bias                  projection.weight = the target table / its bias
    bos_id (the decoder's first input)        decoder_start_token, bos_token: its piece
    eos_id, the tokenizer's unk id            eos_token, unk_token; add_source_eos, as
                                              Tokenizer.encode_source ends sources in eos

What CTranslate2's Translator cannot compute is a PortError naming the field: a
single-stack model, post-LN with final norms, a config field this export does not know
at a non-default value; so is a checkpoint without our tokenizer.model (CTranslate2
needs every id's token).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jax_transformer.port.options import Format
from jax_transformer.port.reading import PortError
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.positions import position_rows
from transformer_core.tokenizer import Tokenizer

TARGET = "ctranslate2"
EXTRA = "serve"  # the pyproject extra that installs ctranslate2
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH"}  # ours -> common_spec.Activation
# Fields the spec expresses whatever their value; the rest are checked in check_expressible.
FREE_FIELDS = {"architecture", "src_vocab_size", "tgt_vocab_size", "d_model", "num_heads",
               "d_ff", "num_encoder_layers", "num_decoder_layers", "dropout", "max_len",
               "pad_id", "bos_id", "eos_id", "pre_norm", "final_norm", "activation",
               "layer_norm_eps", "scale_embeddings", "position_encoding", "position_layout",
               "position_offset", "share_embeddings", "tie_output", "output_bias",
               "weight_init", "init_std"}
# What the export writes into OUT: an earlier export may be replaced whole.
OUTPUT_FILES = frozenset({"model.bin", "config.json", "shared_vocabulary.json",
                          "source_vocabulary.json", "target_vocabulary.json",
                          checkpoint_dir.TOKENIZER_FILE})


def import_ctranslate2():
    """The ctranslate2 module, or a PortError naming the extra that installs it."""
    try:
        import ctranslate2
    except ImportError as e:
        raise PortError(f"exporting to CTranslate2 needs the ctranslate2 package: "
                        f"pip install 'jax-transformer[{EXTRA}]' ({e})") from None
    return ctranslate2


def check_expressible(config: TransformerConfig) -> None:
    """Raise PortError, naming the field, unless a CTranslate2 Translator computes this model."""
    if config.architecture != "encoder_decoder":
        raise PortError(f"cannot export to CTranslate2: architecture={config.architecture!r} "
                        "(the export writes a ctranslate2.Translator, an encoder-decoder model)")
    if config.final_norm and not config.pre_norm:
        raise PortError("cannot export to CTranslate2: final_norm=True with pre_norm=False "
                        "(CTranslate2's post-LN stacks end without a LayerNorm)")
    for field in dataclasses.fields(TransformerConfig):  # fields added later: defaults only
        if field.name not in FREE_FIELDS and getattr(config, field.name) != field.default:
            raise PortError(f"cannot export to CTranslate2: {field.name}="
                            f"{getattr(config, field.name)!r} (the export knows only its "
                            f"default, {field.default!r})")


def vocabulary(tokenizer: Tokenizer, config: TransformerConfig, size: int) -> list[str]:
    """Id -> token for `size` ids: the tokenizer's pieces (our ids are SentencePiece's),
    then, for ids the tokenizer never produces, unique fillers "<unused_ID>"."""
    sp = tokenizer.sp
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    if len(pieces) > size:
        raise PortError(f"{tokenizer.path} has {len(pieces)} pieces, the model's vocabulary "
                        f"{size}")
    for name, ours, theirs in (("pad", config.pad_id, sp.pad_id()),
                               ("eos", config.eos_id, sp.eos_id())):
        if ours != theirs:
            raise PortError(f"{tokenizer.path} has its {name} piece at id {theirs}, the model "
                            f"at {ours}")
    taken = set(pieces)
    fillers = [f"<unused_{i}>" for i in range(len(pieces), size)]
    if taken & set(fillers):
        raise PortError(f"{tokenizer.path} has a piece named like a filler: "
                        f"{sorted(taken & set(fillers))[0]}")
    return pieces + fillers


def build_spec(config: TransformerConfig, tensors: dict[str, np.ndarray], tokenizer: Tokenizer):
    """A validated ctranslate2 TransformerSpec holding `tensors` (torch-named, our layout)."""
    check_expressible(config)
    ctranslate2 = import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec
    spec = transformer_spec.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers), config.num_heads,
        pre_norm=config.pre_norm, no_final_norm=not config.final_norm,
        activation=getattr(common_spec.Activation, ACTIVATIONS[config.activation]))
    source_table = tensors["shared_embed.weight" if config.share_embeddings else "src_embed.weight"]
    target_table = tensors["shared_embed.weight" if config.share_embeddings else "tgt_embed.weight"]
    positions = _position_table(config, tensors, source_table.dtype)  # (max_len, D)

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = source_table
    decoder.embeddings.weight = target_table
    for stack in (encoder, decoder):
        stack.scale_embeddings = config.scale_embeddings
        stack.position_encodings.encodings = positions
    for i, layer in enumerate(encoder.layer):
        _set_layer(layer, tensors, f"encoder.layers.{i}")
    for i, layer in enumerate(decoder.layer):
        prefix = f"decoder.layers.{i}"
        _set_layer(layer, tensors, prefix)
        _set_attention(layer.attention.linear, tensors, f"{prefix}.cross_attn",
                       fused=("W_k", "W_v"))
        _set_layer_norm(layer.attention.layer_norm, tensors, f"{prefix}.cross_attn_norm")
    if config.final_norm:
        _set_layer_norm(encoder.layer_norm, tensors, "encoder.final_norm")
        _set_layer_norm(decoder.layer_norm, tensors, "decoder.final_norm")
    if config.tie_output:
        decoder.projection.weight = target_table
        bias = tensors.get("output_bias")
    else:
        decoder.projection.weight = tensors["output_projection.weight"]
        bias = tensors.get("output_projection.bias")
    if bias is not None:
        decoder.projection.bias = bias

    source = vocabulary(tokenizer, config, config.src_vocab_size)
    target = vocabulary(tokenizer, config, config.tgt_vocab_size)
    spec.register_source_vocabulary(source)
    spec.register_target_vocabulary(target)
    spec.config.unk_token = target[tokenizer.sp.unk_id()]
    spec.config.bos_token = spec.config.decoder_start_token = target[config.bos_id]
    spec.config.eos_token = target[config.eos_id]
    spec.config.add_source_eos = True
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    spec.register_file(str(tokenizer.path), checkpoint_dir.TOKENIZER_FILE)
    try:
        spec.validate()
    except ValueError as e:  # a weight left unset: a bug here, said as CTranslate2 says it
        raise PortError(f"CTranslate2 {ctranslate2.__version__} refuses the spec: {e}") from e
    return spec


def export_ctranslate2(src_dir: str | os.PathLike,
                       out_dir: str | os.PathLike) -> TransformerConfig:
    """Write `src_dir` (our checkpoint directory, with its tokenizer.model) as a CTranslate2
    model directory, whole or not at all; returns the model's config."""
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    try:
        config, tensors = checkpoint_dir.load_dir(src_dir)
    except checkpoint_dir.CheckpointError as e:
        raise PortError(str(e)) from e
    check_expressible(config)  # refusals come before the tokenizer's and the package's
    tokenizer_file = checkpoint_dir.tokenizer_path(src_dir)
    if tokenizer_file is None:
        raise PortError(f"{src_dir} has no {checkpoint_dir.TOKENIZER_FILE}: CTranslate2 needs "
                        "every id's token (converted Marian/fairseq tokenizers are not exported)")
    spec = build_spec(config, tensors, Tokenizer(tokenizer_file))
    with checkpoint_dir.directory_written_whole(out_dir, OUTPUT_FILES) as tmp:
        spec.optimize()  # equal tensors (a tied or shared table) stored once; no quantization
        spec.save(str(tmp))
    return config


def to_ctranslate2(src_dir: str, out_dir: str, options: Mapping[str, Any]) -> str:
    """--to ctranslate2: what was written, for jaxformer-port's "wrote OUT ..." line."""
    return (f"as a CTranslate2 model ({export_ctranslate2(src_dir, out_dir).summary()}), "
            "tokenizer copied")


FORMAT = Format(TARGET, to_ctranslate2)


def _position_table(config: TransformerConfig, tensors: dict[str, np.ndarray],
                    dtype) -> np.ndarray:
    """What our embedding adds at positions 0..max_len-1, (max_len, D): the sinusoids,
    the learned table's rows from position_offset on, or zeros (position_encoding none)."""
    if config.position_encoding == "learned":
        return tensors["position_embed.weight"][config.position_offset:]
    if config.position_encoding == "none":
        return np.zeros((config.max_len, config.d_model), dtype)
    return position_rows(config).astype(dtype)


def _set_layer(layer, tensors: dict[str, np.ndarray], prefix: str) -> None:
    """Self-attention, feed-forward and their LayerNorms of one encoder or decoder layer."""
    _set_attention(layer.self_attention.linear, tensors, f"{prefix}.self_attn",
                   fused=("W_q", "W_k", "W_v"))
    _set_layer_norm(layer.self_attention.layer_norm, tensors, f"{prefix}.self_attn_norm")
    _set_linear(layer.ffn.linear_0, tensors, f"{prefix}.ffn.W_1")
    _set_linear(layer.ffn.linear_1, tensors, f"{prefix}.ffn.W_2")
    _set_layer_norm(layer.ffn.layer_norm, tensors, f"{prefix}.ffn_norm")


def _set_attention(linears, tensors: dict[str, np.ndarray], prefix: str,
                   fused: tuple[str, ...]) -> None:
    """CTranslate2's attention linears: [W_q, W_k, W_v stacked; W_o] for self-attention,
    [W_q; W_k, W_v stacked; W_o] for cross-attention (`fused` are the stacked ones)."""
    *query, stacked, output = linears
    for linear in query:  # cross-attention's, on the decoder's states
        _set_linear(linear, tensors, f"{prefix}.W_q")
    stacked.weight = np.concatenate([tensors[f"{prefix}.{n}.weight"] for n in fused])  # (nD, D)
    stacked.bias = np.concatenate([tensors[f"{prefix}.{n}.bias"] for n in fused])  # (nD,)
    _set_linear(output, tensors, f"{prefix}.W_o")


def _set_linear(spec, tensors: dict[str, np.ndarray], prefix: str) -> None:
    spec.weight = tensors[f"{prefix}.weight"]  # (out, in): torch's layout is CTranslate2's
    spec.bias = tensors[f"{prefix}.bias"]


def _set_layer_norm(spec, tensors: dict[str, np.ndarray], prefix: str) -> None:
    spec.gamma = tensors[f"{prefix}.weight"]
    spec.beta = tensors[f"{prefix}.bias"]
