"""Our Marian tokenizer gives transformers' MarianTokenizer ids: target-language codes
(">>fra<<") as one piece, and the Moses punctuation normaliser, on a tokenizer
directory made here (two small SentencePiece models, a vocab.json with codes)."""

from __future__ import annotations

import io
import json

import pytest

from jax_transformer.port import MarianTokenizer, PortError

transformers = pytest.importorskip("transformers")
spm = pytest.importorskip("sentencepiece")

WORDS = {"source": "the quick brown fox jumps over a lazy dog she said yes and left".split(),
         "target": "le renard brun saute sur un chien paresseux elle a dit oui".split()}
CODES = [">>fra<<", ">>deu<<"]
TEXTS = [
    "the quick brown fox",
    ">>fra<< the quick brown fox",
    ">>deu<<the lazy dog",
    ">>fra<<",
    ">>xyz<< the dog",  # a code the vocab lacks: <unk>
    ">>fr a<< the dog",  # a "code" is anything from ">>" to the first "<<"
    ">>fra<< >>deu<< the dog",  # only a leading code is one piece
    "the >>fra<< dog",
    " >>fra<< the dog",
    "„the fox“  –  « yes »…",  # unnormalised punctuation stays as it is
    "",
]
# Texts the Moses normaliser changes: quotes, guillemets, dashes, spaces, an ellipsis,
# and the English rule moving a comma inside quotes.
ODD_PUNCTUATION = [
    "„the fox“ jumps",
    "she said « yes » and left",
    "the fox  jumps   over – a dog — yes",
    '>>fra<< she said "yes", and left…',
    "the dog’s ‘lazy’ fox",
]


def train_spm(words: list[str], seed: int) -> bytes:
    import random
    rng = random.Random(seed)
    sentences = [" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(200)]
    sentences += ['she said "yes", and left.', "« yes » - the fox..."] * 5
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model,
                                   vocab_size=60, model_type="unigram", hard_vocab_limit=False,
                                   minloglevel=2)
    return model.getvalue()


@pytest.fixture(scope="module", params=["en", None], ids=["source_lang-en", "no-config"])
def directory(request, tmp_path_factory):
    """A converted opus-mt tokenizer directory: source.spm, target.spm, one vocab.json
    (Marian ids: </s> 0, <unk> 1, the codes, every piece of both models, <pad> last),
    and tokenizer_config.json naming the source language (or none)."""
    directory = tmp_path_factory.mktemp("marian-tokenizer")
    pieces = []
    for seed, side in enumerate(("source", "target")):
        model = train_spm(WORDS[side], seed)
        (directory / f"{side}.spm").write_bytes(model)
        processor = spm.SentencePieceProcessor(model_proto=model)
        pieces += [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in CODES + pieces:
        if piece not in ("<s>", "</s>", "<unk>"):
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab))
    if request.param:
        (directory / "tokenizer_config.json").write_text(json.dumps(
            {"source_lang": request.param, "target_lang": "fr"}))
    return directory


@pytest.fixture(scope="module")
def theirs(directory):
    return transformers.MarianTokenizer.from_pretrained(str(directory))


@pytest.mark.parametrize("side", ["source", "target"])
def test_ids_match_transformers(directory, theirs, side):
    ours = MarianTokenizer(directory)
    for text in TEXTS:
        expected = (theirs(text) if side == "source" else theirs(text_target=text))["input_ids"]
        assert ours.encode(text, side) == expected, text
    assert ours.encode(">>fra<< the fox")[0] == ours.vocab["source"][">>fra<<"]
    assert ours.encode(">>xyz<< the fox")[0] == ours.unk_id


def test_language_codes_are_listed_as_transformers_lists_them(directory, theirs):
    ours = MarianTokenizer(directory)
    assert ours.supported_language_codes == theirs.supported_language_codes == CODES


def test_punctuation_is_normalised_as_transformers_normalises_it(directory, theirs):
    ours = MarianTokenizer(directory)
    assert ours.source_lang == theirs.source_lang
    for text in ODD_PUNCTUATION:
        normalised = ours.normalize(text)
        assert normalised == theirs.normalize(text) and normalised != text, text
        assert ours.encode(normalised) == theirs(theirs.normalize(text))["input_ids"], text
    assert ours.normalize("") == theirs.normalize("") == ""


def test_a_source_lang_that_is_not_a_code_is_an_error(directory, tmp_path):
    for name in ("source.spm", "target.spm", "vocab.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"source_lang": 1}')
    with pytest.raises(PortError, match="source_lang must be a language code or null, got 1"):
        MarianTokenizer(tmp_path)
