"""Corpora: sentence pairs for translation, lines of text for language models.

Everything here yields plain `(source, target)` string pairs or text lines;
tokenizing and batching live in `data.tokenizing` and `data.batches`. Needs neither
JAX nor torch.

Built-in corpus (`number_corpus`): numbers written out in two languages with
num2words, e.g. ("three hundred and forty-two", "dreihundertzweiundvierzig").
The test and dev numbers never occur in training.

Built-in text (`counting_text`, for language models): lines that count on in
words, e.g. "ninety-eight; ninety-nine; one hundred; one hundred and one".

User corpora (`read_parallel_text`, `read_columns`, `read_text`), with the
bad-data policy (documented in docs/data.md):

    empty file, unequal line counts, missing column, no usable pair,
    UTF-16 or UTF-32 text, a NUL byte (transformer_core.text)        -> CorpusError
    empty line, line over `max_chars`, bytes that are not UTF-8,
    CSV row with too few fields                                      -> counted skip

A skip drops the whole pair (or line) and is counted in a `CorpusReport` (with the first
line number per reason), which train.py prints. Lines are split on b"\\n" only:
Python's text mode also splits on a lone \\r, str.splitlines also on U+2028 and
U+0085; all occur inside WMT sentences and would silently misalign the two sides.
"""

from __future__ import annotations

import collections
import copy
import csv
import dataclasses
import itertools
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np
from num2words import CONVERTER_CLASSES, num2words

from transformer_core.errors import InputError
from transformer_core.text import SNIFF_BYTES, encoding_problem, nul_problem

Pair = tuple[str, str]
Example = TypeVar("Example")  # a Pair or a line of text

# Skip reasons, as counted in CorpusReport.skipped.
EMPTY, TOO_LONG, UNDECODABLE, MALFORMED_ROW = "empty", "too long", "not UTF-8", "malformed row"


class CorpusError(InputError):
    """The corpus cannot be used as given; the message says which file and why."""


@dataclasses.dataclass
class CorpusReport:
    """What reading a corpus kept and skipped; `str(report)` is one printable line."""

    source: str
    unit: str = "pairs"  # what is kept: "pairs", or "lines" of text
    kept: int = 0
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    first_line: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> line

    def skip(self, reason: str, line: int) -> None:
        self.skipped[reason] += 1
        self.first_line.setdefault(reason, line)

    def __str__(self) -> str:
        text = f"{self.source}: kept {self.kept} {self.unit}"
        if self.skipped:
            reasons = ", ".join(f"{count} {reason} (first at line {self.first_line[reason]})"
                                for reason, count in sorted(self.skipped.items()))
            text += f", skipped {sum(self.skipped.values())}: {reasons}"
        return text


# --- Built-in corpus: numbers in words ---------------------------------------------------

def cardinal_words(lang: str, max_number: int) -> Callable[[int], str]:
    """A function n -> num2words(n, lang=lang) for 0 <= n < max_number, without
    num2words' scan of its whole table of number words (up to 10^600 for German) at
    every call: a copy of the converter that keeps only the words <= max_number
    gives the same text (tests/data/test_corpora.py checks en, de and fr).
    """
    if lang not in CONVERTER_CLASSES:
        raise CorpusError(f"num2words has no language {lang!r}; "
                          f"available: {', '.join(sorted(CONVERTER_CLASSES))}")
    converter = CONVERTER_CLASSES[lang]
    if not isinstance(getattr(converter, "cards", None), dict):
        return lambda n: num2words(n, lang=lang)  # a converter without a word table
    trimmed = copy.copy(converter)
    trimmed.cards = collections.OrderedDict(
        (value, word) for value, word in converter.cards.items() if value <= max_number)
    return trimmed.to_cardinal


