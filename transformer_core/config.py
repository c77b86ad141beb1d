"""The one model configuration, read by both frameworks.

Pure Python: importing it pulls in neither JAX nor torch. Defaults are the paper's base model (Vaswani et al. 2017, table 3).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from typing import Any, Literal

from transformer_core.errors import InputError


class ConfigError(InputError):
    """A configuration value is invalid; the message names the field."""


def _field(default, help: str):
    """A config field with its help text, which train.py's flags show (field metadata)."""
    return dataclasses.field(default=default, metadata={"help": help})


Architecture = Literal["encoder_decoder", "encoder_only", "decoder_only"]
Activation = Literal["relu", "gelu", "silu"]
PositionEncoding = Literal["sinusoidal", "learned", "none"]
PositionLayout = Literal["interleaved", "half_split", "fairseq"]
WeightInit = Literal["normal", "xavier"]


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The model: its size, its variant, its vocabulary. Each field's help text is its
    documentation here and in `train.py --help`, where the model flags are these fields."""
    architecture: Architecture = _field(
        "encoder_decoder", "encoder_decoder: the paper's translator; encoder_only: one "
        "bidirectional stack (num_encoder_layers) giving hidden states and logits; "
        "decoder_only: one causal stack without cross-attention (num_decoder_layers), a "
        "language model. The single-stack models have one token table (share_embeddings)")
    src_vocab_size: int = _field(8000, "source token ids")
    tgt_vocab_size: int = _field(8000, "target token ids")
    d_model: int = _field(512, "model width: embeddings and every sublayer output")
    num_heads: int = _field(8, "attention heads; must divide d_model")
    d_ff: int = _field(2048, "inner width of the position-wise feed-forward layers")
    num_encoder_layers: int = _field(6, "encoder layers")
    num_decoder_layers: int = _field(6, "decoder layers (a language model's layers)")
    dropout: float = _field(0.1, "dropout on embeddings, attention probabilities, the FFN and "
                                 "each sublayer output")
    max_len: int = _field(512, "longest sequence in tokens")
    pad_id: int = _field(0, "padding token id")
    bos_id: int = _field(2, "first decoder input token (Marian starts with its pad id)")
    eos_id: int = _field(3, "end-of-sequence token id")
    # Variants used by real checkpoints (docs/model.md).
    pre_norm: bool = _field(False, "pre-LayerNorm, x + sublayer(LN(x)), instead of the "
                                   "paper's post-LN, LN(x + sublayer(x))")
    final_norm: bool = _field(False, "a LayerNorm after each stack (torch.nn.Transformer)")
    activation: Activation = _field(
        "relu", "the feed-forward layers' activation; opus-mt uses silu")
    layer_norm_eps: float = _field(1e-5, "LayerNorm epsilon (torch's default)")
    scale_embeddings: bool = _field(True, "multiply embeddings by sqrt(d_model)")
    position_encoding: PositionEncoding = _field(
        "sinusoidal", "positions: fixed sinusoids (laid out by position_layout), a learned "
                      "table (max_len + position_offset rows), or none at all")
    position_layout: PositionLayout = _field(
        "interleaved", "sinusoid columns: interleaved sin/cos (the paper), half_split, all "
                       "sines then all cosines (Marian), or fairseq's")
    position_offset: int = _field(0, "position p reads row p + offset (fairseq: pad_id + 1)")
    share_embeddings: bool = _field(True, "one table for source and target tokens")
    tie_output: bool = _field(True, "pre-softmax projection = target embedding^T")
    output_bias: bool = _field(False, "a bias on the pre-softmax projection")
    # How a new model's weights are drawn (docs/training.md: the initialisation).
    weight_init: WeightInit = _field(
        "normal", "a new model's weights: normal, every matrix and token table N(0, "
                  "init_std), padding's row 0 (Marian, BART); xavier, Xavier-uniform matrices "
                  "and N(0, d_model^-0.5) tables (the paper's reference code), which learns "
                  "far less per step in post-LN stacks 6 deep at the paper's schedule")
    init_std: float = _field(0.02, "weight_init normal's standard deviation")

    def __post_init__(self):
        for name, annotation in _field_types().items():
            value = getattr(self, name)
            problem = type_problem(name, value, annotation)
            if problem:
                raise ConfigError(problem)
            if annotation is float:  # an int from JSON ("dropout": 0) is stored as a float
                object.__setattr__(self, name, float(value))
        positive = ("src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "d_ff",
                    "num_encoder_layers", "num_decoder_layers", "max_len")
        for name in positive:
            value = getattr(self, name)
            if value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not self.init_std > 0:
            raise ConfigError(f"init_std must be positive, got {self.init_std!r}")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        if self.position_offset < 0:
            raise ConfigError(f"position_offset must be >= 0, got {self.position_offset!r}")
        if self.position_layout == "fairseq" and self.d_model < 4:
            raise ConfigError("position_layout 'fairseq' needs d_model >= 4 (its frequencies "
                              f"divide by d_model // 2 - 1), got d_model {self.d_model}")
        if self.architecture != "encoder_decoder" and not self.share_embeddings:
            raise ConfigError(f"an {self.architecture} model has one token table: "
                              "share_embeddings must be true (and the two vocabulary "
                              "sizes equal)")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                "share_embeddings needs src_vocab_size == tgt_vocab_size, got "
                f"{self.src_vocab_size} and {self.tgt_vocab_size}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < min(self.src_vocab_size, self.tgt_vocab_size):
                raise ConfigError(f"{name} must be a valid token id, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def vocab_size(self) -> int:
        """The single-stack models' one vocabulary (= src_vocab_size = tgt_vocab_size)."""
        return self.tgt_vocab_size

    def summary(self) -> str:
        """The model in words, for a command's output: "encoder-decoder, 6+6 layers,
        d_model 512, 8 heads, d_ff 2048, vocabulary 58,101 shared, max_len 512"."""
        layers = {"encoder_decoder": f"{self.num_encoder_layers}+{self.num_decoder_layers}",
                  "encoder_only": str(self.num_encoder_layers),
                  "decoder_only": str(self.num_decoder_layers)}[self.architecture]
        vocabulary = (f"vocabulary {self.src_vocab_size:,} shared" if self.share_embeddings
                      else f"vocabularies {self.src_vocab_size:,} (source) and "
                           f"{self.tgt_vocab_size:,} (target)")
        return (f"{self.architecture.replace('_', '-')}, {layers} layers, d_model "
                f"{self.d_model}, {self.num_heads} heads, d_ff {self.d_ff}, {vocabulary}, "
                f"max_len {self.max_len}")

    def replace(self, **changes: Any) -> "TransformerConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "TransformerConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        return cls(**values)

    def to_json(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2, sort_keys=True)
            f.write("\n")

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "TransformerConfig":
        """Read a config.json; every error names the file."""
        try:
            with open(path) as f:
                values = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from e
        if not isinstance(values, dict):
            raise ConfigError(f"{path} must hold a JSON object, got {type(values).__name__}")
        try:
            return cls.from_dict(values)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from e


