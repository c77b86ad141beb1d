"""A corpus as a preparation first reads it (pipeline.py): raw UTF-8 stores on disk, one
per source and side, and the splits held out of them.

    Corpus, Source   what to read: the sources of the splits, how many to hold out
    read_splits      each source read once, streaming, with corpora.py's bad-data policy;
                     dev and test held out of the training source as
                     corpora.holdout_split holds them out (or given whole)
    RawSplit         a split: rows of the raw stores, in the split's order
    write_examples   a held-out split as JSON text, to decode and score

Needs numpy alone.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from jax_transformer.data.corpora import CorpusError, CorpusReport, no_usable
from jax_transformer.data.prepared import encode_worker
from jax_transformer.data.prepared.directory import SPLITS
from jax_transformer.data.prepared.store import StoreWriter, TokenStore
from transformer_core.progress import progress_bar

READ_CHUNK = 10_000  # examples written to the raw stores at a time
Log = Callable[[str], None]


def given(examples: Sequence, report: CorpusReport) -> Iterator:
    """A Source's `read` of examples made in memory (the built-in corpora): all usable."""
    for example in examples:
        report.kept += 1
        yield example


@dataclasses.dataclass
class Source:
    """One stream of examples: `read(report)` yields the usable ones (sentence pairs or
    lines), counting what it skips in `report`; `files` are the files it reads."""
    read: Callable[[CorpusReport], Iterable]
    report: CorpusReport
    files: tuple[str, ...] = ()


@dataclasses.dataclass
class Corpus:
    """What to prepare: the training source, dev and test sources when given, and how
    many examples to hold out of the training source for the others.

    `held_out(available, given)` -> (dev, test) examples to hold out of the `available`
    usable training examples (none for a split in `given`); None: the splits are given
    whole (the built-in corpora), in their order. `settings` are what identify the corpus
    besides the files' contents (train.py's data flags), recorded in the key."""
    unit: str  # "pairs" (translation) or "lines" (a language model)
    train: Source
    settings: dict
    dev: Source | None = None
    test: Source | None = None
    held_out: Callable[[int, tuple[str, ...]], tuple[int, int]] | None = None

    @property
    def sides(self) -> tuple[str, ...]:
        return ("src", "tgt") if self.unit == "pairs" else ("tgt",)

    @property
    def files(self) -> list[str]:
        return [f for source in (self.train, self.dev, self.test) if source
                for f in source.files]


@dataclasses.dataclass
class RawSplit:
    """A split's examples as raw UTF-8: row `index[i]` of the stores is example i; the
    stores are raw/NAME.SIDE.* (held-out splits share the training split's)."""
    name: str
    stores: dict[str, TokenStore]  # side -> store
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.index)

    def texts(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[str, ...]]:
        """Examples start..stop as tuples of their sides' texts."""
        index = self.index[start:stop]
        for first in range(0, len(index), READ_CHUNK):
            rows = index[first:first + READ_CHUNK]
            yield from zip(*(encode_worker.texts_of(store, rows)
                             for store in self.stores.values()))


def read_splits(directory: Path, corpus: Corpus, seed: int, say: Log, progress: bool
                 ) -> dict[str, RawSplit]:
    """Every source read into DIRECTORY/SPLIT.SIDE.*; the splits (dev and test held out of
    the training source with `seed`, unless given); each source's report said."""
    directory.mkdir()
    stores = {}
    for split in SPLITS:
        source = getattr(corpus, split)
        if source is not None:
            stores[split] = read_source(directory, split, source, corpus.sides, progress)
            if corpus.held_out is not None:
                say(f"{'corpus' if split == 'train' else split}: {source.report}")
    if corpus.held_out is None:  # made whole, in order (the built-in corpora): one line
        say(f"corpus: {corpus.train.report.source}, " + ", ".join(
            f"{split} {len(stores[split]['tgt'])}" for split in ("test", "dev", "train")))
        return {split: RawSplit(split, s, np.arange(len(s["tgt"]))) for split, s in
                stores.items()}
    train = stores["train"]
    available = len(train["tgt"])
    num_dev, num_test = corpus.held_out(available, tuple(s for s in stores if s != "train"))
    # corpora.holdout_split's order: test, dev, then the rest for training.
    order = np.random.default_rng(seed).permutation(available)
    splits = {"test": RawSplit("train", train, order[:num_test]),
              "dev": RawSplit("train", train, order[num_test:num_test + num_dev]),
              "train": RawSplit("train", train, order[num_test + num_dev:])}
    for split in ("dev", "test"):
        if split in stores:
            splits[split] = RawSplit(split, stores[split], np.arange(len(stores[split]["tgt"])))
    return splits


def read_source(directory: Path, split: str, source: Source, sides: Sequence[str],
                 progress: bool) -> dict[str, TokenStore]:
    """Read `source` once into raw stores, one per side; a CorpusError if none is usable."""
    writers = {side: StoreWriter(directory, f"{split}.{side}", np.uint8) for side in sides}
    bar = progress_bar(desc=f"read {split}", unit=f" {source.report.unit}",
                       disable=not progress, mininterval=1, delay=1)
    chunk = []

    def flush():
        for position, (side, writer) in enumerate(writers.items()):
            encoded = [(e[position] if len(sides) == 2 else e).encode("utf-8") for e in chunk]
            writer.add([len(e) for e in encoded], np.frombuffer(b"".join(encoded), np.uint8))
        bar.update(len(chunk))
        chunk.clear()

    with bar:
        for example in source.read(source.report):
            chunk.append(example)
            if len(chunk) == READ_CHUNK:
                flush()
        flush()
    for writer in writers.values():
        writer.close()
    if not source.report.kept:
        raise CorpusError(no_usable(source.report))
    return {side: TokenStore.open(directory, f"{split}.{side}", np.uint8) for side in sides}


def write_examples(path: Path, split: RawSplit) -> None:
    examples = [list(e) if len(e) == 2 else e[0] for e in split.texts()]
    path.write_text(json.dumps(examples, ensure_ascii=False) + "\n")
