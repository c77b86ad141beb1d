"""Fine-tuning converted FSMT and M2M100 models (train.py --init-from) trains on the
batches transformers would, and the export translates.

For each family a random transformers model (helpers.make_fairseq) with a
tokenizer learned on generated number words (FSMT: Moses + BPE, en -> de,
as in test_fsmt_tokenizer; M2M100: SentencePiece + language codes, en -> fr, as in
test_fairseq_tokenizers) is converted with `port`, then fine-tuned for 2 steps
(dropout 0, label smoothing 0; M2M100 with --src-lang-code en --tgt-lang-code fr):

- step 1's loss is transformers' loss on the same pairs with the original model
  (float32, relative 1e-5): the training set fits one batch, so step 1 sees every
  pair once. transformers' batch: the source tokenizer's ids, labels = the target ids
  + </s> (M2M100: the target code first, `text_target`; FSMT: vocab-tgt.json's ids,
  which its tokenizer gives when built the other way round), padded by
  DataCollatorForSeq2Seq with -100, decoder input = </s> + labels[:-1] (transformers'
  shift_tokens_right).
- the export holds the converted directory's files byte for byte, and
  `jaxformer-translate` (M2M100: --src-lang/--tgt-lang) translates the test set with
  it as the run's own test evaluation did (the forced target code, decoded away).
- the language-code flags are refused where they do not fit; <unk> is the tokenizer's.
"""

from __future__ import annotations

import json

import pytest
import torch

from jax_transformer.commands import port as port_command
from jax_transformer.commands import train as train_command
from jax_transformer.commands import translate as translate_command
from jax_transformer.data import corpora
from jax_transformer.train.inputs import unknown_id
from transformer_core.errors import TrainError
from parity_tests.helpers import (FAIRSEQ_EOS, LANGS, hf_fairseq_tokenizer, hf_fsmt_tokenizer,
                                  make_fairseq, write_bpe_files, write_lines)
from tests.train.runs import records
from transformer_core import checkpoint_dir

transformers = pytest.importorskip("transformers")

TRAIN, DEV, TEST = 48, 8, 8


def number_pairs(family: str) -> dict[str, list[corpora.Pair]]:
    return corpora.number_corpus(*LANGS[family], num_train=TRAIN, num_dev=DEV, num_test=TEST,
                                 max_number=300, seed=0)


def fsmt(tmp, text: list[str]):
    """A random FSMT model, its source tokenizer and its target one (vocab-tgt.json as
    the source vocabulary: transformers' FSMTTokenizer has no target mode). The target
    vocabulary has the source's symbols in another order, none left out (unknown)."""
    vocabs = write_bpe_files(tmp / "bpe", text, gaps=False)
    model, src_dir = make_fairseq(tmp, "fsmt", src_vocab_size=len(vocabs["src"]),
                                  tgt_vocab_size=len(vocabs["tgt"]))
    hf_fsmt_tokenizer(tmp / "bpe").save_pretrained(src_dir)
    return (model, src_dir, hf_fsmt_tokenizer(tmp / "bpe"),
            hf_fsmt_tokenizer(tmp / "bpe", reverse=True))


def m2m100(tmp, text: list[str]):
    """A random M2M100 model and its tokenizer (source and target)."""
    tok, work = hf_fairseq_tokenizer(tmp, "m2m100", text)
    size = max([len(tok), *tok.id_to_lang_token]) + 8  # the codes come after len(tok)
    model, src_dir = make_fairseq(tmp, "m2m100", vocab_size=size, tie_word_embeddings=False)
    with torch.no_grad():  # text pieces win over </s> and the codes more often
        model.lm_head.weight[4:tok.vocab_size] *= 3.0  # the codes come after
    model.save_pretrained(src_dir)
    tok.save_pretrained(src_dir)
    (src_dir / "sentencepiece.bpe.model").write_bytes(
        (work / "sentencepiece.bpe.model").read_bytes())
    return model, src_dir, tok, tok


