"""A language model's data (train.py --task lm): the built-in counting text, text files,
lines encoded and packed as targets without a source, resumable."""

import collections
import json

import numpy as np
import pytest

from jax_transformer.data.tokenizing import TOO_MANY_TOKENS, encode_lines, train_tokenizer
from jax_transformer.data.batches.packed import TEXT_KEYS, PackedBatches
from jax_transformer.data.batches.rows import fitting_row_shape
from jax_transformer.data.corpora import (COUNT_MAX, COUNT_MIN, EMPTY, TOO_LONG, UNDECODABLE,
                                          CorpusError, cardinal_words, counting_text,
                                          read_columns, read_parallel_text, read_text)
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID


def test_counting_text_counts_on_from_distinct_starts():
    splits = counting_text("en", num_train=300, num_dev=20, num_test=30, max_number=1000, seed=4)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [300, 20, 30]
    assert splits == counting_text("en", num_train=300, num_dev=20, num_test=30,
                                   max_number=1000, seed=4)
    number_of = {cardinal_words("en", 2000)(n): n for n in range(1000 + COUNT_MAX)}
    starts = {}
    for split, lines in splits.items():
        starts[split] = set()
        for line in lines:
            numbers = [number_of[words] for words in line.split("; ")]
            assert COUNT_MIN <= len(numbers) <= COUNT_MAX, line
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), line
            assert numbers[0] < 1000
            starts[split].add(numbers[0])
    assert sum(map(len, starts.values())) == 350  # every line starts somewhere else
    assert counting_text("de", num_train=5, num_dev=1, num_test=1)["train"][0] != \
        counting_text("en", num_train=5, num_dev=1, num_test=1)["train"][0]


def test_text_file_reads_lines_and_counts_skips(tmp_path):
    # A BOM, a CRLF line, an empty line, \r inside a line, a long line, bad bytes.
    path = tmp_path / "book.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\n\ntwo\rthree\n" + b"x" * 50 + b"\n\xff\xfe\n four \n")
    lines, report = read_text(path, max_chars=20)
    assert lines == ["one", "two\rthree", "four"]
    assert report.skipped == {EMPTY: 1, TOO_LONG: 1, UNDECODABLE: 1}
    assert report.first_line == {EMPTY: 2, TOO_LONG: 4, UNDECODABLE: 5}
    assert "kept 3 lines, skipped 3" in str(report)


def test_text_file_errors(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        read_text(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="empty.txt is empty"):
        read_text(tmp_path / "empty.txt")
    (tmp_path / "blank.txt").write_bytes(b"\n  \n")
    with pytest.raises(CorpusError, match="no usable line"):
        read_text(tmp_path / "blank.txt")


def test_encode_lines_drops_and_counts_long_lines(tmp_path):
    lines = counting_text(num_train=200, num_dev=1, num_test=1, max_number=100_000)["train"]
    tokenizer = train_tokenizer(lines, tmp_path / "tokenizer.model", vocab_size=100)
    ids, report = encode_lines(tokenizer, lines, max_len=40)
    fits = [len(tokenizer.encode(line)) + 1 <= 40 for line in lines]
    assert 0 < report.kept == sum(fits) == len(ids) < len(lines)
    assert report.skipped == {TOO_MANY_TOKENS: len(lines) - sum(fits)}
    assert report.first_line == {TOO_MANY_TOKENS: fits.index(False) + 1}
    assert [tokenizer.decode(i) for i in ids] == [line for line, f in zip(lines, fits) if f]
    with pytest.raises(CorpusError, match="every line is longer than max_len 3"):
        encode_lines(tokenizer, lines, max_len=3)


def synthetic_lines(n=300, seed=0):
    """Line i starts with piece 4 + i, so a segment names its line."""
    rng = np.random.default_rng(seed)
    return [np.concatenate([[4 + i], rng.integers(4, 50, rng.integers(0, 40))]).astype(np.int32)
            for i in range(n)]


def lines_of(batch):
    """[(line index, decoder input, labels)] of a packed text batch, checking segment
    ids, positions and padding on the way."""
    found = []
    for row in range(batch["tgt_in"].shape[0]):
        segments = batch["tgt_segments"][row]
        real = segments > 0
        assert not real[real.argmin():].any() or real.all()  # padding only at the end
        for key in ("tgt_in", "tgt_out", "tgt_positions"):
            assert (batch[key][row][~real] == PAD_ID).all()
        for k in range(1, segments.max() + 1):
            mine = segments == k
            assert np.array_equal(batch["tgt_positions"][row][mine], np.arange(mine.sum()))
            tgt_in, tgt_out = batch["tgt_in"][row][mine], batch["tgt_out"][row][mine]
            found.append((tgt_out[0] - 4, tgt_in, tgt_out))
    return found


def test_text_batches_hold_every_line_once_as_a_target_without_a_source():
    ids = synthetic_lines()
    row_shape = fitting_row_shape(None, np.array([len(i) + 1 for i in ids]), max_len=64)
    assert row_shape == (0, 64)
    data = PackedBatches(None, ids, max_tokens=300, row_shapes=[row_shape], batch_multiple=2)
    assert data.shapes() == [(4, 0, 64)]
    seen = collections.Counter()
    for batch in data.epoch(1):
        assert tuple(batch) == TEXT_KEYS
        assert all(v.shape == (4, 64) and v.dtype == np.int32 for v in batch.values())
        for i, tgt_in, tgt_out in lines_of(batch):
            seen[i] += 1
            np.testing.assert_array_equal(tgt_in, np.r_[BOS_ID, ids[i]])
            np.testing.assert_array_equal(tgt_out, np.r_[ids[i], EOS_ID])
    assert seen == {i: 1 for i in range(len(ids))}
    fill = data.fill(1)
    assert "src_real_fraction" not in fill and fill["real_fraction"] == fill["tgt_real_fraction"]
    assert fill["tgt_real_fraction"] > 0.9  # several lines share a row


def test_text_batches_resume_exactly_and_refuse_other_text():
    ids = synthetic_lines(100)
    data = PackedBatches(None, ids, max_tokens=128, row_shapes=[(0, 64)], seed=3)
    uninterrupted = data.iterator()
    reference = [next(uninterrupted) for _ in range(10)]
    interrupted = data.iterator()
    for _ in range(4):
        next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))
    resumed = PackedBatches(None, ids, max_tokens=128, row_shapes=[(0, 64)],
                            seed=3).iterator(state)
    for expected in reference[4:]:
        batch = next(resumed)
        assert all(np.array_equal(batch[k], expected[k]) for k in TEXT_KEYS)
    other = PackedBatches(None, ids[:-1], max_tokens=128, row_shapes=[(0, 64)], seed=3)
    with pytest.raises(CorpusError, match="other data"):
        other.iterator(state)


