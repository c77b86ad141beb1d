"""ModelSettings: TransformerConfig's fields as flags, less those the data decide; the
named sizes (--preset) their defaults come from."""

from __future__ import annotations

import dataclasses
import re

from jax_transformer.train.settings.data import MIN_MAX_LEN, SPECIAL_IDS
from jax_transformer.train.settings.fields import flag, name_metavars, setting
from jax_transformer.train.settings.history import OLD_FLAGS
from transformer_core.config import (Activation, ConfigError, PositionEncoding, PositionLayout,
                                     TransformerConfig, WeightInit)
from transformer_core.errors import TrainError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID

# Named model sizes (--preset), as fairseq's --arch and Flax WMT's configs name them;
# flags given beside a preset override it.
PRESETS = {
    "tiny": dict(d_model=128, num_heads=4, d_ff=512, num_encoder_layers=3,
                 num_decoder_layers=3, dropout=0.1),  # the built-in corpus, on a CPU
    "base": dict(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6,
                 num_decoder_layers=6, dropout=0.1),  # the paper's base (table 3)
    "big": dict(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=6,
                num_decoder_layers=6, dropout=0.3),  # the paper's big
}
DEFAULT_PRESET = "tiny"
# TransformerConfig fields the run sets itself: from the tokenizer, --max-len and --task.
DERIVED_MODEL_FIELDS = ("architecture", "src_vocab_size", "tgt_vocab_size", "max_len",
                        "pad_id", "bos_id", "eos_id", "final_norm")


def model_setting(name: str, resumable: bool = False):
    """A model flag: TransformerConfig's field `name` with its help text, defaulting to
    the tiny preset's value (the command line sets the chosen preset's)."""
    field = CONFIG_FIELDS[name]
    return setting(PRESETS[DEFAULT_PRESET].get(name, field.default), field.metadata["help"],
                   aliases=OLD_FLAGS.get(name, ()), resumable=resumable)


CONFIG_FIELDS = {f.name: f for f in dataclasses.fields(TransformerConfig)}


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """TransformerConfig's fields, less those the data decide; --preset picks their
    defaults."""
    # TransformerConfig's fields less DERIVED_MODEL_FIELDS, which the data decide; a
    # field added to TransformerConfig is added here too (tests/train/test_train.py checks).
    d_model: int = model_setting("d_model")
    num_heads: int = model_setting("num_heads")
    d_ff: int = model_setting("d_ff")
    num_encoder_layers: int = model_setting("num_encoder_layers")
    num_decoder_layers: int = model_setting("num_decoder_layers")
    dropout: float = model_setting("dropout")
    pre_norm: bool = model_setting("pre_norm")
    activation: Activation = model_setting("activation")
    layer_norm_eps: float = model_setting("layer_norm_eps")
    scale_embeddings: bool = model_setting("scale_embeddings")
    position_encoding: PositionEncoding = model_setting("position_encoding")
    position_layout: PositionLayout = model_setting("position_layout")
    position_offset: int = model_setting("position_offset")
    share_embeddings: bool = model_setting("share_embeddings")
    tie_output: bool = model_setting("tie_output")
    output_bias: bool = model_setting("output_bias")
    # how the weights were first drawn: a resumed run restores them
    weight_init: WeightInit = model_setting("weight_init", resumable=True)
    init_std: float = model_setting("init_std", resumable=True)

    def __post_init__(self):
        """Valid when the TransformerConfig it makes is: ConfigError's message, with the
        fields named as the flags that set them."""
        try:
            self.config(vocab_size=max(SPECIAL_IDS) + 1, max_len=MIN_MAX_LEN)
        except ConfigError as e:
            names = "|".join(f.name for f in dataclasses.fields(self))
            raise TrainError(re.sub(rf"\b({names})\b", lambda m: flag(m.group(1)),
                                    str(e))) from None

    def config(self, vocab_size: int, max_len: int,
               architecture: str = "encoder_decoder") -> TransformerConfig:
        """The model config: these settings, the tokenizer's vocabulary and special ids,
        --max-len, the task's architecture; final norms with pre-LN (as torch.nn's)."""
        return TransformerConfig(
            **dataclasses.asdict(self), architecture=architecture, src_vocab_size=vocab_size,
            tgt_vocab_size=vocab_size, max_len=max_len, pad_id=PAD_ID, bos_id=BOS_ID,
            eos_id=EOS_ID, final_norm=self.pre_norm)


name_metavars(ModelSettings)
