"""Corpora, bad-data policy, tokenizer round trip, packing and exact resume."""

import collections
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from num2words import num2words

from jax_transformer.data import encoding, rows
from jax_transformer.data.encoding import TOO_MANY_TOKENS, encode_pairs, train_tokenizer
from jax_transformer.data.packing import BatchMultipleChanged, PackedBatches
from jax_transformer.data.corpora import (EMPTY, MALFORMED_ROW, TOO_LONG, UNDECODABLE, CorpusError,
                                     cardinal_words, holdout_split, number_corpus,
                                     read_columns, read_parallel_text, sample_numbers)
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID

REPO = Path(__file__).resolve().parents[2]


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


# --- Tokenizer and encoding -----------------------------------------------------------------

@pytest.fixture(scope="module")
def numbers_and_tokenizer(tmp_path_factory):
    corpus = number_corpus(num_train=2000, num_dev=100, num_test=200, seed=0)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return corpus, train_tokenizer(corpus["train"], path, vocab_size=300)


def test_tokenizer_round_trip_on_held_out_numbers(numbers_and_tokenizer):
    corpus, tokenizer = numbers_and_tokenizer
    for src, tgt in corpus["test"]:
        for text in (src, tgt):
            ids = tokenizer.encode(text)
            assert all(i > EOS_ID for i in ids), text  # no unk, no specials
            assert tokenizer.decode(ids + [EOS_ID, 7]) == text


# Trains a tokenizer with a command's stop handlers (exit_codes.run), and sends itself
# SIGTERM once SentencePiece has read every sentence and trains in C++; stderr's first line
# is when the signal went.
TRAIN_AND_STOP = """
import os, random, signal, sys, threading, time
from jax_transformer.commands import exit_codes
from transformer_core.tokenizer import Tokenizer

def sentences():
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(20000)]
    for _ in range(60000):
        yield " ".join(rng.choices(words, k=12))
    threading.Timer(0.5, lambda: (print(time.time(), file=sys.stderr, flush=True),
                                  os.kill(os.getpid(), signal.SIGTERM))).start()

sys.exit(exit_codes.run(lambda argv: Tokenizer.train(sentences(), sys.argv[1], 8000) and None))
"""


