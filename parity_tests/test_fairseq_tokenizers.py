"""M2M100's and NLLB's tokenizers, converted with the weights, give transformers' ids and
text, and `jaxformer-translate --src-lang --tgt-lang` gives transformers'
`generate(forced_bos_token_id=...)`.

A small SentencePiece BPE model is trained here; transformers' M2M100Tokenizer
(vocab.json + the 100 m2m100 codes after it) and NllbTokenizer (tokenizer.json,
the 202 NLLB codes as added tokens) are built on it and saved beside random
M2M100 models (helpers.make_fairseq) whose vocabularies fit them.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from jax_transformer.commands import translate as translate_command
from parity_tests.helpers import (LANGS, convert_fairseq, fast_tier, hf_fairseq_tokenizer,
                                  make_fairseq, to_numpy)
from transformer_core import checkpoint_dir
from transformer_core.fairseq_tokenizer import FairseqTokenizer

transformers = pytest.importorskip("transformers")

TRAIN = ["Hello world, this is a test.", "Ça coûte 12,50 € — vraiment ?", "Über 3 Äpfel und Öl!",
         "naïve café, déjà vu: 2024-05-17.", "The year 2024 had 366 days (a leap year)."] * 20
SENTENCES = ["Hello world!", "Ça coûte 12,50 € ?", "déjà vu: 3 Äpfel, naïve Öl.",
             "The year 1999 (not 2024) had 365 days.", "  spaced   out  ", "zzz qqq ÿ"]
MAX_LEN = 10
FAMILIES = ["m2m100", "nllb"]


def hf_decode(tok, family: str, ids) -> list[str]:
    """transformers' batch_decode(skip_special_tokens=True). transformers 5.23's
    M2M100Tokenizer leaves the language code in the text ("__fr__ Hello"): its codes are
    not among its special tokens. fairseq and transformers 4 drop it, and so do we: the
    codes are removed before transformers decodes M2M100's ids."""
    if family == "m2m100":
        ids = [[i for i in row if i not in tok.id_to_lang_token] for row in ids]
    return tok.batch_decode(ids, skip_special_tokens=True)


@pytest.fixture(scope="module", params=FAMILIES)
def converted(request, tmp_path_factory):
    family = request.param
    tmp_path = tmp_path_factory.mktemp(family)
    tok, work = hf_fairseq_tokenizer(tmp_path, family, TRAIN)
    size = max([len(tok), *getattr(tok, "id_to_lang_token", {})]) + 8  # M2M100: codes after len
    model, src_dir = make_fairseq(tmp_path, "m2m100", vocab_size=size, tie_word_embeddings=False)
    with torch.no_grad():  # text pieces (ids 4..120) win over codes and </s> more often
        model.lm_head.weight[4:121] *= 3.0
    model.save_pretrained(src_dir)
    tok.save_pretrained(src_dir)
    shutil.copyfile(work / "sentencepiece.bpe.model", src_dir / "sentencepiece.bpe.model")
    convert_fairseq("m2m100", src_dir, tmp_path / "ours")
    return family, tok, model, tmp_path / "ours"


def test_ids_and_text_equal_transformers(converted):
    family, tok, _, ours_dir = converted
    src, tgt = LANGS[family]
    ours = checkpoint_dir.load_tokenizer(ours_dir)
    assert isinstance(ours, FairseqTokenizer) and ours.family == family
    ours.set_languages(src, tgt)
    for text in SENTENCES:
        want = tok(text).input_ids
        assert ours.encode_source(text) == want, text
        assert ours.encode_target(text) + [2] == tok(text_target=text).input_ids, text
        assert want[0] == tok.convert_tokens_to_ids(tok.src_lang if family == "nllb"
                                                    else f"__{src}__")
        generated = [ours.forced_first_id] + want[1:] + [1, 1]  # as generate returns it
        assert ours.decode(generated) == hf_decode(tok, family, [generated])[0], text
    assert ours.forced_first_id == tok.convert_tokens_to_ids(
        tgt if family == "nllb" else f"__{tgt}__")


@pytest.mark.parametrize("beam", fast_tier([1, 3], fast={3}))
def test_translate_equals_generate_with_forced_bos(converted, tmp_path, beam):
    family, tok, model, ours_dir = converted
    src, tgt = LANGS[family]
    (tmp_path / "in.txt").write_text("".join(s.strip() + "\n" for s in SENTENCES))
    assert translate_command.main([
        "--checkpoint", str(ours_dir), "--input", str(tmp_path / "in.txt"), "--output",
        str(tmp_path / "out.txt"), "--src-lang", src, "--tgt-lang", tgt, "--beam", str(beam),
        "--alpha", "1.0", "--length-penalty-style", "hf", "--max-len", str(MAX_LEN)]) == 0
    got = (tmp_path / "out.txt").read_text().splitlines()
    forced = tok.convert_tokens_to_ids(tgt if family == "nllb" else f"__{tgt}__")
    batch = tok([s.strip() for s in SENTENCES], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(input_ids=batch.input_ids.to(model.device),
                             attention_mask=batch.attention_mask.to(model.device),
                             forced_bos_token_id=forced, num_beams=beam, do_sample=False,
                             length_penalty=1.0, early_stopping=False, max_length=None,
                             max_new_tokens=MAX_LEN, forced_eos_token_id=None)
    sequences = to_numpy(out)
    assert (sequences[:, 1] == forced).all()
    want = hf_decode(tok, family, sequences.tolist())
    assert got == want
    assert any(got), "the random model should produce some text"


def test_unknown_or_missing_code_is_refused_with_the_known_ones(converted, tmp_path, capsys):
    family, _, _, ours_dir = converted
    src, _ = LANGS[family]
    (tmp_path / "in.txt").write_text("Hello\n")
    base = ["--checkpoint", str(ours_dir), "--input", str(tmp_path / "in.txt")]
    assert translate_command.main(base + ["--src-lang", src, "--tgt-lang", "xx_Nope"]) == 2
    err = capsys.readouterr().err
    assert "xx_Nope" in err and src in err and len(err.strip().splitlines()) == 1
    assert translate_command.main(base + ["--src-lang", src]) == 2
    assert "--tgt-lang" in capsys.readouterr().err

