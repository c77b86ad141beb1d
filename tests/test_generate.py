"""The generate command on a tiny random decoder-only checkpoint."""

import subprocess
import sys

import pytest

import torch_reference
from jax_transformer import TransformerConfig
from jax_transformer.commands import generate
from tests.helpers import REPO, run_generate


def test_errors_are_clear(checkpoint, tmp_path, capsys):
    translator = tmp_path / "translator"
    torch_reference.Transformer(TransformerConfig(
        src_vocab_size=60, tgt_vocab_size=60, d_model=16, num_heads=2, d_ff=32,
        num_encoder_layers=1, num_decoder_layers=1)).save_pretrained(translator)
    for args, message in (
            (["--checkpoint", translator], "holds an encoder_decoder model; generate continues "
                                           "text with decoder_only models"),
            (["--checkpoint", tmp_path / "nope"], "does not exist"),
            (["--checkpoint", tmp_path], "has no config.json"),
            (["--temperature", "-1"], "temperature must be >= 0"),
            (["--top-p", "0"], "top_p must be in (0, 1]"),
            (["--top-k", "-2"], "top_k must be an integer >= 0"),
            (["--max-new-tokens", "40"], "exceed the model's max_len 32")):
        args = ["--checkpoint", checkpoint, *args] if args[0] != "--checkpoint" else args
        code, out, err = run_generate([*args, "--prompt", "a", "--framework", "torch"], capsys)
        assert (code, out) == (2, []), err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err

    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((checkpoint / name).read_bytes())
    code, _, err = run_generate(["--checkpoint", no_tokenizer, "--prompt", "a"], capsys)
    assert code == 2 and "has no tokenizer.model" in err

    with pytest.raises(SystemExit) as exit_info:  # argparse: usage and exit code 2
        generate.parse_args(["--checkpoint", str(checkpoint), "--prompt", "a",
                             "--beam-size", "2", "--top-k", "5"])
    assert exit_info.value.code == 2
    assert "drop --top-k" in capsys.readouterr().err


@pytest.mark.slow
def test_command_line_torch_needs_no_jax(checkpoint):
    """`jaxformer-generate --framework torch` (via runpy, as -m does)
    never imports JAX."""
    script = ("import runpy, sys\n"
              "sys.argv = ['generate'] + sys.argv[1:]\n"
              "try:\n"
              "    runpy.run_module('jax_transformer.commands.generate', run_name='__main__')\n"
              "except SystemExit as e:\n"
              "    assert e.code in (0, None), e.code\n"
              "assert 'jax' not in sys.modules, 'JAX was imported'\n")
    result = subprocess.run(
        [sys.executable, "-c", script, "--checkpoint", str(checkpoint), "--framework", "torch",
         "--prompt", "the cat", "--prompt", "a dog", "--top-k", "5", "--max-new-tokens", "6"],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 2


@pytest.mark.parametrize("alpha", ["nan", "inf", "-1"])
def test_a_length_penalty_that_is_not_a_finite_number_of_at_least_0_is_refused(
        checkpoint, capsys, alpha):
    code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt", "a", "--beam-size", "2",
                                   "--alpha", alpha, "--framework", "torch"], capsys)
    assert (code, out) == (2, [])
    assert err.splitlines() == [f"error: --alpha must be a number >= 0 (0: no length "
                                f"penalty), got {float(alpha)}"]


def test_a_prompt_longer_than_the_model_names_no_flag_the_user_did_not_give(checkpoint,
                                                                            capsys):
    """The default --max-new-tokens is what fits after the prompt: a prompt that fills the
    model's 32 positions used to be reported as `--max-new-tokens -N`."""
    prompt = " ".join(["the quick brown fox"] * 12)
    code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt", "a", "--prompt", prompt,
                                   "--framework", "torch"], capsys)
    assert (code, out) == (2, [])
    assert len(err.splitlines()) == 1 and "--max-new-tokens" not in err
    assert err.startswith("error: the longest prompt (") and "tokens with bos) leaves no room " \
        "for a continuation in the model's max_len 32; shorten it" in err


def test_a_prompt_file_in_utf16_is_refused(checkpoint, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes("the cat\na dog\n".encode("utf-16-le"))
    code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt-file", prompts,
                                   "--framework", "torch"], capsys)
    assert (code, out) == (2, [])
    assert err.splitlines()[0].startswith(f"error: --prompt-file {prompts} looks like UTF-16 "
                                          "LE text")


def test_a_train_workdir_is_named_with_its_export(checkpoint, tmp_path, capsys):
    """A train.py work directory has a config.json (and tokenizer.model) of its own, so
    the hint that its model is in export/ never fired: `has no model.safetensors`."""
    workdir = tmp_path / "run"
    (workdir / "export").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        (workdir / "export" / name).write_bytes((checkpoint / name).read_bytes())
    for name in ("config.json", "tokenizer.model"):
        (workdir / name).write_bytes((checkpoint / name).read_bytes())
    for framework in ("jax", "torch"):
        code, out, err = run_generate(["--checkpoint", workdir, "--prompt", "a", "--framework",
                                       framework], capsys)
        assert (code, out) == (2, [])
        assert err.splitlines() == [f"error: {workdir} has no model.safetensors (a train.py "
                                    f"work directory? its model is in {workdir / 'export'})"]