@functools.cache
def _field_types() -> dict[str, Any]:
    """Each field's annotation, evaluated (this module's annotations are strings)."""
    return typing.get_type_hints(TransformerConfig)


def type_problem(name: str, value: Any, annotation: Any) -> str | None:
    """None when `value` has the type `annotation`, else "NAME must be ..., got VALUE
    (TYPE)". The rules of TransformerConfig's fields, shared with every reader of a
    foreign config (jax_transformer.port): bool only for bool, int (not bool) for int,
    int or float (not bool) for float, one of the listed strings for a Literal, and
    str, list[X] and X | Y as written."""
    if _has_type(value, annotation):
        return None
    return f"{name} must be {_describe(annotation)}, got {value!r} ({type(value).__name__})"


def _has_type(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return isinstance(value, str) and value in typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, option) for option in typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return isinstance(value, list) and all(_has_type(v, item) for v in value)
    if isinstance(value, bool):
        return annotation is bool
    return isinstance(value, (int, float) if annotation is float else annotation)


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(annotation)))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(map(_describe, typing.get_args(annotation)))
    if origin is list:
        (item,) = typing.get_args(annotation)
        return "a list of " + {str: "strings", int: "integers"}.get(item, _describe(item))
    return {bool: "a boolean (true or false)", int: "an integer", float: "a number",
            str: "a string"}[annotation]
