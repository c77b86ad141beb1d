"""jaxformer-port on bad input: one `error: ...` line naming the file, exit 2,
nothing written; and the files it writes are readable by others, as open() would make them."""

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors
import safetensors.numpy
import safetensors.torch
import torch

import torch_reference
from jax_transformer.commands import port as port_command
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.marian_tokenizer import MarianTokenizer
from transformer_core.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8, num_heads=2, d_ff=16,
                           num_encoder_layers=1, num_decoder_layers=1, max_len=16)
MARIAN_CONFIG = {"model_type": "marian", "vocab_size": 10, "pad_token_id": 9, "d_model": 8,
                 "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                 "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "encoder_layers": 1,
                 "decoder_layers": 1, "max_position_embeddings": 16}


def state_dict():
    torch.manual_seed(0)
    return torch_reference.Transformer(CONFIG).state_dict()


def run_port(argv, capsys):
    code = port_command.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def assert_one_error_line(code, err, *parts):
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for part in parts:
        assert part in err


def truncate(path: Path, fraction: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * fraction)])


@pytest.mark.parametrize("name, legacy, fraction", [
    ("model.safetensors", False, 0.5),
    ("model.safetensors", False, 0.001),  # not even the header
    ("model.pt", False, 0.5),
    ("model.pt", False, 0.0),
    ("pytorch_model.bin", True, 0.1),  # an EOFError without a message
    ("pytorch_model.bin", True, 0.9),
])
def test_truncated_weights_are_one_error_line(tmp_path, capsys, name, legacy, fraction):
    path = tmp_path / name
    if name.endswith(".safetensors"):
        safetensors.torch.save_file(state_dict(), path)
    else:
        torch.save(state_dict(), path, _use_new_zipfile_serialization=not legacy)
    truncate(path, fraction)
    CONFIG.to_json(tmp_path / "config.json")
    code, err = run_port(["--from", "torch-reference", path, tmp_path / "out", "--config",
                          tmp_path / "config.json"], capsys)
    assert_one_error_line(code, err, f"error: cannot read {path}: ", "corrupt or truncated")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_truncated_marian_weights_are_one_error_line(tmp_path, capsys, weights):
    src = tmp_path / "marian"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(MARIAN_CONFIG))
    # a cut-off safetensors header; as a pickle, opcode 64 makes torch.load explain
    # weights_only=False in seven lines
    (src / weights).write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\":")
    code, err = run_port(["--from", "hf-marian", src, tmp_path / "out"], capsys)
    assert_one_error_line(code, err, f"cannot read {src / weights}: ", "corrupt or truncated")


@pytest.mark.parametrize("name, text", [("config.json", "{\"model_type\": \"mar"),
                                        ("config.json", "[1, 2]"),
                                        ("model.safetensors.index.json", "{\"weight_map"),
                                        ("model.safetensors.index.json", "{}")])
def test_bad_marian_json_is_one_error_line(tmp_path, capsys, name, text):
    src = tmp_path / "marian"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(MARIAN_CONFIG))
    (src / name).write_text(text)
    code, err = run_port(["--from", "hf-marian", src, tmp_path / "out"], capsys)
    assert_one_error_line(code, err, str(src / name))


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
    torch_nn_weights(tmp_path / "nn.pt")
    (tmp_path / "map.json").write_text(json.dumps({"num_heads": 2, "norm_first": "false"}))
    code, err = run_port(["--from", "torch-nn-transformer", tmp_path / "nn.pt", tmp_path / "out",
                          "--mapping", tmp_path / "map.json"], capsys)
    assert_one_error_line(code, err, "norm_first", "'false'")
    assert not (tmp_path / "out").exists()


# The smallest configs each Hugging Face importer reads (their fields, bar the ones tested).
HF_CONFIGS = {
    "hf-marian": MARIAN_CONFIG,
    "hf-fsmt": {**{k: v for k, v in MARIAN_CONFIG.items()
                   if k not in ("vocab_size", "pad_token_id")},
                "model_type": "fsmt", "src_vocab_size": 10, "tgt_vocab_size": 10},
    "hf-m2m100": {**MARIAN_CONFIG, "model_type": "m2m_100", "pad_token_id": 1},
}


