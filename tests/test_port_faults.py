"""python -m jax_transformer.port on bad input: one `error: ...` line naming the file,
exit 2, nothing written."""

import json

import pytest
import torch

import torch_reference
from jax_transformer import port
from transformer_core.config import TransformerConfig

CONFIG = TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8, num_heads=2, d_ff=16,
                           num_encoder_layers=1, num_decoder_layers=1, max_len=16)


def state_dict():
    torch.manual_seed(0)
    return torch_reference.Transformer(CONFIG).state_dict()


def run_port(argv, capsys):
    code = port.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def assert_one_error_line(code, err, *parts):
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for part in parts:
        assert part in err


@pytest.mark.parametrize("field, value", [("dropout", "0.1"), ("pre_norm", "false")])
def test_badly_typed_config_is_one_error_line(tmp_path, capsys, field, value):
    torch.save(state_dict(), tmp_path / "model.pt")
    (tmp_path / "bad.json").write_text(json.dumps({**CONFIG.to_dict(), field: value}))
    code, err = run_port(["--from", "torch-reference", tmp_path / "model.pt", tmp_path / "out",
                          "--config", tmp_path / "bad.json"], capsys)
    assert_one_error_line(code, err, f"error: {tmp_path / 'bad.json'}: {field} must be ")
    assert not (tmp_path / "out").exists()


def test_badly_typed_bundled_config_names_the_file(tmp_path, capsys):
    path = tmp_path / "model.pt"
    torch.save({"config": {**CONFIG.to_dict(), "pre_norm": "false"},
                "state_dict": state_dict()}, path)
    code, err = run_port(["--from", "torch-reference", path, tmp_path / "out"], capsys)
    assert_one_error_line(code, err, f"error: {path}: pre_norm must be a boolean")


def test_badly_typed_torch_nn_mapping_is_an_error(tmp_path, capsys):
    """"norm_first": "false" in a --mapping file is not a pre-LN model."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({
        "transformer": torch.nn.Transformer(8, 2, 1, 1, 16, batch_first=True),
        "src_embed": torch.nn.Embedding(10, 8), "tgt_embed": torch.nn.Embedding(10, 8),
        "generator": torch.nn.Linear(8, 10)})
    torch.save(model.state_dict(), tmp_path / "nn.pt")
    (tmp_path / "map.json").write_text(json.dumps({"num_heads": 2, "norm_first": "false"}))
    code, err = run_port(["--from", "torch-nn-transformer", tmp_path / "nn.pt", tmp_path / "out",
                          "--mapping", tmp_path / "map.json"], capsys)
    assert_one_error_line(code, err, "norm_first", "'false'")
    assert not (tmp_path / "out").exists()