def language_flags(family: str) -> list[str]:
    src, tgt = LANGS[family]
    return ["--src-lang-code", src, "--tgt-lang-code", tgt] if family == "m2m100" else []


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """family -> (transformers' model, its source and target tokenizers, the converted
    directory, the corpus), each made once."""
    made = {}

    def convert(family: str):
        if family not in made:
            tmp = tmp_path_factory.mktemp(family)
            splits = number_pairs(family)
            text = [s for pairs in splits.values() for pair in pairs for s in pair]
            model, src_dir, source_tok, target_tok = (fsmt if family == "fsmt" else m2m100)(
                tmp, text)
            assert port_command.main(["--from", f"hf-{family}", str(src_dir),
                                      str(tmp / "ours")]) == 0
            made[family] = model, source_tok, target_tok, tmp / "ours", splits
        return made[family]
    return convert


@pytest.fixture(scope="module", params=["fsmt", "m2m100"])
def finetuned(request, converted):
    """A 2-step fine-tuning run of the converted model: (family, transformers' model,
    its tokenizers, the directory the run's flags and files are in, the corpus)."""
    family = request.param
    model, source_tok, target_tok, ours, splits = converted(family)
    tmp = ours.parent
    corpus = []
    for split, flag in (("train", ""), ("dev", "dev-"), ("test", "test-")):
        corpus += [f"--{flag}src-path", write_lines(tmp / f"{split}.src", [s for s, _ in splits[split]]),
                   f"--{flag}tgt-path", write_lines(tmp / f"{split}.tgt", [t for _, t in splits[split]])]
    flags = ["--workdir", str(tmp / "run"), "--init-from", str(ours), *corpus,
             *language_flags(family), "--dropout", "0", "--label-smoothing", "0", "--steps", "2",
             "--lr", "1e-3", "--warmup", "1", "--eval-every", "2", "--checkpoint-every", "2",
             "--samples", "1", "--quiet"]
    assert train_command.main(flags) == 0
    return family, model, source_tok, target_tok, tmp, splits, flags


@pytest.mark.slow
def test_step_one_loss_is_transformers_loss(finetuned):
    family, model, source_tok, target_tok, tmp, splits, _ = finetuned
    if family == "fsmt":
        features = [{"input_ids": source_tok(s).input_ids, "labels": target_tok(t).input_ids}
                    for s, t in splits["train"]]
    else:
        features = [source_tok(s, text_target=t) for s, t in splits["train"]]
    batch = transformers.DataCollatorForSeq2Seq(source_tok, return_tensors="pt")(features)
    labels = batch["labels"]
    if family == "m2m100":  # the target code first, as generate forces it
        assert (labels[:, 0] == source_tok.convert_tokens_to_ids(f"__{LANGS[family][1]}__")).all()
    # What DataCollatorForSeq2Seq(model=...) adds; FSMT's shift_tokens_right would write
    # pads over the -100s of the labels it is given, so it gets a copy.
    start = model.prepare_decoder_input_ids_from_labels(labels=labels.clone()) \
        if family == "fsmt" else None
    on = model.device  # where make_model put it (PARITY_TORCH_DEVICE)
    with torch.no_grad():
        want = float(model(input_ids=batch["input_ids"].to(on),
                           attention_mask=batch["attention_mask"].to(on),
                           decoder_input_ids=None if start is None else start.to(on),
                           labels=labels.to(on)).loss)
    if family == "fsmt":
        assert (start[:, 0] == FAIRSEQ_EOS).all()
    step_one = next(r for r in records(tmp / "run") if r["step"] == 1 and "loss" in r)
    assert step_one["tokens"] == int((labels != -100).sum())  # every pair, once
    assert abs(step_one["loss"] - want) <= 1e-5 * abs(want), (step_one["loss"], want)


