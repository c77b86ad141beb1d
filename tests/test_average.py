"""jaxformer-average through the real command: the mean of checkpoint directories of one
model, refused for different models, and taken by translate."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors
import safetensors.numpy

from jax_transformer.commands import average as average_command
from transformer_core.checkpoint_dir import expected_shapes, load_dir, save_dir
from transformer_core.config import TransformerConfig
from transformer_core.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    words = "the cat dog sat on a mat house small big red blue green".split()
    rng = np.random.RandomState(0)
    corpus = [" ".join(rng.choice(words, size=rng.randint(3, 8))) for _ in range(200)]
    return Tokenizer.train(corpus, tmp_path_factory.mktemp("spm") / "spm.model", vocab_size=40)


def config_for(tokenizer, **changes) -> TransformerConfig:
    sizes = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
                 max_len=32)
    return TransformerConfig(src_vocab_size=tokenizer.vocab_size,
                             tgt_vocab_size=tokenizer.vocab_size, **{**sizes, **changes})


def checkpoint(directory: Path, tokenizer, seed: int, **changes) -> Path:
    config = config_for(tokenizer, **changes)
    rng = np.random.default_rng(seed)
    tensors = {name: rng.normal(size=shape).astype(np.float32)
               for name, shape in expected_shapes(config).items()}
    return save_dir(directory, config, tensors, tokenizer=tokenizer.path)


def average(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jax_transformer.commands.average",
                           *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=120)


def disk_full(*args, **kwargs):
    """safetensors.numpy.save_file on a full disk: the error it raises, word for word."""
    raise safetensors.SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)")


def weights(directory: Path) -> dict[str, np.ndarray]:
    return safetensors.numpy.load_file(directory / "model.safetensors")


def test_the_average_is_the_parameter_mean(tmp_path, tokenizer):
    a, b = checkpoint(tmp_path / "a", tokenizer, 0), checkpoint(tmp_path / "b", tokenizer, 1)
    result = average(a, b, "--output", tmp_path / "avg")
    assert result.returncode == 0, result.stderr
    assert "averaged 2 checkpoints into" in result.stderr
    mean, wa, wb = weights(tmp_path / "avg"), weights(a), weights(b)
    assert mean.keys() == wa.keys()
    for name in wa:
        expected = ((wa[name].astype(np.float64) + wb[name]) / 2).astype(np.float32)
        np.testing.assert_array_equal(mean[name], expected, err_msg=name)
        assert mean[name].dtype == np.float32
    config, _ = load_dir(tmp_path / "avg")  # an ordinary checkpoint directory
    assert config == config_for(tokenizer)
    assert (tmp_path / "avg" / "tokenizer.model").read_bytes() == tokenizer.path.read_bytes()


def test_copies_of_one_checkpoint_average_to_it_bit_for_bit(tmp_path, tokenizer):
    a = checkpoint(tmp_path / "a", tokenizer, 2)
    copies = [shutil.copytree(a, tmp_path / name) for name in ("b", "c")]
    assert average(a, *copies, "--output", tmp_path / "avg").returncode == 0
    mean, original = weights(tmp_path / "avg"), weights(a)
    for name in original:
        assert mean[name].tobytes() == original[name].tobytes(), name


@pytest.mark.parametrize("other, message", [
    (dict(d_ff=64), "are different models (config.json differs in d_ff): only checkpoints of "
                    "one model average"),
    (dict(pre_norm=True), "are different models (config.json differs in pre_norm)"),
    ("tokenizer", "have different tokenizers"),
])
def test_checkpoints_of_different_models_are_refused_in_one_line(tmp_path, tokenizer, other,
                                                                   message):
    a = checkpoint(tmp_path / "a", tokenizer, 0)
    if other == "tokenizer":
        b = checkpoint(tmp_path / "b", tokenizer, 1)
        data = tokenizer.path.read_bytes()
        (b / "tokenizer.model").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:
        b = checkpoint(tmp_path / "b", tokenizer, 1, **other)
    result = average(a, b, "--output", tmp_path / "avg")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {b} and {a} ")
    assert message in result.stderr
    assert not (tmp_path / "avg").exists()


@pytest.mark.parametrize("case", ["output is an input", "missing", "no weights"])
def test_bad_input_is_one_line(tmp_path, tokenizer, case):
    a = checkpoint(tmp_path / "a", tokenizer, 0)
    output, expected = tmp_path / "avg", None
    if case == "output is an input":
        output, expected = a, f"error: --output {a} is one of the checkpoints averaged"
    elif case == "missing":
        expected = f"error: checkpoint directory {tmp_path / 'nope'} does not exist"
    else:
        (tmp_path / "nope").mkdir()
        expected = f"error: {tmp_path / 'nope'} has no config.json"
    before = weights(a)
    result = average(a, tmp_path / "nope" if case != "output is an input" else a,
                     "--output", output)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(expected), result.stderr
    assert all(np.array_equal(before[k], v) for k, v in weights(a).items())


def test_a_tokenizer_file_linked_out_of_the_checkpoint_is_refused(tmp_path, tokenizer):
    """The average is a checkpoint to share: a tokenizer file that is a link to a file
    outside its directory would carry that file into it (issue 47's case 16)."""
    a, b = checkpoint(tmp_path / "a", tokenizer, 0), checkpoint(tmp_path / "b", tokenizer, 1)
    secret = tmp_path / "secret.json"
    secret.write_text('{"password": "hunter2"}')
    for directory in (a, b):
        (directory / "special_tokens_map.json").symlink_to(secret)
    result = average(a, b, "--output", tmp_path / "avg")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"error: {a / 'special_tokens_map.json'} is a link to ")
    assert not (tmp_path / "avg").exists()


def test_a_checkpoint_given_twice_is_refused(tmp_path, tokenizer, capsys, monkeypatch):
    """However it is spelt. Before: it was averaged twice without a word, weighing it double."""
    a, b = checkpoint(tmp_path / "a", tokenizer, 0), checkpoint(tmp_path / "b", tokenizer, 1)
    monkeypatch.chdir(tmp_path)
    for given, named in (([a, b, a], f"{a} is given twice"),
                         ([a, b, "a/."], f"{a} is given twice (as {a} and a)")):
        code = average_command.main([*map(str, given), "--output", str(tmp_path / "avg")])
        assert code == 2 and capsys.readouterr().err.splitlines() == [
            f"error: {named}: an average takes each checkpoint once, and the same one twice "
            "would weigh it double; give it once"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, tokenizer, capsys, monkeypatch):
    """Before: safetensors' SafetensorError, not an OSError, went past the wrapper as a
    traceback."""
    a, b = checkpoint(tmp_path / "a", tokenizer, 0), checkpoint(tmp_path / "b", tokenizer, 1)
    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    code = average_command.main([str(a), str(b), "--output", str(tmp_path / "avg")])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        f"error: [Errno 28] No space left on device: '{tmp_path / 'avg' / 'model.safetensors'}'"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


@pytest.mark.slow  # JAX loads the model
def test_translate_takes_the_average(tmp_path, tokenizer):
    a, b = checkpoint(tmp_path / "a", tokenizer, 0), checkpoint(tmp_path / "b", tokenizer, 1)
    assert average(a, b, "--output", tmp_path / "avg").returncode == 0
    result = subprocess.run([sys.executable, "-m", "jax_transformer.commands.translate",
                             "--checkpoint", tmp_path / "avg", "--beam", "1"],
                            input="the cat sat\n", cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
