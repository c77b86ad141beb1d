"""The natural-length corpus: determinism, format, the calibrated lengths, the translation."""

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jax_transformer.commands import natural_corpus
from jax_transformer.data import natural
from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.natural import natural_length_corpus
from transformer_core.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
SENTENCE = re.compile(r"[a-z]+( [a-z]+)*\.")


def word_counts(sentences) -> np.ndarray:
    return np.array([len(sentence.split()) for sentence in sentences])


def test_same_seed_same_pairs_and_prefixes_do_not_depend_on_size():
    pairs = natural_length_corpus(12_345, seed=7)
    assert len(pairs) == 12_345
    assert pairs == natural_length_corpus(12_345, seed=7)
    assert pairs != natural_length_corpus(12_345, seed=8)
    assert natural_length_corpus(25_000, seed=7)[:12_345] == pairs  # across a chunk edge


def test_the_corpus_is_pinned():
    """Any change to the language, the lengths or numpy's streams changes this digest;
    the calibrated numbers in the module's docstring then need measuring again."""
    text = "\n".join(f"{source}\t{target}" for source, target in natural_length_corpus(1000))
    assert hashlib.sha256(text.encode()).hexdigest() == (
        "604cb365f25fd92b67768f68a94aaf174a21c1b540475c498bf0b568eb6ada1e")


def test_sentences_are_lowercase_words_ending_in_a_period():
    for source, target in natural_length_corpus(5000, seed=1):
        assert SENTENCE.fullmatch(source), source
        assert SENTENCE.fullmatch(target), target


def test_each_language_has_its_full_vocabulary():
    lang = natural.language()
    assert len(set(lang.source_words)) == natural.VOCABULARY_SIZE
    assert len(set(lang.target_phrases)) == natural.VOCABULARY_SIZE


@pytest.mark.parametrize("num_pairs, seed", [(0, 0), (-3, 0), (10, -1)])
def test_bad_arguments_are_corpus_errors(num_pairs, seed):
    with pytest.raises(CorpusError, match="natural_length_corpus needs"):
        natural_length_corpus(num_pairs, seed)


def test_source_lengths_in_words_are_the_calibrated_log_normal():
    words = word_counts(source for source, _ in natural_length_corpus(20_000))
    assert 16 <= np.median(words) <= 19  # 17
    assert 34 <= np.percentile(words, 90) <= 36  # 35
    assert 58 <= np.percentile(words, 99) <= 66  # 61
    assert 120 <= words.max() <= 140  # 140: a tail, clipped
    assert words.min() >= 1


def test_targets_are_a_little_longer_than_their_sources_and_follow_them():
    pairs = natural_length_corpus(20_000)
    source = word_counts(s for s, _ in pairs)
    target = word_counts(t for _, t in pairs)
    assert 1.08 <= target.sum() / source.sum() <= 1.15  # 1.116: particles add words
    assert np.all(source <= target) and np.all(target <= 2 * source)
    assert np.corrcoef(source, target)[0, 1] > 0.98  # 0.994


def test_the_target_is_the_documented_translation_of_the_source():
    """Re-derive each target word by word: dictionary, then modifier swaps left to right."""
    lang = natural.language()
    rank = {word: i for i, word in enumerate(lang.source_words)}
    num_words = num_swaps = 0
    for source, target in natural_length_corpus(2000, seed=3):
        words = [rank[word] for word in source.rstrip(".").split()]
        phrases = [lang.target_phrases[w] for w in words]
        i = 0
        while i < len(words) - 1:
            if lang.is_modifier[words[i]] and not lang.is_modifier[words[i + 1]]:
                phrases[i], phrases[i + 1] = phrases[i + 1], phrases[i]
                num_swaps += 1
                i += 1
            i += 1
        assert target == " ".join(phrases) + "."
        num_words += len(words)
    assert 0.08 <= num_swaps / num_words <= 0.16  # 0.12: word order does change


def piece_counts(tokenizer: Tokenizer, sentences) -> np.ndarray:
    return np.array([len(ids) for ids in tokenizer.sp.encode(list(sentences))])


def longest_in_pieces(tokenizer: Tokenizer, sentences: list[str]) -> int:
    """The most pieces in any of `sentences`. Only the 2% longest in words are encoded
    (all 100k take seconds): pieces are ~1.4 per word, every sentence of 150+ pieces
    has 88+ words, and the 98th percentile is 56."""
    words = word_counts(sentences)
    cutoff = np.percentile(words, 98)
    return piece_counts(tokenizer, (s for s, n in zip(sentences, words) if n >= cutoff)).max()


@pytest.mark.slow  # trains an 8,000-piece tokenizer
def test_bpe_8000_lengths_look_like_wmt(tmp_path):
    """Under a BPE 8000 model trained on the corpus (20k pairs, about a second)."""
    pairs = natural_length_corpus(50_000)
    trained_on = pairs[:20_000]
    tokenizer = Tokenizer.train((s for pair in trained_on for s in pair),
                                tmp_path / "bpe.model", vocab_size=8000, model_type="bpe")
    source = piece_counts(tokenizer, (s for s, _ in trained_on))
    target = piece_counts(tokenizer, (t for _, t in trained_on))
    assert 20 <= np.median(source) <= 30  # 25
    assert 45 <= np.percentile(source, 90) <= 60  # 50
    assert 1.0 <= target.sum() / source.sum() <= 1.2  # 1.08
    # Frequent words stay whole, rare ones are split, as in real text.
    lang = natural.language()
    assert np.mean(piece_counts(tokenizer, lang.source_words[:100]) == 1) > 0.9
    assert np.mean(piece_counts(tokenizer, lang.source_words[-100:]) >= 2) > 0.9
    longest_source = longest_in_pieces(tokenizer, [s for s, _ in pairs])
    longest_target = longest_in_pieces(tokenizer, [t for _, t in pairs])
    # A thin tail, and every pair fits encode_pairs' max_len 256 with its eos.
    assert 180 <= longest_source <= longest_target <= 255  # 213, 233


def test_command_line_writes_both_sides_without_jax(tmp_path):
    """`jaxformer-natural-corpus` (via runpy, as -m does), JAX and torch blocked."""
    script = ("import runpy, sys\n"
              "sys.modules['jax'] = sys.modules['torch'] = None\n"
              "sys.argv = ['natural'] + sys.argv[1:]\n"
              "runpy.run_module('jax_transformer.commands.natural_corpus', run_name='__main__')\n")
    out_dir = tmp_path / "corpus"
    result = subprocess.run([sys.executable, "-c", script, "--pairs", "300", "--seed", "5",
                             "--out-dir", str(out_dir)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    pairs = natural_length_corpus(300, seed=5)
    for side, name in enumerate(("train.src", "train.tgt")):
        data = (out_dir / name).read_bytes()
        assert data.decode("ascii") == "".join(pair[side] + "\n" for pair in pairs)
        assert f"{out_dir / name}: words per sentence median" in result.stdout


def test_command_line_bad_pairs_is_one_error_line(tmp_path, capsys):
    assert natural_corpus.main(["--pairs", "0", "--out-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: natural_length_corpus needs at least one pair, got 0")
    assert not list(tmp_path.iterdir())