def sample_numbers(count: int, max_number: int, rng: np.random.Generator) -> np.ndarray:
    """`count` distinct numbers in [0, max_number), spread evenly over digit counts.

    Each digit count (1-digit, 2-digit, ...) gets an equal share; classes too small
    for their share (there are only 10 one-digit numbers) are taken whole and the
    rest goes to the larger classes. Returns a shuffled int64 array (count,).
    """
    if count > max_number:
        raise CorpusError(f"cannot draw {count} distinct numbers below {max_number}")
    num_digits = len(str(max_number - 1))
    lows = [0] + [10 ** d for d in range(1, num_digits)]
    highs = lows[1:] + [max_number]
    sizes = [high - low for low, high in zip(lows, highs)]
    quotas = [0] * num_digits
    remaining = count
    by_size = sorted(range(num_digits), key=lambda c: sizes[c])
    for position, c in enumerate(by_size):
        classes_left = num_digits - position
        quotas[c] = min(sizes[c], -(-remaining // classes_left))  # ceil share
        remaining -= quotas[c]
    numbers = np.concatenate([low + rng.choice(size, quota, replace=False)
                              for low, size, quota in zip(lows, sizes, quotas)])
    return rng.permutation(numbers)


def number_corpus(src_lang: str = "en", tgt_lang: str = "de", num_train: int = 50_000,
                  num_dev: int = 1_000, num_test: int = 1_000, max_number: int = 1_000_000,
                  seed: int = 0) -> dict[str, list[Pair]]:
    """Numbers in words, `src_lang` -> `tgt_lang` (num2words codes), split three ways.

    Returns {"train": [...], "dev": [...], "test": [...]} of (source, target)
    pairs; the three splits hold disjoint numbers, all below `max_number`, drawn
    log-uniformly over digit counts (see `sample_numbers`). Same seed, same corpus.
    """
    rng = np.random.default_rng(seed)
    numbers = sample_numbers(num_train + num_dev + num_test, max_number, rng)
    src_words = cardinal_words(src_lang, max_number)
    tgt_words = cardinal_words(tgt_lang, max_number)
    pairs = [(src_words(int(n)), tgt_words(int(n))) for n in numbers]
    return {"test": pairs[:num_test],
            "dev": pairs[num_test:num_test + num_dev],
            "train": pairs[num_test + num_dev:]}


COUNT_MIN, COUNT_MAX = 3, 8  # numbers on a line of the built-in text


def counting_text(lang: str = "en", num_train: int = 50_000, num_dev: int = 1_000,
                  num_test: int = 1_000, max_number: int = 1_000_000,
                  seed: int = 0) -> dict[str, list[str]]:
    """Lines that count on in words (num2words language `lang`), split three ways:
    the built-in text of `train.py --task lm`.

    A line is COUNT_MIN to COUNT_MAX consecutive numbers from a start below
    `max_number`, joined by "; " (English number words have commas of their
    own: "two thousand, one hundred"). Starts are distinct, drawn as `sample_numbers`
    draws, so no dev or test line starts where a training line does. All but a
    line's first number follow from the one before, so a model that learns to
    count predicts most tokens: its loss falls far below the text's unigram
    entropy. Returns {"train", "dev", "test"} lists of lines; same seed, same text.
    """
    rng = np.random.default_rng(seed)
    starts = sample_numbers(num_train + num_dev + num_test, max_number, rng)
    counts = rng.integers(COUNT_MIN, COUNT_MAX + 1, len(starts))
    words = cardinal_words(lang, max_number + COUNT_MAX)
    lines = ["; ".join(words(int(start) + i) for i in range(count))
             for start, count in zip(starts, counts)]
    return {"test": lines[:num_test],
            "dev": lines[num_test:num_test + num_dev],
            "train": lines[num_test + num_dev:]}


def holdout_split(examples: Sequence[Example], num_dev: int, num_test: int,
                  seed: int = 0) -> dict[str, list[Example]]:
    """Split one corpus (pairs or lines) into {"train", "dev", "test"} at random (by
    `seed`). For a real corpus that comes without separate dev/test files.
    """
    if num_dev + num_test >= len(examples):
        raise CorpusError(f"cannot hold out {num_dev} dev + {num_test} test examples "
                          f"from a corpus of {len(examples)}")
    order = np.random.default_rng(seed).permutation(len(examples))
    shuffled = [examples[i] for i in order]
    return {"test": shuffled[:num_test],
            "dev": shuffled[num_test:num_test + num_dev],
            "train": shuffled[num_test + num_dev:]}


# --- User corpora -------------------------------------------------------------------------

def _check_non_empty(path: Path) -> None:
    if not path.is_file():
        raise CorpusError(f"{path} does not exist or is not a file")
    if path.stat().st_size == 0:
        raise CorpusError(f"{path} is empty")


def _check_encoding(path: Path) -> None:
    """Raise CorpusError when `path` starts like UTF-16 or UTF-32 text, not UTF-8."""
    with open(path, "rb") as f:
        problem = encoding_problem(f.read(SNIFF_BYTES), str(path))
    if problem:
        raise CorpusError(problem)


def _raw_lines(path: Path) -> Iterator[bytes]:
    """The lines of `path` as bytes, without the line ending and a leading BOM; a
    CorpusError for UTF-16 or UTF-32 text and for a line holding a NUL byte."""
    _check_encoding(path)
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            if number == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            problem = nul_problem(line, number, str(path))
            if problem:
                raise CorpusError(problem)
            yield line.rstrip(b"\r\n")


def _skip_reason(src: str, tgt: str, max_chars: int) -> str | None:
    """Why a stripped pair is unusable, or None when it is fine."""
    if not src or not tgt:
        return EMPTY
    if len(src) > max_chars or len(tgt) > max_chars:
        return TOO_LONG
    return None


def read_parallel_text(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                       max_chars: int = 1000) -> tuple[list[Pair], CorpusReport]:
    """Read two aligned files, one sentence per line, UTF-8 (`parallel_text`)."""
    report = CorpusReport(f"{src_path} | {tgt_path}")
    return _finish(list(parallel_text(src_path, tgt_path, report, max_chars)), report)


def parallel_text(src_path: str | os.PathLike, tgt_path: str | os.PathLike,
                  report: CorpusReport, max_chars: int = 1000) -> Iterator[Pair]:
    """The usable pairs of two aligned files, one sentence per line, UTF-8, as they are read.

    Raises CorpusError for a missing or empty file and, once read, for unequal line
    counts (naming both); skips and counts in `report` pairs with an empty side, a side
    over `max_chars` characters, or bytes that are not UTF-8.
    """
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    for path in (src_path, tgt_path):
        _check_non_empty(path)
    src_count = tgt_count = 0
    for line, (src_raw, tgt_raw) in enumerate(
            itertools.zip_longest(_raw_lines(src_path), _raw_lines(tgt_path)), start=1):
        src_count += src_raw is not None
        tgt_count += tgt_raw is not None
        if src_raw is None or tgt_raw is None:
            continue  # keep counting the longer file for the error below
        try:
            src, tgt = src_raw.decode("utf-8").strip(), tgt_raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            report.skip(UNDECODABLE, line)
            continue
        reason = _skip_reason(src, tgt, max_chars)
        if reason:
            report.skip(reason, line)
            continue
        report.kept += 1
        yield src, tgt
    if src_count != tgt_count:
        raise CorpusError(f"{src_path} has {src_count} lines but {tgt_path} has {tgt_count}; "
                          "parallel files must have one line per sentence pair")


def read_columns(path: str | os.PathLike, src_column: str, tgt_column: str,
                 delimiter: str | None = None,
                 max_chars: int = 1000) -> tuple[list[Pair], CorpusReport]:
    """Read a TSV/CSV file whose header row names `src_column` and `tgt_column`
    (`column_pairs`)."""
    report = CorpusReport(f"{path} [{src_column} -> {tgt_column}]")
    return _finish(list(column_pairs(path, src_column, tgt_column, report, delimiter,
                                     max_chars)), report)


def column_pairs(path: str | os.PathLike, src_column: str, tgt_column: str,
                 report: CorpusReport, delimiter: str | None = None,
                 max_chars: int = 1000) -> Iterator[Pair]:
    """The usable pairs of a TSV/CSV file whose header row names `src_column` and
    `tgt_column`, as they are read.

    The delimiter defaults to a tab for *.tsv / *.tab and a comma otherwise.
    TSV is read without quoting (a stray `"` inside a sentence stays text), CSV
    with standard quoting. Raises CorpusError for a missing or empty file and a
    missing column (naming the columns there are); skips and counts in `report` rows
    that are short, empty, too long or not UTF-8. Line numbers in the report count
    the header as line 1.
    """
    path = Path(path)
    _check_non_empty(path)
    if delimiter is None:
        delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    _check_encoding(path)
    # surrogateescape keeps bad bytes as lone surrogates, so one bad row is skipped
    # instead of the whole file failing to decode.
    with open(path, newline="", encoding="utf-8", errors="surrogateescape") as f:
        reader = csv.DictReader(f, delimiter=delimiter, quoting=quoting)
        columns = reader.fieldnames or []
        for column in (src_column, tgt_column):
            if column not in columns:
                raise CorpusError(f"{path} has no column {column!r}; its columns are "
                                  f"{', '.join(map(repr, columns))}")
        try:
            for row in reader:
                line = reader.line_num
                src, tgt = row[src_column], row[tgt_column]
                if src is None or tgt is None:
                    report.skip(MALFORMED_ROW, line)
                    continue
                problem = nul_problem(src + tgt, line, str(path))
                if problem:
                    raise CorpusError(problem)
                if not (_is_utf8(src) and _is_utf8(tgt)):
                    report.skip(UNDECODABLE, line)
                    continue
                src, tgt = src.strip(), tgt.strip()
                reason = _skip_reason(src, tgt, max_chars)
                if reason:
                    report.skip(reason, line)
                    continue
                report.kept += 1
                yield src, tgt
        except csv.Error as e:
            raise CorpusError(f"{path}, line {reader.line_num}: {e}") from e


def read_text(path: str | os.PathLike, max_chars: int = 1000) -> tuple[list[str], CorpusReport]:
    """Read a text file for a language model, one example per line (`text_lines`)."""
    report = CorpusReport(str(path), unit="lines")
    return _finish(list(text_lines(path, report, max_chars)), report)


def text_lines(path: str | os.PathLike, report: CorpusReport,
               max_chars: int = 1000) -> Iterator[str]:
    """The usable lines of a text file for a language model, one example (a sentence, a
    paragraph) per line, UTF-8, as they are read.

    Raises CorpusError for a missing or empty file; skips and counts in `report` empty
    lines, lines over `max_chars` characters, and lines with bytes that are not UTF-8.
    """
    path = Path(path)
    _check_non_empty(path)
    for number, raw in enumerate(_raw_lines(path), start=1):
        try:
            text = raw.decode("utf-8").strip()
        except UnicodeDecodeError:
            report.skip(UNDECODABLE, number)
            continue
        reason = EMPTY if not text else TOO_LONG if len(text) > max_chars else None
        if reason:
            report.skip(reason, number)
            continue
        report.kept += 1
        yield text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from surrogateescape: a bad byte
        return False
    return True


def _finish(examples: list[Example],
            report: CorpusReport) -> tuple[list[Example], CorpusReport]:
    if not examples:
        raise CorpusError(no_usable(report))
    return examples, report


def no_usable(report: CorpusReport) -> str:
    """The error for a corpus of which nothing was kept."""
    return f"{report}: no usable " + ("sentence pair" if report.unit == "pairs" else "line")
