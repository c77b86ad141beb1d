"""The checkpoint directory: clear errors, never a half-loaded model (the round trips
between the frameworks are parity_tests/test_checkpoint_round_trip.py)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
import torch

from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import CheckpointError
from jax_transformer.model import Transformer as FlaxTransformer
from jax_transformer.pretrained import load_torch_state_dict, to_torch_state_dict
from parity_tests.helpers import CONFIGS, assert_bit_exact, build_pair, flax_params, precision
from torch_reference.model import Transformer as TorchTransformer

CONFIG = CONFIGS["untied_bias"]
REPO_ROOT = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def saved(tmp_path):
    with precision("float32") as dtypes:
        flax_model, _ = build_pair(CONFIG, "flax_to_torch", dtypes)
        flax_model.save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def rewrite_weights(directory, edit):
    path = directory / checkpoint_dir.WEIGHTS_FILE
    tensors = safetensors.numpy.load_file(path)
    edit(tensors)
    safetensors.numpy.save_file(tensors, path)


def load_with_both(directory):
    """Every loader must refuse the same bad directory."""
    for load in (checkpoint_dir.load_dir, FlaxTransformer.from_pretrained,
                 TorchTransformer.from_pretrained):
        with pytest.raises(CheckpointError) as info:
            load(directory)
        yield str(info.value)


def test_missing_key(saved):
    rewrite_weights(saved, lambda t: t.pop("decoder.layers.1.cross_attn.W_k.weight"))
    for message in load_with_both(saved):
        assert "missing keys: decoder.layers.1.cross_attn.W_k.weight" in message


def test_unexpected_key(saved):
    rewrite_weights(saved, lambda t: t.update(extra=np.zeros(3, np.float32)))
    for message in load_with_both(saved):
        assert "unexpected keys: extra" in message


def test_shape_mismatch_names_key_and_both_shapes(saved):
    def edit(t):
        t["encoder.layers.0.ffn.W_1.weight"] = np.zeros((7, CONFIG.d_model), np.float32)
    rewrite_weights(saved, edit)
    for message in load_with_both(saved):
        assert ("shape mismatch for encoder.layers.0.ffn.W_1.weight: checkpoint has "
                f"(7, {CONFIG.d_model}), config expects ({CONFIG.d_ff}, {CONFIG.d_model})"
                in message)


def test_config_that_does_not_match_the_weights(saved):
    values = json.loads((saved / checkpoint_dir.CONFIG_FILE).read_text())
    values["num_decoder_layers"] = 3
    values["d_ff"] = 64
    (saved / checkpoint_dir.CONFIG_FILE).write_text(json.dumps(values))
    for message in load_with_both(saved):
        assert "missing keys: decoder.layers.2" in message
        assert "shape mismatch for decoder.layers.0.ffn.W_1.weight" in message


def test_invalid_config_names_the_field(saved):
    values = json.loads((saved / checkpoint_dir.CONFIG_FILE).read_text())
    values["num_heads"] = 5
    (saved / checkpoint_dir.CONFIG_FILE).write_text(json.dumps(values))
    for message in load_with_both(saved):
        assert "num_heads" in message


@pytest.mark.parametrize("field, value", [("pre_norm", "false"), ("dropout", "0.1"),
                                          ("layer_norm_eps", None)])
def test_badly_typed_config_value_names_file_and_field(saved, field, value):
    """A string "false" must not load as a pre-norm model; nor may any other wrong type."""
    path = saved / checkpoint_dir.CONFIG_FILE
    values = json.loads(path.read_text())
    values[field] = value
    path.write_text(json.dumps(values))
    for message in load_with_both(saved):
        assert message.startswith(f"{path}: {field} must be")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_or_truncated_file(saved, damage):
    path = saved / checkpoint_dir.WEIGHTS_FILE
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x07" * 64,
                      "empty": b""}[damage])
    for message in load_with_both(saved):
        assert "corrupt or truncated" in message


def test_missing_files(tmp_path, saved):
    for message in load_with_both(tmp_path / "nowhere"):
        assert "does not exist" in message
    (saved / checkpoint_dir.CONFIG_FILE).unlink()
    for message in load_with_both(saved):
        assert "has no config.json" in message


def test_bad_state_dict_leaves_models_untouched():
    """A failed load writes nothing: the check runs before the first copy."""
    with precision("float32") as dtypes:
        flax_model, torch_model = build_pair(CONFIG, "flax_to_torch", dtypes)
        good = {k: torch.from_numpy(v) for k, v in to_torch_state_dict(flax_model).items()}
        bad = {k: torch.zeros_like(v) for k, v in good.items()}
        bad["output_projection.weight"] = torch.zeros(3, 3)
        before_flax, before_torch = flax_params(flax_model), {
            k: v.clone() for k, v in torch_model.state_dict().items()}
        with pytest.raises(CheckpointError, match="output_projection.weight"):
            load_torch_state_dict(flax_model, bad)
        with pytest.raises(CheckpointError, match="output_projection.weight"):
            torch_model.load_state_dict(bad)
        assert_bit_exact(before_flax, flax_params(flax_model))
        for key, value in torch_model.state_dict().items():
            assert torch.equal(value, before_torch[key]), key


def test_save_is_atomic_and_leaves_no_temporary_files(saved):
    names = sorted(p.name for p in saved.iterdir())
    assert names == [checkpoint_dir.CONFIG_FILE, checkpoint_dir.WEIGHTS_FILE]


@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask022", "umask002"])
def test_saved_files_get_the_mode_open_would_give(tmp_path, umask):
    """Not mkstemp's 0600: others on a shared machine can read an exported model."""
    config = CONFIG.replace(num_encoder_layers=1, num_decoder_layers=1)
    tensors = {k: np.zeros(shape, np.float32)
               for k, shape in checkpoint_dir.expected_shapes(config).items()}
    (tmp_path / "spm.model").write_bytes(b"a tokenizer")
    previous = os.umask(umask)
    try:
        directory = checkpoint_dir.save_dir(tmp_path / "ckpt", config, tensors,
                                            tokenizer=tmp_path / "spm.model")
    finally:
        os.umask(previous)
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in directory.iterdir()}
    assert modes == {name: oct(0o666 & ~umask) for name in (
        checkpoint_dir.CONFIG_FILE, checkpoint_dir.WEIGHTS_FILE, checkpoint_dir.TOKENIZER_FILE)}