WIDE = [("utf-16-le", "looks like UTF-16 LE text without a byte order mark"),
        ("utf-16-be", "looks like UTF-16 BE text without a byte order mark"),
        ("utf-16", "is UTF-16 LE text, not UTF-8: it starts with a UTF-16 LE byte order mark"),
        ("utf-32", "is UTF-32 LE text, not UTF-8: it starts with a UTF-32 LE byte order mark")]


@pytest.mark.parametrize("encoding, says", WIDE, ids=[e for e, _ in WIDE])
def test_every_reader_refuses_utf16_and_utf32(tmp_path, encoding, says):
    """NULs are valid UTF-8, so UTF-16 text without a byte order mark used to be read as
    lines of NUL-interleaved letters; with a byte order mark, only its line was skipped."""
    wide, good = tmp_path / "wide.txt", tmp_path / "good.txt"
    wide.write_bytes("one two\nthree four\nfive six\n".encode(encoding))
    good.write_text("eins zwei\ndrei vier\nfünf sechs\n")
    columns = tmp_path / "wide.tsv"
    columns.write_bytes("source\ttarget\none\teins\ntwo\tzwei\n".encode(encoding))
    for read, path in ((lambda: read_text(wide), wide),
                       (lambda: read_parallel_text(good, wide), wide),
                       (lambda: read_columns(columns, "source", "target"), columns)):
        with pytest.raises(CorpusError) as info:
            read()
        assert str(info.value).startswith(f"{path} {says}")
        assert "iconv -f UTF-" in str(info.value)


def test_every_reader_refuses_a_nul_byte(tmp_path):
    text, good = tmp_path / "book.txt", tmp_path / "good.txt"
    text.write_bytes(b"one two\nthree\x00four\nfive six\n")
    good.write_text("eins zwei\ndrei vier\nfunf sechs\n")
    columns = tmp_path / "pairs.tsv"
    columns.write_bytes(b"source\ttarget\none\teins\ntwo\tzw\x00ei\n")
    nul = "is not UTF-8 text: line {} holds a NUL byte{}, which text never does"
    for read, path, line, byte in ((lambda: read_text(text), text, 2, " (byte 6)"),
                                   (lambda: read_parallel_text(text, good), text, 2, " (byte 6)"),
                                   (lambda: read_columns(columns, "source", "target"), columns,
                                    3, "")):
        with pytest.raises(CorpusError) as info:
            read()
        assert str(info.value).startswith(f"{path} {nul.format(line, byte)}")