@pytest.mark.slow
def test_the_export_keeps_the_tokenizer_and_translates_as_the_run_did(finetuned, tmp_path):
    family, _, _, _, tmp, splits, _ = finetuned
    converted, export = tmp / "ours", tmp / "run" / "export"
    names = sorted(p.name for p in converted.iterdir())
    assert sorted(p.name for p in export.iterdir()) == names
    for name in set(names) - {"config.json", "model.safetensors"}:
        assert (export / name).read_bytes() == (converted / name).read_bytes(), name
    src, tgt = LANGS[family]
    codes = ["--src-lang", src, "--tgt-lang", tgt] if family == "m2m100" else []
    assert translate_command.main([
        "--checkpoint", str(export), "--input", str(tmp / "test.src"), "--output",
        str(tmp_path / "out.txt"), "--beam", "1", *codes]) == 0
    got = (tmp_path / "out.txt").read_text().splitlines()
    results = json.loads((tmp / "run" / "eval.json").read_text())
    assert len(got) == TEST and got[0] == results["samples"][0]["translation"]
    assert any(got), "the random model should produce some text"
    assert results["test"]["sentences"] == TEST and (tmp / "run" / "attention.png").is_file()


def test_unknown_pieces_are_counted_by_the_tokenizer_s_own_unk(converted):
    for family in ("fsmt", "m2m100"):
        tokenizer = checkpoint_dir.load_tokenizer(converted(family)[3])
        assert [unknown_id(tokenizer, side) for side in ("source", "target")] == [3, 3]


@pytest.mark.parametrize("family, flags, message", [
    ("m2m100", [], "--init-from {dir} is a m2m100 model: give the corpus's languages as "
                   "--src-lang-code and --tgt-lang-code; known codes: af am ar"),
    ("m2m100", ["--src-lang-code", "en"], "--init-from {dir} is a m2m100 model: give"),
    ("m2m100", ["--src-lang-code", "en", "--tgt-lang-code", "xx"],
     "--init-from {dir}: its m2m100 tokenizer has no language --tgt-lang-code 'xx'; known "
     "codes: af am"),
    ("fsmt", ["--tgt-lang-code", "de"], "--src-lang-code and --tgt-lang-code are for an "
                                        "M2M100/NLLB checkpoint; the tokenizer of --init-from "
                                        "{dir} (FSMTTokenizer) has no language codes"),
    (None, ["--src-lang-code", "en"], "--src-lang-code names a language of the tokenizer of "
                                      "an M2M100/NLLB checkpoint to fine-tune; it needs "
                                      "--init-from DIR"),
])
def test_language_code_flags_are_refused_where_they_do_not_fit(converted, tmp_path, family,
                                                                flags, message):
    init = ["--init-from", str(converted(family)[3])] if family else []
    with pytest.raises(TrainError) as error:
        train_command.parse_args(["--workdir", str(tmp_path / "run"), *init, *flags])
    assert str(error.value).startswith(message.format(dir=init and init[1])), error.value


def test_an_nllb_tokenizer_with_the_source_code_last_is_refused(tmp_path):
    text = [s for pair in number_pairs("m2m100")["train"] for s in pair]
    tok, work = hf_fairseq_tokenizer(tmp_path, "nllb", text)
    _, src_dir = make_fairseq(tmp_path, "m2m100", vocab_size=len(tok) + 8)
    tok.save_pretrained(src_dir)
    (src_dir / "sentencepiece.bpe.model").write_bytes(
        (work / "sentencepiece.bpe.model").read_bytes())
    settings = json.loads((src_dir / "tokenizer_config.json").read_text())
    (src_dir / "tokenizer_config.json").write_text(json.dumps({**settings,
                                                               "legacy_behaviour": True}))
    assert port_command.main(["--from", "hf-m2m100", str(src_dir), str(tmp_path / "ours")]) == 0
    with pytest.raises(TrainError, match="its tokenizer puts the source code after </s>"):
        train_command.parse_args(["--init-from", str(tmp_path / "ours"), "--src-lang-code",
                                  "eng_Latn", "--tgt-lang-code", "fra_Latn"])


@pytest.mark.slow
@pytest.mark.parametrize("finetuned", ["m2m100"], indirect=True)  # FSMT takes no codes
def test_a_resume_needs_the_same_language_codes(finetuned):
    from jax_transformer.train.run import run
    *_, flags = finetuned
    flags = [("de" if i and flags[i - 1] == "--tgt-lang-code" else flag)
             for i, flag in enumerate(flags)]
    with pytest.raises(TrainError, match=r"other settings \(--tgt-lang-code 'fr' -> 'de'\)"):
        run(train_command.parse_args(flags))