@pytest.mark.slow  # a subprocess that trains a tokenizer for seconds
def test_sigterm_stops_tokenizer_training_at_once(tmp_path):
    """Before: SentencePiece's training in the main thread kept the handler waiting until it
    returned (~18 s on a real corpus)."""
    result = subprocess.run([sys.executable, "-c", TRAIN_AND_STOP, str(tmp_path / "t.model")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    sent, stopped = [line for line in result.stderr.splitlines() if line]
    assert stopped == "SIGTERM: stopped"
    assert ended - float(sent) < 2, f"stopped {ended - float(sent):.1f} s after SIGTERM"
    assert not (tmp_path / "t.model").exists()


def test_encode_pairs_drops_and_counts_long_pairs(numbers_and_tokenizer, monkeypatch):
    monkeypatch.setattr(encoding, "ENCODE_CHUNK", 7)  # encode in several chunks
    corpus, tokenizer = numbers_and_tokenizer
    pairs = corpus["dev"]
    src_ids, tgt_ids, report = encode_pairs(tokenizer, pairs, max_len=10)
    fits = [max(len(tokenizer.encode(s)), len(tokenizer.encode(t))) + 1 <= 10 for s, t in pairs]
    assert 0 < report.kept == sum(fits) == len(src_ids) == len(tgt_ids) < len(pairs)
    assert report.skipped == {TOO_MANY_TOKENS: len(pairs) - sum(fits)}
    assert report.first_line == {TOO_MANY_TOKENS: fits.index(False) + 1}
    kept = [pair for pair, fit in zip(pairs, fits) if fit]
    assert [(tokenizer.decode(s), tokenizer.decode(t)) for s, t in zip(src_ids, tgt_ids)] == kept
    assert src_ids[0].dtype == tgt_ids[0].dtype == np.int32


# --- Packing ------------------------------------------------------------------------------

def synthetic_examples(n=500, seed=0):
    """Example i: source starts with piece 4 + i (so a segment names its example)."""
    rng = np.random.default_rng(seed)
    src = [np.concatenate([[4 + i], rng.integers(4, 50, rng.integers(0, 40))]).astype(np.int32)
           for i in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(1, 60)).astype(np.int32) for _ in range(n)]
    return src, tgt


def unpack(batch):
    """The (example index, source, target input, labels) of every pair in a packed batch,
    checking segment ids and positions on the way."""
    pairs = []
    for row in range(batch["src"].shape[0]):
        sides = {}
        for side, keys in (("src", ("src",)), ("tgt", ("tgt_in", "tgt_out"))):
            segments = batch[f"{side}_segments"][row]
            real = segments > 0
            count = segments.max()
            # Segments 1..count in order, then padding only.
            assert np.array_equal(segments[real], np.repeat(np.arange(1, count + 1),
                                                            np.bincount(segments)[1:]))
            assert not real[real.argmin():].any() or real.all()
            for key in keys:
                assert (batch[key][row][~real] == PAD_ID).all()
            assert (batch[f"{side}_positions"][row][~real] == 0).all()
            sides[side] = [{key: batch[key][row][segments == k] for key in keys}
                           | {"positions": batch[f"{side}_positions"][row][segments == k]}
                           for k in range(1, count + 1)]
        assert len(sides["src"]) == len(sides["tgt"])
        for s, t in zip(sides["src"], sides["tgt"]):
            for piece in (s, t):
                n = len(piece["positions"])
                assert np.array_equal(piece["positions"], np.arange(n))
            pairs.append((s["src"][0] - 4, s["src"], t["tgt_in"], t["tgt_out"]))
    return pairs


@pytest.mark.parametrize("row_shapes", [[(64, 64)], [(32, 48), (64, 64)]])
def test_packed_batches_shapes_budget_and_every_pair_once(row_shapes):
    src, tgt = synthetic_examples()
    data = PackedBatches(src, tgt, max_tokens=500, row_shapes=row_shapes, batch_multiple=2,
                         seed=0)
    shapes = data.shapes()
    assert len(shapes) == len(row_shapes)
    assert all(R * max(S, T) <= 500 and R % 2 == 0 and R > 0 for R, S, T in shapes)
    seen, slots, batches = collections.Counter(), 0, list(data.epoch(3))
    for batch in batches:
        R, S = batch["src"].shape
        T = batch["tgt_in"].shape[1]
        assert (R, S, T) in shapes
        slots += R * T
        for key, value in batch.items():
            assert value.shape == (R, S if key.startswith("src") else T)
            assert value.dtype == np.int32
        for i, s, t_in, t_out in unpack(batch):
            seen[i] += 1
            np.testing.assert_array_equal(s, np.r_[src[i], EOS_ID])
            np.testing.assert_array_equal(t_in, np.r_[BOS_ID, tgt[i]])
            np.testing.assert_array_equal(t_out, np.r_[tgt[i], EOS_ID])
    assert seen == {i: 1 for i in range(len(src))}
    fill = data.fill(3)
    assert fill["batches"] == len(batches)
    assert fill["tgt_real_fraction"] == pytest.approx(sum(len(t) + 1 for t in tgt) / slots)


def test_packing_is_tight():
    """Best-fit decreasing leaves little room: on these uniform lengths (1-60 target
    positions) in rows of 128, over 95% of the target slots hold tokens; laying
    one pair per row would fill under 30%."""
    src, tgt = synthetic_examples(2000)
    data = PackedBatches(src, tgt, max_tokens=4096, row_shapes=[(128, 128)], seed=0)
    fill = data.fill()
    assert fill["tgt_real_fraction"] > 0.95 and fill["src_real_fraction"] > 0.6


def test_fitting_row_shape():
    src_needed, tgt_needed = np.array([3, 5, 9, 30]), np.array([2, 2, 3, 40])
    # The side with more tokens holds its longest sentence and ROW_SENTENCES average
    # ones; the other side its longest and a length in proportion to its tokens.
    assert rows.fitting_row_shape(src_needed, tgt_needed, max_len=256) == (48, 48)
    assert rows.fitting_row_shape(np.full(9, 10), np.full(9, 20), 256) == (48, 96)
    assert rows.fitting_row_shape(src_needed, np.array([2, 2, 3, 4]), 256) == (48, 16)
    assert rows.fitting_row_shape(src_needed, tgt_needed, max_len=40) == (40, 40)


def test_jit_compiles_once_per_announced_shape():
    import jax
    src, tgt = synthetic_examples(300)
    data = PackedBatches(src, tgt, max_tokens=512, row_shapes=[(32, 48), (64, 64)],
                         batch_multiple=2)

    @jax.jit
    def count_tokens(batch):
        return (batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum()

    iterator = data.iterator()
    for _ in range(2 * len(data.epoch_plan(0))):
        count_tokens(next(iterator))
    assert count_tokens._cache_size() == len(data.shapes())


def test_a_process_builds_only_its_rows_of_each_batch():
    """Each of several processes lays out the rows its devices hold (here the halves of
    4-row batches); together they are the whole batch, a short last batch's missing rows
    padding, and the iterator counts the whole batch's target tokens."""
    src, tgt = synthetic_examples(150)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                         seed=1)
    halves = [lambda rows: slice(0, rows // 2), lambda rows: slice(rows // 2, rows)]
    whole, parts = data.iterator(), [data.iterator(local_rows=half) for half in halves]
    plan, counted = data.epoch_plan(0), 0
    assert min(len(rows) for _, rows in plan) <= 2  # a batch whose second half is empty
    for _ in range(len(plan)):
        batch = next(whole)
        pieces = [next(part) for part in parts]
        for key in batch:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in pieces]), batch[key])
        counted += int((batch["tgt_out"] != PAD_ID).sum())
        assert whole.target_tokens == counted
    assert all(part.target_tokens == whole.target_tokens for part in parts)