@pytest.mark.slow  # a subprocess
def test_torch_reference_runs_without_jax(saved):
    """torch_reference imports, runs and reads/writes the format with JAX unavailable."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["jax"] = None  # any `import jax` now raises ImportError
        sys.modules["flax"] = None
        import torch
        from torch_reference import Transformer
        model = Transformer.from_pretrained({str(saved)!r}).eval()
        logits = model(torch.tensor([[5, 6, 7]]), torch.tensor([[2, 4]]))
        assert logits.shape == (1, 2, {CONFIG.tgt_vocab_size})
        model.save_pretrained({str(saved / "again")!r})
        assert not any(m == "jax" or m.startswith("jax.") for m in sys.modules
                       if sys.modules[m] is not None)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_directory_written_whole_replaces_an_earlier_one_or_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "a" / "b" / "out"
    with pytest.raises(CheckpointError, match=f"error in {tmp_path / 'a' / 'b' / 'out'}/x$"):
        with checkpoint_dir.directory_written_whole(target) as tmp:
            (tmp / "config.json").write_text("partial")
            raise CheckpointError(f"error in {tmp}/x")  # named by the final path
    assert list(tmp_path.iterdir()) == []  # neither the output nor the directories above it
    for text in ("first", "second"):
        with checkpoint_dir.directory_written_whole(target) as tmp:
            (tmp / "config.json").write_text(text)
            assert not (target / "config.json").exists() or text == "second"
        assert [p.name for p in target.iterdir()] == ["config.json"]
        assert (target / "config.json").read_text() == text
        assert sorted(p.name for p in target.parent.iterdir()) == ["out"]
    with pytest.raises(OSError):
        with checkpoint_dir.directory_written_whole(target) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise OSError(28, "No space left on device")
    assert [p.name for p in target.iterdir()] == ["config.json"]
    assert (target / "config.json").read_text() == "second"


def test_a_directory_written_whole_refuses_to_replace_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="holds files a checkpoint directory does not "
                                              r"\(notes.txt\)"):
        with checkpoint_dir.directory_written_whole(tmp_path):
            pytest.fail("the block must not run")
    with pytest.raises(CheckpointError, match="is a file, not a directory"):
        with checkpoint_dir.directory_written_whole(tmp_path / "notes.txt"):
            pytest.fail("the block must not run")
    assert (tmp_path / "notes.txt").read_text() == "mine"
