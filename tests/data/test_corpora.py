"""Text in (data/corpora.py): the built-in corpora, and the bad-data policy of parallel
text and TSV/CSV files."""

import collections

import numpy as np
import pytest
from num2words import num2words

from jax_transformer.data.corpora import (EMPTY, MALFORMED_ROW, TOO_LONG, UNDECODABLE, CorpusError,
                                          cardinal_words, holdout_split, number_corpus,
                                          read_columns, read_parallel_text, sample_numbers)


# --- Built-in corpus ----------------------------------------------------------------------

def test_number_corpus_sizes_splits_and_determinism():
    corpus = number_corpus(num_train=3000, num_dev=200, num_test=300, seed=1)
    assert {split: len(pairs) for split, pairs in corpus.items()} == {
        "train": 3000, "dev": 200, "test": 300}
    sources = {split: {src for src, _ in pairs} for split, pairs in corpus.items()}
    assert sum(map(len, sources.values())) == 3500  # every number once: splits are disjoint
    assert corpus == number_corpus(num_train=3000, num_dev=200, num_test=300, seed=1)
    assert corpus != number_corpus(num_train=3000, num_dev=200, num_test=300, seed=2)


def test_number_corpus_pairs_are_right():
    everything = number_corpus(num_train=900, num_dev=50, num_test=50, max_number=1000)
    pairs = {pair for split in everything.values() for pair in split}
    assert ("three hundred and forty-two", "dreihundertzweiundvierzig") in pairs
    assert ("seven", "sieben") in pairs
    french = number_corpus("en", "fr", num_train=90, num_dev=5, num_test=5, max_number=100)
    assert ("twenty-one", "vingt et un") in {p for split in french.values() for p in split}


def test_sample_numbers_spreads_over_digit_counts():
    numbers = sample_numbers(6000, 10**6, np.random.default_rng(0))
    assert len(set(numbers.tolist())) == 6000 and numbers.min() >= 0 and numbers.max() < 10**6
    per_digit_count = collections.Counter(len(str(n)) for n in numbers)
    # 1-3 digits are taken whole; the rest is shared by 4, 5 and 6 digits.
    assert [per_digit_count[d] for d in (1, 2, 3)] == [10, 90, 900]
    assert all(abs(per_digit_count[d] - 5000 / 3) <= 1 for d in (4, 5, 6))
    with pytest.raises(CorpusError, match="distinct"):
        sample_numbers(101, 100, np.random.default_rng(0))


@pytest.mark.parametrize("lang", ["en", "de", "fr"])
def test_fast_cardinal_words_equal_num2words(lang):
    words = cardinal_words(lang, 10**6)
    numbers = [0, 1, 100, 1000, 1001, 100_000, 999_999]
    numbers += np.random.default_rng(0).integers(0, 10**6, 300).tolist()
    assert [words(n) for n in numbers] == [num2words(n, lang=lang) for n in numbers]


def test_unknown_language_names_the_available_ones():
    with pytest.raises(CorpusError, match="no language 'xx'.*available: .*de"):
        number_corpus("en", "xx", num_train=10, num_dev=1, num_test=1)


def test_holdout_split():
    pairs = [(str(i), str(-i)) for i in range(100)]
    splits = holdout_split(pairs, num_dev=10, num_test=5, seed=0)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [85, 10, 5]
    assert sorted(p for split in splits.values() for p in split) == sorted(pairs)
    with pytest.raises(CorpusError, match="cannot hold out"):
        holdout_split(pairs, num_dev=50, num_test=50)


# --- Parallel text and TSV/CSV: the bad-data policy ------------------------------------------

def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_parallel_text_reads_pairs_and_counts_skips(tmp_path):
    # A BOM, a CRLF line, an empty line, \r and U+2028 inside a line, a long line, bad bytes.
    src = write(tmp_path / "a.en",
                b"\xef\xbb\xbfone\r\n\ntwo\rand\xe2\x80\xa8half\n" + b"x" * 50 + b"\nbad\nthree \n")
    tgt = write(tmp_path / "a.de", b"eins\nnichts\nzwei\nlang\n\xff\xfe\ndrei\n")
    pairs, report = read_parallel_text(src, tgt, max_chars=20)
    # \r and U+2028 inside a line must not split it (text mode / str.splitlines would).
    assert pairs == [("one", "eins"), ("two\rand\u2028half", "zwei"), ("three", "drei")]
    assert report.kept == 3
    assert report.skipped == {EMPTY: 1, TOO_LONG: 1, UNDECODABLE: 1}
    assert report.first_line == {EMPTY: 2, TOO_LONG: 4, UNDECODABLE: 5}
    assert "kept 3 pairs, skipped 3" in str(report) and "not UTF-8 (first at line 5)" in str(report)


def test_parallel_text_errors(tmp_path):
    good = write(tmp_path / "good.en", b"a\nb\nc\n")
    with pytest.raises(CorpusError, match="empty.de is empty"):
        read_parallel_text(good, write(tmp_path / "empty.de", b""))
    with pytest.raises(CorpusError, match="good.en has 3 lines but .*short.de has 2"):
        read_parallel_text(good, write(tmp_path / "short.de", b"x\ny\n"))
    with pytest.raises(CorpusError, match="does not exist"):
        read_parallel_text(good, tmp_path / "missing.de")
    with pytest.raises(CorpusError, match="no usable sentence pair"):
        read_parallel_text(good, write(tmp_path / "blank.de", b"\n \n\t\n"))


def test_tsv_and_csv_columns(tmp_path):
    tsv = write(tmp_path / "c.tsv", b'id\ten\tde\n1\tsay "hi"\tsag "hallo"\n2\tshort\n'
                b"3\t\tleer\n4\tbad \xff\tschlecht\n5\tok\tgut\n")
    pairs, report = read_columns(tsv, "en", "de")
    assert pairs == [('say "hi"', 'sag "hallo"'), ("ok", "gut")]  # TSV keeps quotes as text
    assert report.skipped == {MALFORMED_ROW: 1, EMPTY: 1, UNDECODABLE: 1}
    assert report.first_line == {MALFORMED_ROW: 3, EMPTY: 4, UNDECODABLE: 5}
    csv_file = write(tmp_path / "c.csv", b'en,de\n"one, two","eins, zwei"\n')
    assert read_columns(csv_file, "en", "de")[0] == [("one, two", "eins, zwei")]
    with pytest.raises(CorpusError, match=r"no column 'fr'; its columns are 'id', 'en', 'de'"):
        read_columns(tsv, "en", "fr")
    with pytest.raises(CorpusError, match="is empty"):
        read_columns(write(tmp_path / "e.tsv", b""), "en", "de")
    huge = write(tmp_path / "h.csv", b"en,de\n" + b"x" * 200_000 + b",y\n")
    with pytest.raises(CorpusError, match="h.csv, line .*field larger than field limit"):
        read_columns(huge, "en", "de")
