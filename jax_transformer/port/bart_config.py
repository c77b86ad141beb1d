"""The config.json of Hugging Face's BART family, read once for Marian (marian.py) and
for FSMT and M2M100 (fairseq.py): transformers gives their fields BART's names and
defaults, so the sizes, the activation, the dropout rates and the special ids are read
and checked here, and each family adds what is its own (model_type, vocabularies,
norms, positions, its defaults where they differ).

    HF_CONFIG_TYPES   the fields read, with the types transformers gives them
    ACTIVATIONS       transformers' activation_function names -> ours
    BartConfig        typed reading with transformers' defaults; errors name the family
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping

from jax_transformer.port.reading import PortError, check_field_types
from transformer_core.config import ConfigError, TransformerConfig

HF_CONFIG_TYPES: dict[str, Any] = {
    "model_type": str, "architectures": list[str], "activation_function": str,
    "d_model": int, "encoder_layers": int, "decoder_layers": int,
    "encoder_attention_heads": int, "decoder_attention_heads": int, "encoder_ffn_dim": int,
    "decoder_ffn_dim": int, "max_position_embeddings": int, "vocab_size": int,
    "decoder_vocab_size": int, "src_vocab_size": int, "tgt_vocab_size": int,
    "dropout": float, "attention_dropout": float, "activation_dropout": float,
    "encoder_layerdrop": float, "decoder_layerdrop": float, "layer_norm_eps": float,
    "pad_token_id": int, "eos_token_id": int | list[int], "decoder_start_token_id": int,
    "scale_embedding": bool, "tie_word_embeddings": bool,
    "share_encoder_decoder_embeddings": bool, "normalize_before": bool,
    "normalize_embedding": bool, "add_final_layer_norm": bool, "add_bias_logits": bool,
    "static_position_embeddings": bool,
}
ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
# Dropout rates besides `dropout` that ours, with one rate, cannot express.
OTHER_DROPOUTS = ("attention_dropout", "activation_dropout", "encoder_layerdrop",
                  "decoder_layerdrop")


class BartConfig:
    """A family's config.json (as a dict, read from `source`), its fields' types
    checked (HF_CONFIG_TYPES). A refusal is a PortError "unsupported FAMILY config: ..."."""

    def __init__(self, hf: Mapping[str, Any], family: str, source: str):
        check_field_types(hf, HF_CONFIG_TYPES, source)
        self.hf, self.family = hf, family

    def get(self, name: str, default: Any = None) -> Any:
        """The field, or `default` (transformers') when it is missing or null."""
        value = self.hf.get(name, default)
        return default if value is None else value

    def require(self, condition: bool, message: str) -> None:
        if not condition:
            raise PortError(f"unsupported {self.family} config: {message}")

    def check_model(self, model_type: str, architectures: tuple[str, ...],
                    why: str | None = None) -> None:
        """model_type is `model_type`, and each listed architecture one of
        `architectures` (`why` says so in the error; by default, their list)."""
        self.require(self.get("model_type") == model_type,
                     f"model_type is {self.hf.get('model_type')!r}, not {model_type!r}")
        archs = self.get("architectures", [])
        self.require(all(a in architectures for a in archs),
                     f"architectures {archs} ({why or 'expected ' + ' or '.join(architectures)})")

    def check_layers(self, activation: str) -> str:
        """Our activation for activation_function (`activation` when not given), and
        the encoder's heads and FFN width checked to be the decoder's: ours has one of
        each."""
        act = self.get("activation_function", activation)
        self.require(act in ACTIVATIONS, f"activation_function {act!r}; supported: "
                     f"{sorted(ACTIVATIONS)} (gelu means exact erf GELU)")
        for enc, dec, default in (("encoder_attention_heads", "decoder_attention_heads", 16),
                                  ("encoder_ffn_dim", "decoder_ffn_dim", 4096)):
            self.require(self.get(enc, default) == self.get(dec, default),
                         f"{enc} {self.get(enc, default)} != {dec} {self.get(dec, default)}")
        return ACTIVATIONS[act]

    def special_ids(self, pad: int | None, eos: int, start: int | None) -> dict[str, int]:
        """pad_id, bos_id (decoder_start_token_id) and eos_id, with the family's
        defaults: a None pad is required; a None start is the pad id."""
        pad = self.get("pad_token_id", pad)
        self.require(pad is not None, "pad_token_id is missing")
        eos = self.get("eos_token_id", eos)
        if isinstance(eos, list):
            self.require(len(eos) == 1, f"eos_token_id {eos} (one end token expected)")
            eos = eos[0]
        return dict(pad_id=pad, bos_id=self.get("decoder_start_token_id",
                                                pad if start is None else start), eos_id=eos)

    def layer_fields(self, activation: str, scale_embedding: bool,
                     stacklevel: int) -> dict[str, Any]:
        """TransformerConfig's fields of the layers: sizes, `activation`, one dropout
        rate (a warning, at `stacklevel` from here, names each other rate ours drops),
        embedding scaling (default `scale_embedding`) and LayerNorm eps 1e-5, torch's
        default, which the family's layers use."""
        dropout = float(self.get("dropout", 0.1))
        for name in OTHER_DROPOUTS:
            if float(self.get(name, 0.0)) not in (0.0, dropout):
                warnings.warn(f"{self.family} {name}={self.hf[name]} is not expressed (our "
                              f"model uses one dropout rate, {dropout}); this affects "
                              "training only", stacklevel=stacklevel)
        return dict(d_model=self.get("d_model", 1024),
                    num_heads=self.get("encoder_attention_heads", 16),
                    d_ff=self.get("encoder_ffn_dim", 4096),
                    num_encoder_layers=self.get("encoder_layers", 12),
                    num_decoder_layers=self.get("decoder_layers", 12), dropout=dropout,
                    max_len=self.get("max_position_embeddings", 1024), activation=activation,
                    layer_norm_eps=1e-5,
                    scale_embeddings=bool(self.get("scale_embedding", scale_embedding)))

    def build(self, **fields: Any) -> TransformerConfig:
        """Our config of these fields, or a PortError: "FAMILY config maps to an invalid
        config: ..."."""
        try:
            return TransformerConfig(**fields)
        except ConfigError as e:
            raise PortError(f"{self.family} config maps to an invalid config: {e}") from e
