"""The model config: validation names the bad field, JSON round trips."""

import json
import re

import pytest

from transformer_core.config import ConfigError, TransformerConfig


@pytest.mark.parametrize("changes, field", [
    (dict(d_model=30, num_heads=4), "d_model"),
    (dict(num_heads=0), "num_heads"),
    (dict(d_ff=-1), "d_ff"),
    (dict(num_encoder_layers=0), "num_encoder_layers"),
    (dict(src_vocab_size=2.5), "src_vocab_size"),
    (dict(activation="tanh"), "activation"),
    (dict(position_layout="learned"), "position_layout"),
    (dict(dropout=1.0), "dropout"),
    (dict(layer_norm_eps=0.0), "layer_norm_eps"),
    (dict(tgt_vocab_size=9000), "share_embeddings"),
    (dict(pad_id=8000), "pad_id"),
    (dict(eos_id=-1), "eos_id"),
    (dict(max_len=0), "max_len"),
    (dict(position_offset=-1), "position_offset"),
    (dict(position_layout="fairseq", d_model=3, num_heads=1), "d_model >= 4"),
    (dict(architecture="decoder"), "architecture"),
    (dict(position_encoding="rotary"), "position_encoding"),
    (dict(architecture="decoder_only", share_embeddings=False), "one token table"),
    (dict(architecture="encoder_only", share_embeddings=False, tgt_vocab_size=9000),
     "share_embeddings must be true"),
])
def test_invalid_values_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=field):
        TransformerConfig(**changes)


def test_json_round_trip(tmp_path):
    config = TransformerConfig(pre_norm=True, final_norm=True, activation="gelu",
                               position_layout="fairseq", position_offset=2,
                               share_embeddings=False,
                               tgt_vocab_size=123, tie_output=False, output_bias=True)
    config.to_json(tmp_path / "config.json")
    assert TransformerConfig.from_json(tmp_path / "config.json") == config


def test_paper_defaults():
    config = TransformerConfig()
    assert (config.d_model, config.num_heads, config.d_ff) == (512, 8, 2048)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (6, 6)
    assert not config.pre_norm and config.activation == "relu"
    assert config.layer_norm_eps == 1e-5 and config.scale_embeddings
    assert config.share_embeddings and config.tie_output


def test_unknown_field_and_bad_json(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"d_model": 512, "n_layers": 6}))
    with pytest.raises(ConfigError, match="n_layers"):
        TransformerConfig.from_json(tmp_path / "a.json")
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        TransformerConfig.from_json(tmp_path / "b.json")


@pytest.mark.parametrize("field, value, expected", [
    ("pre_norm", "false", "a boolean (true or false)"),  # a string "false" must not mean pre-norm
    ("pre_norm", "yes", "a boolean (true or false)"),
    ("tie_output", 1, "a boolean (true or false)"),
    ("d_model", True, "an integer"),
    ("num_heads", 8.0, "an integer"),
    ("pad_id", "0", "an integer"),
    ("dropout", "0.1", "a number"),
    ("layer_norm_eps", None, "a number"),
    ("dropout", False, "a number"),
    ("activation", 1, "one of 'relu', 'gelu', 'silu'"),
    ("position_layout", None, "one of 'interleaved', 'half_split', 'fairseq'"),
    ("position_offset", 2.0, "an integer"),
])
def test_every_field_is_type_checked(field, value, expected):
    with pytest.raises(ConfigError) as info:
        TransformerConfig.from_dict({field: value})
    assert str(info.value) == f"{field} must be {expected}, got {value!r} ({type(value).__name__})"


def test_integers_are_accepted_as_floats_and_round_trip(tmp_path):
    config = TransformerConfig(dropout=0, layer_norm_eps=1)
    assert (config.dropout, config.layer_norm_eps) == (0.0, 1.0)
    assert type(config.dropout) is float and type(config.layer_norm_eps) is float
    config.to_json(tmp_path / "config.json")
    assert TransformerConfig.from_json(tmp_path / "config.json") == config


def test_a_bad_config_file_is_named(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"pre_norm": "false"}))
    message = f"{tmp_path / 'bad.json'}: pre_norm must be a boolean"
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        TransformerConfig.from_json(tmp_path / "bad.json")
