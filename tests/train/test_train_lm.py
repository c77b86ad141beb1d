"""train.py --task lm on a tiny decoder-only model: its flags, outputs, samples, exact
resume on a text file, and its export continuing text alike in both frameworks."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from flax import nnx

from jax_transformer import lm_decoding
from jax_transformer.applications import generator
from jax_transformer.commands import port as port_command
from jax_transformer.commands import train as train_command
from jax_transformer.commands import translate as translate_command
from jax_transformer.data.tokenizing import train_tokenizer
from jax_transformer.data.corpora import counting_text
from jax_transformer.model import DecoderOnlyTransformer
from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.tasks import language_model
from tests.train.runs import losses, tiny_run, tiny_settings
from transformer_core.config import TransformerConfig
from transformer_core.errors import TrainError
from transformer_core.generation import Sampling

LM = ["--task", "lm", "--max-tokens", "256"]


@pytest.mark.parametrize("flags, message", [
    (["--src-path", "a.en", "--tgt-path", "a.de"], "--task lm trains on --text-path .*drop "
                                                   "--src-path --tgt-path"),
    (["--columns-path", "a.tsv"], "drop --columns-path"),
    (["--temperature", "-1"], "--temperature must be 0 \\(greedy\\) or positive"),
    (["--samples", "-1"], "--samples must be 0 or more"),
])
def test_lm_flags_that_do_not_fit_are_refused(tmp_path, flags, message):
    with pytest.raises(TrainError, match=message):
        tiny_settings(tmp_path, *LM, *flags)


def test_text_path_needs_task_lm(tmp_path, capsys):
    assert train_command.main(["--workdir", str(tmp_path), "--text-path", "book.txt"]) == 2
    assert "error: --text-path is for --task lm" in capsys.readouterr().err


def test_task_lm_builds_a_decoder_only_config(tmp_path):
    data, model, _ = tiny_settings(tmp_path, *LM)
    config = model.config(100, 64, data.architecture)
    assert config.architecture == "decoder_only" and config.num_decoder_layers == 1
    assert tiny_settings(tmp_path)[0].architecture == "encoder_decoder"
    # The counting text is learnt in fewer steps: --task lm has its own default.
    assert train_command.parse_args(["--task", "lm"]).train.steps == 400
    assert train_command.parse_args([]).train.steps == 1200
    assert train_command.parse_args(["--task", "lm", "--steps", "7"]).train.steps == 7


def test_second_half_match_counts_the_lines_whose_second_half_greedy_decoding_writes(
        tmp_path, monkeypatch):
    """An oracle decoder writes each prompt's true second half, then eos and junk;
    for one line it gets the last token wrong: 5 of 6 lines match, in batches of 4."""
    lines = counting_text(num_train=60, num_dev=1, num_test=6, max_number=1000)["test"]
    tokenizer = train_tokenizer(lines, tmp_path / "tokenizer.model", vocab_size=60)
    config = TransformerConfig(architecture="decoder_only", src_vocab_size=tokenizer.vocab_size,
                               tgt_vocab_size=tokenizer.vocab_size, d_model=8, num_heads=2,
                               d_ff=8, num_decoder_layers=1, max_len=128)
    pieces = [tokenizer.encode(line) for line in lines]
    second_half = {tuple(p[:len(p) // 2]): p[len(p) // 2:] for p in pieces}
    wrong = tuple(pieces[4][:len(pieces[4]) // 2])

    def oracle(model, prompt_ids, prompt_lengths, *, max_new_tokens):
        tokens = np.full((len(prompt_ids), max_new_tokens), 7, np.int32)  # junk after eos
        for row, (ids, n) in enumerate(zip(prompt_ids, prompt_lengths)):
            prompt = tuple(ids[1:n].tolist())  # without bos
            ending = second_half[prompt] + [config.eos_id]
            tokens[row, :len(ending)] = ending
            if prompt == wrong:
                tokens[row, len(ending) - 2] += 1
        return tokens, None

    monkeypatch.setattr(lm_decoding, "greedy_search", oracle)
    model = DecoderOnlyTransformer(config, rngs=nnx.Rngs(0))
    decoded = language_model.LanguageModelTask().evaluate_test(
        model, tokenizer, lines, TrainSettings(samples=0, decode_batch_size=4),
        log=lambda _: None)
    assert decoded["test"]["lines"] == 6
    assert decoded["test"]["second_half_match"] == pytest.approx(5 / 6)


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """12 steps on the built-in counting text."""
    workdir = tmp_path_factory.mktemp("lm")
    return workdir, tiny_run(workdir, *LM, "--steps", "12")


@pytest.mark.slow
def test_lm_run_writes_everything_and_its_samples(lm_run):
    workdir, summary = lm_run
    for name in ("metrics.jsonl", "eval.json", "loss.png", "attention.png",
                 "export/config.json", "export/model.safetensors", "export/tokenizer.model"):
        assert (workdir / name).is_file(), name
    assert TransformerConfig.from_json(workdir / "export/config.json").architecture == \
        "decoder_only"
    assert [s for s, _ in losses(workdir)] == list(range(1, 13))
    results = json.loads((workdir / "eval.json").read_text())
    assert results["step"] == summary["step"] == 12
    test = results["test"]
    for key in ("loss", "nll", "perplexity", "second_half_match", "unigram_entropy"):
        assert math.isfinite(test[key]), key
    assert test["lines"] == 40 and test["perplexity"] == pytest.approx(math.exp(test["nll"]))
    assert 0 < test["nll"] < test["loss"]  # label smoothing costs on top of the nll
    assert len(results["samples"]) == 2
    for sample in results["samples"]:
        assert set(sample) == {"prompt", "reference", "greedy", "sampled"}
        for key in ("reference", "greedy", "sampled"):
            assert sample[key].startswith(sample["prompt"]), (key, sample)
    assert results["training"]["batch_shapes"][0][1] == 0  # rows of targets, no source


@pytest.mark.slow
def test_lm_export_continues_text_alike_in_both_frameworks(lm_run):
    workdir, _ = lm_run
    prompts = ["three hundred and seven; three hundred and eight;", "", "ninety"]
    texts = []
    for framework in ("jax", "torch"):
        model, tokenizer = generator.load(workdir / "export", framework)
        texts.append(generator.generate(prompts, model, tokenizer, framework=framework,
                                       sampling=Sampling(temperature=0.7, seed=3),
                                       max_new_tokens=12))
    assert texts[0] == texts[1] and any(texts[0])


@pytest.mark.slow
def test_lm_on_a_text_file_resumes_exactly(tmp_path):
    lines = [f"line {i}: " + " ".join(["the cat sat on the mat", "a dog ran", "birds sing"][
        i % 3].split()[: 2 + i % 5]) for i in range(400)]
    text = tmp_path / "book.txt"
    text.write_text("\n".join(lines) + "\n")
    flags = [*LM, "--text-path", str(text)]
    tiny_run(tmp_path / "reference", *flags, "--steps", "10")
    tiny_run(tmp_path / "resumed", *flags, "--steps", "6")
    summary = tiny_run(tmp_path / "resumed", *flags, "--steps", "10")  # resumes from step 6
    assert losses(tmp_path / "resumed") == losses(tmp_path / "reference")
    assert summary["step"] == 10 and summary["test"]["lines"] == 40
    with pytest.raises(TrainError, match="--task 'lm' -> 'translate'"):
        tiny_run(tmp_path / "resumed", "--steps", "12")
    assert np.isfinite([loss for _, loss in losses(tmp_path / "resumed")]).all()


@pytest.mark.slow
def test_lm_training_checkpoints_convert_and_translate_points_to_generate(lm_run, tmp_path,
                                                                           capsys):
    """Before: `port --from jax-orbax` and `translate` on a --task lm run failed with the
    internal "Transformer builds 'encoder_decoder' models (build_model(config) picks the
    class)" (restore_model and translate built the translator's class)."""
    workdir, _ = lm_run
    out = tmp_path / "converted"
    assert port_command.main(["--from", "jax-orbax", str(workdir / "checkpoints"), str(out),
                              "--step", "8"]) == 0, capsys.readouterr().err
    converted = DecoderOnlyTransformer.from_pretrained(out)
    assert converted.config == TransformerConfig.from_json(workdir / "config.json")
    assert (out / "tokenizer.model").read_bytes() == (workdir / "tokenizer.model").read_bytes()
    capsys.readouterr()
    for checkpoint in (out, workdir / "export"):
        assert translate_command.main(["--checkpoint", str(checkpoint)]) == 2
        assert capsys.readouterr().err == (
            f"error: {checkpoint} holds a decoder_only model; translate runs encoder_decoder "
            f"models (a translator); continue text with it: jaxformer-generate --checkpoint "
            f"{checkpoint}\n")
