"""Our Marian tokenizer gives transformers' MarianTokenizer ids: target-language codes
(">>fra<<") as one piece, and the Moses punctuation normaliser, on a tokenizer
directory made here (two small SentencePiece models, a vocab.json with codes)."""

from __future__ import annotations

import io
import json

import pytest

from transformer_core.marian_tokenizer import MarianTokenizer
from transformer_core.tokenizer import TokenizerError

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
    with pytest.raises(TokenizerError, match="source_lang must be a language code or null, got 1"):
        MarianTokenizer(tmp_path)


# ------------------------------------------------------------------ translate

@pytest.fixture(scope="module")
def marian_checkpoint(directory, tmp_path_factory):
    """A random-weight MarianMTModel over `directory`'s vocabulary, converted with
    `jaxformer-port --from hf-marian` (tokenizer files copied)."""
    import torch
    from jax_transformer.commands import port as port_command
    vocab = json.loads((directory / "vocab.json").read_text())
    config = transformers.MarianConfig(
        vocab_size=len(vocab), d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, max_position_embeddings=64, pad_token_id=vocab["<pad>"],
        decoder_start_token_id=vocab["<pad>"], eos_token_id=vocab["</s>"])
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    with torch.no_grad():  # large enough that the input steers the output (at HF's init
        for name, tensor in model.named_parameters():  # it makes one token of every input)
            if "embed_positions" not in name:  # sinusoids, checked by the converter
                tensor.add_(torch.randn(tensor.shape))
    source = tmp_path_factory.mktemp("opus-mt")
    model.save_pretrained(source)
    for path in directory.iterdir():
        (source / path.name).write_bytes(path.read_bytes())
    converted = tmp_path_factory.mktemp("converted") / "model"
    assert port_command.main(["--from", "hf-marian", str(source), str(converted)]) == 0
    return converted


def translate_file(checkpoint, lines, tmp_path, capsys, *flags):
    """`jaxformer-translate` (torch_reference, greedy) on `lines`:
    (exit code, output lines, stderr)."""
    from jax_transformer.commands import translate
    source, output = tmp_path / "source.txt", tmp_path / "out.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    code = translate.main(["--checkpoint", str(checkpoint), "--input", str(source), "--output",
                           str(output), "--framework", "torch", "--beam", "1", "--max-len",
                           "10", *flags])
    err = capsys.readouterr().err
    return code, output.read_text(encoding="utf-8").splitlines() if code == 0 else None, err


def test_translate_takes_a_language_code_at_the_start_of_each_line(marian_checkpoint, theirs,
                                                                   tmp_path, capsys):
    from jax_transformer.applications import translator
    _, tokenizer = translator.load(marian_checkpoint, "torch")
    for text in (">>fra<< the quick fox", ">>deu<<the lazy dog", "the dog"):
        assert translator.source_ids(tokenizer, text, 1) == theirs(text)["input_ids"], text
    lines = [">>fra<< the quick brown fox", "", ">>deu<< the quick brown fox"]
    code, out, err = translate_file(marian_checkpoint, lines, tmp_path, capsys)
    assert code == 0, err
    assert len(out) == 3 and out[1] == "" and "translated 3 sentences" in err

    code, _, err = translate_file(marian_checkpoint, ["the dog", ">>xyz<< the dog"], tmp_path,
                                  capsys)
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        f"error: line 2 starts with the language code >>xyz<<, which "
        f"{marian_checkpoint / 'vocab.json'} does not have; its codes are >>fra<< >>deu<<")


def test_translate_normalises_punctuation_when_asked(marian_checkpoint, theirs, tmp_path,
                                                     capsys):
    lines = ODD_PUNCTUATION
    normalised = [theirs.normalize(line) for line in lines]
    raw_out = translate_file(marian_checkpoint, lines, tmp_path, capsys)[1]
    normalised_out = translate_file(marian_checkpoint, normalised, tmp_path, capsys)[1]
    assert raw_out != normalised_out  # the normaliser changes what the model makes of them
    code, out, err = translate_file(marian_checkpoint, lines, tmp_path, capsys,
                                    "--normalize-punctuation")
    assert code == 0, err
    assert out == normalised_out