@pytest.mark.parametrize("source, field, value, kind", [
    ("hf-fsmt", "dropout", "abc", "a number"),
    ("hf-fsmt", "attention_dropout", "x", "a number"),
    ("hf-fsmt", "activation_function", ["relu"], "a string"),
    ("hf-fsmt", "architectures", 5, "a list of strings"),
    ("hf-fsmt", "encoder_attention_heads", "2", "an integer"),  # was "2 != 2"
    ("hf-m2m100", "scale_embedding", "true", "a boolean (true or false)"),
    ("hf-m2m100", "eos_token_id", ["2"], "an integer or a list of integers"),
    ("hf-marian", "pad_token_id", "9", "an integer"),
    ("hf-marian", "share_encoder_decoder_embeddings", 1, "a boolean (true or false)"),
])
def test_badly_typed_hugging_face_config_names_the_field(tmp_path, capsys, source, field,
                                                          value, kind):
    """Before: a traceback each (float("abc"), an unhashable list, iterating 5), or a
    comparison of unlike types: `encoder_attention_heads 2 != decoder_attention_heads 2`."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({**HF_CONFIGS[source], field: value}))
    code, err = run_port(["--from", source, src, tmp_path / "out"], capsys)
    assert_one_error_line(code, err, f"error: {src / 'config.json'}: {field} must be {kind}, "
                                     f"got {value!r} ({type(value).__name__})")
    assert not (tmp_path / "out").exists()


def torch_nn_weights(path: Path) -> Path:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({
        "transformer": torch.nn.Transformer(8, 2, 1, 1, 16, batch_first=True),
        "src_embed": torch.nn.Embedding(10, 8), "tgt_embed": torch.nn.Embedding(10, 8),
        "generator": torch.nn.Linear(8, 10)})
    torch.save(model.state_dict(), path)
    return path


@pytest.mark.parametrize("source, field, value, kind", [
    ("torch-nn-transformer", "src_embed", 5, "a string"),  # was an AttributeError
    ("torch-nn-transformer", "ignore", "generator", "a list of strings"),  # was per letter
    ("torch-nn-encoder", "embed", ["tgt_embed"], "a string"),  # was an AttributeError
])
def test_badly_typed_torch_nn_mapping_names_the_field(tmp_path, capsys, source, field, value,
                                                      kind):
    weights = torch_nn_weights(tmp_path / "nn.pt")
    mapping = {"num_heads": 2}
    if source == "torch-nn-encoder":  # its one nn.TransformerEncoder, as a language model
        mapping.update(architecture="decoder_only", encoder="transformer.encoder.",
                       embed="tgt_embed", output="generator", position_key="",
                       ignore=["transformer.decoder.", "src_embed."])
    (tmp_path / "map.json").write_text(json.dumps({**mapping, field: value}))
    code, err = run_port(["--from", source, weights, tmp_path / "out", "--mapping",
                          tmp_path / "map.json"], capsys)
    assert_one_error_line(code, err, f"error: {source} mapping: {field} must be {kind}, got "
                                     f"{value!r}")
    assert not (tmp_path / "out").exists()


MARIAN_EXPORTABLE = CONFIG.replace(src_vocab_size=40, tgt_vocab_size=40,
                                   position_layout="half_split")
MARIAN_FILES = {"config.json", "generation_config.json", "model.safetensors", "source.spm",
                "target.spm", "vocab.json", "tokenizer_config.json"}


def exportable_checkpoint(directory: Path) -> Path:
    """Our checkpoint directory, with a SentencePiece tokenizer, that Marian can hold."""
    text = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine"] * 20
    directory.mkdir()
    Tokenizer.train(text, directory / "spm.model", vocab_size=40)
    torch.manual_seed(0)
    torch_reference.Transformer(MARIAN_EXPORTABLE).save_pretrained(
        directory, tokenizer=directory / "spm.model")
    (directory / "spm.model").unlink()
    return directory


def beside(path: Path) -> list[str]:
    """What lies beside `path` in its parent, its own name aside."""
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_export_into_an_earlier_output_replaces_it_whole(tmp_path, capsys):
    """Before: OUT holding a `{}` target_vocab.json got model.safetensors and config.json,
    then `error: ... target_vocab.json ...` (exit 2), and kept both half-written files."""
    ours = exportable_checkpoint(tmp_path / "ours")
    out = tmp_path / "hf"
    out.mkdir()
    (out / "target_vocab.json").write_text("{}")
    code, err = run_port(["--to", "hf-marian", ours, out], capsys)
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == MARIAN_FILES  # no stale vocabulary
    MarianTokenizer(out).check_fits(MARIAN_EXPORTABLE)
    assert beside(out) == ["ours"]  # no temporary directory left


def marian_files_source(tmp_path, capsys, direction: str):
    """A directory `jaxformer-port DIRECTION hf-marian` converts that holds Marian's
    tokenizer files: a Hugging Face Marian export (--from), or our checkpoint converted
    from one, which carries them (--to)."""
    src = tmp_path / "marian"
    assert run_port(["--to", "hf-marian", exportable_checkpoint(tmp_path / "ours"), src],
                    capsys)[0] == 0
    if direction == "--to":
        assert run_port(["--from", "hf-marian", src, tmp_path / "converted"], capsys)[0] == 0
        src = tmp_path / "converted"
    return src


@pytest.mark.parametrize("direction", ["--to", "--from"])
def test_a_conversion_failing_part_way_leaves_nothing(tmp_path, capsys, direction):
    """The Marian tokenizer is checked after the weights are written: a `{}`
    target_vocab.json fails it. Before: --from hf-marian left config.json,
    model.safetensors and the tokenizer files in OUT (exit 2); --to hf-marian copied the
    broken vocabulary without checking it (exit 0). Now OUT is as it was: absent, or an
    earlier output, unchanged."""
    src = marian_files_source(tmp_path, capsys, direction)
    (src / "target_vocab.json").write_text("{}")
    before = {p.name for p in tmp_path.iterdir()}
    code, err = run_port([direction, "hf-marian", src, tmp_path / "new" / "out"], capsys)
    assert_one_error_line(code, err, f"error: {tmp_path / 'new' / 'out'}: vocab has no '</s>'")
    assert {p.name for p in tmp_path.iterdir()} == before  # nor the directory made above it
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "config.json").write_text("{\"kept\": true}\n")
    code, err = run_port([direction, "hf-marian", src, tmp_path / "earlier"], capsys)
    assert_one_error_line(code, err, f"error: {tmp_path / 'earlier'}: vocab has no '</s>'")
    assert {p.name for p in tmp_path.iterdir()} == before | {"earlier"}
    assert [p.name for p in (tmp_path / "earlier").iterdir()] == ["config.json"]
    assert (tmp_path / "earlier" / "config.json").read_text() == "{\"kept\": true}\n"


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["--to", "--from"])
@pytest.mark.parametrize("kind", ["link out", "not JSON"])
def test_a_copied_tokenizer_file_is_checked(tmp_path, capsys, direction, kind):
    """special_tokens_map.json is copied, never read. Before: a link to a file outside SRC
    put that file's bytes into OUT, and a file that is not JSON was copied as it was."""
    src = marian_files_source(tmp_path, capsys, direction)
    copied, secret = src / "special_tokens_map.json", tmp_path / "secret.json"
    if kind == "link out":
        secret.write_text('{"password": "hunter2"}')
        copied.symlink_to(secret)
        message = (f"error: {copied} is a link to {secret}, outside {src}; copy the file "
                   f"itself into {src}")
    else:
        copied.write_text("<html>")
        message = f"error: {copied} is not valid JSON: Expecting value: line 1 column 1 (char 0)"
    result = subprocess.run([sys.executable, "-m", "jax_transformer.commands.port", direction,
                             "hf-marian", str(src), str(tmp_path / "out")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.splitlines() == [message], result.stderr
    assert not (tmp_path / "out").exists()


def disk_full(*args, **kwargs):
    """safetensors.numpy.save_file on a full disk: the error it raises, word for word."""
    raise safetensors.SafetensorError(
        "Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("direction", ["--to", "--from"])
def test_a_full_disk_is_one_error_line_and_leaves_nothing(tmp_path, capsys, monkeypatch,
                                                          direction):
    """Both writers of weights: hf_export's (--to hf-marian) and checkpoint_dir.save_dir
    (every --from). Before: safetensors' SafetensorError, not an OSError, was a traceback."""
    out = tmp_path / "out"
    if direction == "--to":
        argv = ["--to", "hf-marian", exportable_checkpoint(tmp_path / "ours"), out]
    else:
        torch.save(state_dict(), tmp_path / "model.pt")
        CONFIG.to_json(tmp_path / "config.json")
        argv = ["--from", "torch-reference", tmp_path / "model.pt", out, "--config",
                tmp_path / "config.json"]
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    code, err = run_port(argv, capsys)
    assert_one_error_line(code, err, "error: [Errno 28] No space left on device: "
                                     f"'{out / 'model.safetensors'}'")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_directory_holding_other_files_is_refused(tmp_path, capsys):
    """Replacing OUT whole would delete what else it holds: refused before any work."""
    ours = exportable_checkpoint(tmp_path / "ours")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    code, err = run_port(["--to", "hf-marian", ours, tmp_path / "out"], capsys)
    assert_one_error_line(code, err, f"error: {tmp_path / 'out'} holds files a checkpoint "
                                     "directory does not (notes.txt)")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["notes.txt"]
    code, err = run_port(["--to", "hf-marian", ours, ours], capsys)
    assert_one_error_line(code, err, f"error: the output directory {ours} is the source")


@pytest.mark.slow
def test_command_line_writes_files_others_can_read(tmp_path):
    """Under umask 022 the exported files are 0644, as any file open() makes, not 0600."""
    torch.save(state_dict(), tmp_path / "model.pt")
    CONFIG.to_json(tmp_path / "config.json")
    (tmp_path / "spm.model").write_bytes(b"a tokenizer")
    out = tmp_path / "out"
    result = subprocess.run(
        ["sh", "-c", 'umask 022 && exec "$@"', "sh", sys.executable, "-m", "jax_transformer.commands.port",
         "--from", "torch-reference", str(tmp_path / "model.pt"), str(out), "--config",
         str(tmp_path / "config.json"), "--tokenizer", str(tmp_path / "spm.model")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in out.iterdir()}
    assert modes == {checkpoint_dir.CONFIG_FILE: "0o644", checkpoint_dir.WEIGHTS_FILE: "0o644",
                     checkpoint_dir.TOKENIZER_FILE: "0o644"}


def test_export_to_ctranslate2_without_the_package_names_the_extra(tmp_path, capsys,
                                                                   monkeypatch):
    ours = exportable_checkpoint(tmp_path / "ours")
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    code, err = run_port(["--to", "ctranslate2", ours, tmp_path / "ct2"], capsys)
    assert_one_error_line(code, err, "error: exporting to CTranslate2 needs the ctranslate2 "
                                     "package: pip install 'jax-transformer[serve]'")
    assert beside(tmp_path / "ours") == []  # nothing written
