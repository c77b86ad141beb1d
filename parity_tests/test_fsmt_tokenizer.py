"""FSMT's tokenizer, converted with the weights, gives transformers' FSMTTokenizer ids and
text, and `jaxformer-translate` on text gives transformers' `generate` text.

A small BPE is learned here on Moses-tokenised sentences (words end in "</w>", as in
FSMT's merges.txt); two vocabularies are made from its symbols, the target's in another
order and with some symbols left out, so a side read with the other's vocabulary
gets other ids. transformers' FSMTTokenizer is built on those files and saved beside a
random FSMT model (helpers.make_fairseq) whose vocabularies fit them.
transformers' FSMTTokenizer has no target mode (its `text_target` ids are the source
vocabulary's), so target ids are compared with an FSMTTokenizer built the other way
round: target language first, vocab-tgt.json as its source vocabulary.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from jax_transformer.applications import parity
from jax_transformer.commands import parity as parity_command
from jax_transformer.commands import port as port_command
from jax_transformer.commands import translate as translate_command
from parity_tests.helpers import (convert_fairseq, fast_tier, hf_fsmt_tokenizer, make_fairseq,
                                  to_numpy, write_bpe_files)
from transformer_core import checkpoint_dir
from transformer_core.fsmt_tokenizer import FSMTTokenizer
from transformer_core.tokenizer import TokenizerError

transformers = pytest.importorskip("transformers")

TRAIN = ["Hello world, this is a test.", "It costs 12.50 euros - really?",
         "Über 3 Äpfel und Öl!", "naïve café, déjà vu: 2024-05-17.",
         "The year 2024 had 366 days (a leap year).", "\"Quoted\" words & 'single' ones.",
         "Mr. Smith isn't here; he's gone.", "A well-known, long-standing rule."]
SENTENCES = [
    "Hello world!",
    "It isn't 12.50 euros, Mr. Smith - it's 13,75 €.",  # apostrophes, nonbreaking "Mr."
    "„Quoted“ – «guillemets» ’tis… naïve déjà vu",  # the Moses normaliser's quotes/dashes
    "Full-width：（１２）！ and 。stops．",  # replace-unicode-punctuation
    "Tab\there and a\u200bzero-width space",  # C* characters removed
    "A well-known [rule] & <b>tags</b> | x",  # aggressive dash splits, XML escapes
    "  spaced   out  ",
    "zzz qqq ÿ 漢字 🙂",  # unknown characters and pieces
    "a </s> b <unk> c",  # special tokens' texts are themselves
    "ÜBER 3 ÄPFEL",
]
MAX_LEN = 10


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("fsmt")
    vocabs = write_bpe_files(tmp_path / "bpe", TRAIN)
    model, src_dir = make_fairseq(tmp_path, "fsmt", src_vocab_size=len(vocabs["src"]),
                                  tgt_vocab_size=len(vocabs["tgt"]))
    with torch.no_grad():  # text pieces win over </s> and <unk> more often
        model.model.decoder.output_projection.weight[4:] *= 3.0
    model.save_pretrained(src_dir)
    hf_fsmt_tokenizer(tmp_path / "bpe").save_pretrained(src_dir)
    convert_fairseq("fsmt", src_dir, tmp_path / "ours")
    return model, src_dir, tmp_path / "ours"


def test_ids_and_text_equal_transformers(converted):
    _, src_dir, ours_dir = converted
    ours = checkpoint_dir.load_tokenizer(ours_dir)
    assert isinstance(ours, FSMTTokenizer)
    source, target = hf_fsmt_tokenizer(src_dir), hf_fsmt_tokenizer(src_dir, reverse=True)
    sides_differ = 0
    for text in SENTENCES:
        want = source(text).input_ids
        assert ours.encode_source(text) == want, text
        target_ids = ours.encode_target(text)
        assert target_ids + [2] == target(text).input_ids, text
        sides_differ += target_ids != want[:-1]
        generated = target_ids + [2, 1, 1]  # as generate returns it, after the start token
        assert ours.decode(generated) == source.decode(generated, skip_special_tokens=True), text
    assert sides_differ >= len(SENTENCES) - 2  # all but the unknowns': a swap would show
    assert ours.encode_source("") == source("").input_ids == [2]
    assert not ours.normalizes and ours.normalize(SENTENCES[2]) == SENTENCES[2]


def test_decode_equals_transformers_on_any_ids(converted):
    _, src_dir, ours_dir = converted
    ours, theirs = checkpoint_dir.load_tokenizer(ours_dir), hf_fsmt_tokenizer(src_dir)
    rng = torch.Generator().manual_seed(0)
    for _ in range(50):
        ids = torch.randint(0, len(ours.vocab["target"]), (12,), generator=rng).tolist()
        ids = [i for i in ids if i != 2] + [2]  # specials 0, 1 and 3 stay inside
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids


def test_lower_casing_is_converted(converted, tmp_path):
    _, src_dir, _ = converted
    shutil.copytree(src_dir, tmp_path / "lower")
    hf_fsmt_tokenizer(src_dir, do_lower_case=True).save_pretrained(tmp_path / "lower")
    convert_fairseq("fsmt", tmp_path / "lower", tmp_path / "ours")
    ours = checkpoint_dir.load_tokenizer(tmp_path / "ours")
    theirs = transformers.FSMTTokenizer.from_pretrained(tmp_path / "lower")
    assert theirs.do_lower_case and ours.do_lower_case
    for text in SENTENCES:
        assert ours.encode_source(text) == theirs(text).input_ids, text


@pytest.mark.parametrize("beam", fast_tier([1, 3], fast={3}))
def test_translate_equals_generate(converted, tmp_path, beam):
    model, src_dir, ours_dir = converted
    lines = [s.strip() for s in SENTENCES]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    assert translate_command.main([
        "--checkpoint", str(ours_dir), "--input", str(tmp_path / "in.txt"), "--output",
        str(tmp_path / "out.txt"), "--beam", str(beam), "--alpha", "1.0",
        "--length-penalty-style", "hf", "--max-len", str(MAX_LEN)]) == 0
    got = (tmp_path / "out.txt").read_text().splitlines()
    tok = transformers.FSMTTokenizer.from_pretrained(src_dir)
    batch = tok(lines, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(input_ids=batch.input_ids.to(model.device),
                             attention_mask=batch.attention_mask.to(model.device),
                             num_beams=beam, do_sample=False, length_penalty=1.0,
                             early_stopping=False, max_length=None, max_new_tokens=MAX_LEN,
                             forced_eos_token_id=None)
    want = tok.batch_decode(to_numpy(out).tolist(), skip_special_tokens=True)
    assert got == want
    assert sum(bool(line) for line in got) > len(got) // 2, "the model should produce text"


@pytest.mark.slow
def test_parity_runs_on_sentences(converted, tmp_path, capsys):
    """`jaxformer-parity --sentences`: sources are transformers' ids, targets start with
    decoder_start_token_id (</s>) and go on with the target-side ids."""
    _, src_dir, ours_dir = converted
    config = checkpoint_dir.load_dir(ours_dir)[0]
    src, tgt = parity.sentence_batch(ours_dir, config, SENTENCES[:2])
    theirs = hf_fsmt_tokenizer(src_dir)(SENTENCES[1]).input_ids
    assert src[1].tolist() == theirs + [config.pad_id] * (src.shape[1] - len(theirs))
    assert tgt[1, 0] == 2 and tgt[1, 1:4].tolist() == \
        hf_fsmt_tokenizer(src_dir, reverse=True)(SENTENCES[1]).input_ids[:3]
    (tmp_path / "sents.txt").write_text("".join(s + "\n" for s in SENTENCES[:2]))
    assert parity_command.main([str(ours_dir), "--sentences", str(tmp_path / "sents.txt"),
                                "--dtypes", "float32"]) == 0
    assert "2 sentence(s)" in capsys.readouterr().out


def port(src_dir, out_dir, capsys) -> tuple[int, str]:
    code = port_command.main(["--from", "hf-fsmt", str(src_dir), str(out_dir)])
    return code, capsys.readouterr().err


def weights_only(src_dir, directory):
    directory.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src_dir / name, directory / name)
    return directory


def test_directory_without_tokenizer_converts_weights_only(converted, tmp_path, capsys):
    _, src_dir, _ = converted
    assert port(weights_only(src_dir, tmp_path / "src"), tmp_path / "ours", capsys)[0] == 0
    assert sorted(p.name for p in (tmp_path / "ours").iterdir()) == ["config.json",
                                                                   "model.safetensors"]
    with pytest.raises(TokenizerError, match="has no tokenizer.model"):
        checkpoint_dir.load_tokenizer(tmp_path / "ours")


@pytest.mark.parametrize("change, message", [
    (lambda d: (d / "merges.txt").unlink(), "has vocab-src.json and vocab-tgt.json but no "
                                            "merges.txt"),
    (lambda d: (d / "tokenizer_config.json").unlink(), "langs must be the [source, target]"),
    (lambda d: (d / "vocab-tgt.json").write_text('{"<s>": 0, "<pad>": 1, "</s>": 2}'),
     "vocab-tgt.json has no <unk>"),
    (lambda d: (d / "vocab-src.json").write_text(
        '{"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "big": 1000}'),
     "the source vocabulary has id 1000, the model's is"),
], ids=["no merges", "no langs", "a vocabulary without <unk>", "an id beyond the model's"])
def test_bad_tokenizer_files_are_refused(converted, tmp_path, capsys, change, message):
    _, src_dir, _ = converted
    shutil.copytree(src_dir, tmp_path / "src")
    change(tmp_path / "src")
    code, err = port(tmp_path / "src", tmp_path / "ours", capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "ours").exists()


def test_normalize_punctuation_is_refused_with_the_tokenizer_named(converted, tmp_path, capsys):
    """FSMT's tokenizer normalises as it encodes: there is no separate step to ask for."""
    _, _, ours_dir = converted
    (tmp_path / "in.txt").write_text("Hello\n")
    assert translate_command.main(["--checkpoint", str(ours_dir), "--input",
                                   str(tmp_path / "in.txt"), "--normalize-punctuation"]) == 2
    assert "tokenizer (FSMTTokenizer) has no separate normalising step" in \
        capsys.readouterr().err