def test_bad_packing_settings():
    src, tgt = synthetic_examples(20)
    with pytest.raises(ValueError, match="need max_tokens >= 64"):
        PackedBatches(src, tgt, max_tokens=63, row_shapes=[(64, 64)])
    with pytest.raises(ValueError, match="more than the longest target row 16"):
        PackedBatches(src, tgt, max_tokens=1000, row_shapes=[(64, 16)])


# --- Exact resume ---------------------------------------------------------------------------

def assert_same_batches(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_resume_continues_exactly_across_an_epoch_boundary():
    src, tgt = synthetic_examples(200)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                         seed=5)
    n = len(data.epoch_plan(0))
    uninterrupted = data.iterator()
    reference = [next(uninterrupted) for _ in range(3 * n)]

    interrupted = data.iterator()
    for _ in range(n - 2):  # stop two batches before the end of epoch 0
        next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))
    assert state == {"epoch": 0, "block": 0, "index": n - 2, "shapes": [[4, 64, 64]],
                     "fingerprint": data.fingerprint, "batch_multiple": 2}
    resumed = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                            seed=5).iterator(state)
    following = [next(resumed) for _ in range(2 + len(data.epoch_plan(1)) + 2)]
    assert_same_batches(following, reference[n - 2:n + len(following) - 2])
    assert resumed.get_state()["epoch"] == 2 and resumed.get_state()["index"] == 2

    # Epochs are shuffled differently; an unshuffled split repeats itself.
    assert_same_batches(reference[:n], list(data.epoch(0)))
    assert not all(np.array_equal(a["src"], b["src"]) for a, b in zip(reference, reference[n:]))
    fixed = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], shuffle=False)
    assert_same_batches(list(fixed.epoch(0)), list(fixed.epoch(1)))


def test_resume_refuses_a_state_from_other_data():
    src, tgt = synthetic_examples(200)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)])
    state = data.iterator().get_state()
    with pytest.raises(ValueError, match="saved for batch shapes"):
        PackedBatches(src, tgt, max_tokens=512, row_shapes=[(64, 64)]).iterator(state)
    with pytest.raises(ValueError, match="out of range"):
        data.iterator({**state, "index": len(data.epoch_plan(0))})
    # Rows rounded to another multiple (train.py: another device count) say so.
    with pytest.raises(BatchMultipleChanged, match=r"rows a multiple of 1\), these settings "
                       r"give \[\[3, 64, 64\]\] \(rows a multiple of 3"):
        PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)],
                      batch_multiple=3).iterator(state)
    # Same sizes, same shapes, one token changed: the fingerprint tells.
    changed = [ids.copy() for ids in src]
    changed[7][0] += 1
    other = PackedBatches(changed, tgt, max_tokens=256, row_shapes=[(64, 64)])
    with pytest.raises(ValueError, match="saved for other data"):
        other.iterator(state)
