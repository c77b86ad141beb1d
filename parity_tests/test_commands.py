"""The commands in both frameworks: jaxformer-translate and jaxformer-generate print the
same text with --framework jax and --framework torch (tiny checkpoints of either)."""

import pytest

from tests.helpers import LINES, PROMPTS, run_generate, run_translate
# The commands' checkpoints, fixtures of tests/ (its conftest.py registers them there)
from tests.helpers import checkpoint, jax_checkpoint, tokenizer, torch_checkpoint  # noqa: F401


@pytest.mark.parametrize("checkpoint", ["jax_checkpoint", "torch_checkpoint"])
def test_both_frameworks_translate_the_same(checkpoint, request, tmp_path, capsys):
    directory = request.getfixturevalue(checkpoint)
    source = tmp_path / "source.txt"
    source.write_text("\n".join(LINES) + "\n")
    outputs = {}
    for framework in ("jax", "torch"):
        for beam in ("1", "3"):
            code, out, err = run_translate(["--checkpoint", directory, "--input", source,
                                           "--framework", framework, "--beam", beam,
                                           "--max-len", "12", "--batch-size", "4"], capsys)
            assert code == 0, err
            assert len(out) == len(LINES)
            assert out[0] == out[3]  # input order kept across sorted batches
            assert out[LINES.index("")] == ""  # an empty line is not translated
            assert "translated 6 sentences" in err
            outputs[framework, beam] = out
    assert outputs["jax", "1"] == outputs["torch", "1"]
    assert outputs["jax", "3"] == outputs["torch", "3"]


SAMPLE = ["--temperature", "0.9", "--top-p", "0.9", "--seed", "3"]


@pytest.mark.parametrize("flags", [SAMPLE,
                                   pytest.param(["--temperature", "0"], marks=pytest.mark.slow),
                                   pytest.param(["--beam-size", "3"], marks=pytest.mark.slow)],
                         ids=["sample", "greedy", "beam"])
def test_both_frameworks_print_the_same_text(checkpoint, tmp_path, capsys, flags):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(PROMPTS[1:]) + "\n")
    outputs = {}
    for framework in ("jax", "torch"):
        code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt", PROMPTS[0],
                                       "--prompt-file", prompt_file, "--max-new-tokens", "12",
                                       "--framework", framework, *flags], capsys)
        assert code == 0, err
        assert len(out) == len(PROMPTS) and all(out), out
        outputs[framework] = out
    assert outputs["jax"] == outputs["torch"]
    if flags == SAMPLE:  # another seed, other text
        code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt", PROMPTS[0],
                                       "--prompt-file", prompt_file, "--max-new-tokens", "12",
                                       "--framework", "torch", *SAMPLE[:-1], "4"], capsys)
        assert code == 0 and out != outputs["torch"]


@pytest.mark.parametrize("temperature", ["1e-45", "1e-38"])
def test_a_tiny_temperature_is_greedy_in_both_frameworks(checkpoint, capsys, temperature):
    """1 / temperature overflows float32 below ~3e-39, and logits / temperature overflows
    sooner: both frameworks printed unknown pieces or nothing where 0 gives greedy text."""
    outputs = {}
    for framework in ("jax", "torch"):
        for value in ("0", temperature):
            code, out, err = run_generate(["--checkpoint", checkpoint, "--prompt", PROMPTS[0],
                                           "--prompt", PROMPTS[1], "--max-new-tokens", "12",
                                           "--temperature", value, "--framework", framework],
                                          capsys)
            assert code == 0, err
            outputs[framework, value] = out
    assert all(outputs["torch", "0"]) and " ⁇ " not in " ".join(outputs["torch", "0"])
    assert len(set(map(tuple, outputs.values()))) == 1, outputs
