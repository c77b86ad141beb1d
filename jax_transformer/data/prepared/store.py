"""Sentences as flat arrays: one side of a split, in memory or memory-mapped from disk.

    NAME.ids       every sentence's values one after another (token ids: uint16 for a
                   vocabulary of up to 65,536 pieces, else int32; raw UTF-8: uint8)
    NAME.offsets   (n + 1,) int64: sentence i is ids[offsets[i]:offsets[i + 1]]
    NAME.lengths   (n,) uint16: each sentence's length, all a batch plan needs

As fairseq's binarized datasets (`fairseq-preprocess`, MMapIndexedDataset): a
training process keeps only the lengths in memory (2 bytes a sentence) and
gathers each batch's sentences from the map. A disk store maps its files for each
gather and unmaps them after, so the pages it read stay in the page cache, not in
the process's resident memory. A store on disk is checked without reading it whole:
its files' sizes (`check_sizes`), and the ids of each gather against the vocabulary
(`vocab_size`); a damaged file is a CorpusError naming it. Needs numpy (and
data/corpora.py's CorpusError).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from jax_transformer.data.corpora import CorpusError

MAX_LENGTH = np.iinfo(np.uint16).max  # the longest sentence a store holds
FINGERPRINT_CHUNK = 10_000  # sentences a fingerprint hashes at a time (its definition)


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest type that holds every id of a vocabulary of `vocab_size` pieces."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32)


class TokenStore:
    """One side of a split: `len(store)` sentences, `store[i]` one of them, `gather` many.

    `lengths` ((n,) uint16) is in memory; the values are an array (`in_memory`) or the
    files DIR/NAME.* (`open`). `bytes_read` counts the bytes of values and offsets
    that gathers asked for: what this process read of the store. A store opened with a
    `vocab_size` holds token ids, each gather checked to lie in [0, vocab_size)."""

    def __init__(self, lengths: np.ndarray, values: np.ndarray | None = None,
                 offsets: np.ndarray | None = None, path: Path | None = None,
                 dtype: np.dtype | None = None, vocab_size: int | None = None):
        self.lengths, self._values, self._offsets, self.path = lengths, values, offsets, path
        self.dtype = np.dtype(dtype if dtype is not None else values.dtype)
        self.vocab_size = vocab_size
        self.bytes_read = 0

    @classmethod
    def in_memory(cls, sentences: Sequence[np.ndarray], dtype=np.int32) -> "TokenStore":
        """A store of `sentences` (1-d arrays), held in memory."""
        lengths = np.fromiter((len(x) for x in sentences), np.int64, len(sentences))
        if len(lengths) and lengths.max() > MAX_LENGTH:
            raise ValueError(f"a sentence of {lengths.max()} values is longer than a store "
                             f"holds ({MAX_LENGTH})")
        offsets = np.zeros(len(sentences) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = (np.concatenate(sentences).astype(dtype, copy=False) if len(sentences)
                  else np.zeros(0, dtype))
        return cls(lengths.astype(np.uint16), values, offsets)

    @classmethod
    def open(cls, directory: Path, name: str, dtype: np.dtype,
             vocab_size: int | None = None) -> "TokenStore":
        """DIR/NAME.*, as StoreWriter wrote them; only the lengths are read now."""
        path = Path(directory) / name
        return cls(np.fromfile(f"{path}.lengths", np.uint16), path=path, dtype=dtype,
                   vocab_size=vocab_size)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.gather(np.array([i]))

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """The sentences at `indices`, one after another, as one flat array."""
        indices = np.asarray(indices, np.int64)
        lengths = self.lengths[indices].astype(np.int64)  # (k,)
        starts_in_out = np.cumsum(lengths) - lengths  # (k,) each sentence's start in the output
        with self._mapped() as (values, offsets):
            starts = np.asarray(offsets[indices])  # (k,)
            # One index per value: its sentence's start in the store, plus its place in it.
            index = np.repeat(starts - starts_in_out, lengths) + np.arange(lengths.sum())
            out = np.asarray(values[index])
        if self.vocab_size is not None and out.size and (
                out.max() >= self.vocab_size or out.min() < 0):
            raise self._outside_vocabulary(out, indices, lengths)
        self.bytes_read += out.nbytes + 8 * len(indices)
        return out

    def _outside_vocabulary(self, out: np.ndarray, indices: np.ndarray,
                            lengths: np.ndarray) -> CorpusError:
        """The error for `out`, the sentences at `indices` (of `lengths`) one after
        another, which hold an id outside the vocabulary: naming the first and its sentence."""
        at = int(np.argmax((out >= self.vocab_size) | (out < 0)))
        sentence = indices[np.searchsorted(np.cumsum(lengths), at, side="right")]
        return damaged(f"{self.path}.ids", f"holds id {out[at]} in sentence {sentence}, outside "
                       f"the vocabulary of {self.vocab_size} pieces")

    def each(self, indices: np.ndarray) -> list[bytes]:
        """The sentences at `indices`, each as its bytes, read one at a time (a disk store:
        os.pread, no map, so a random read of many leaves nothing resident)."""
        item = self.dtype.itemsize
        if self.path is None:
            return [self[i].tobytes() for i in indices]
        with self._mapped() as (_, offsets):
            starts = offsets[np.asarray(indices, np.int64)].tolist()
        lengths = self.lengths[indices].tolist()
        fd = os.open(f"{self.path}.ids", os.O_RDONLY)
        try:
            sentences = [os.pread(fd, n * item, start * item) for start, n in zip(starts, lengths)]
        finally:
            os.close(fd)
        self.bytes_read += sum(map(len, sentences)) + 8 * len(sentences)
        return sentences

    def chunks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(lengths, values) of `size` sentences at a time, in order, read sequentially
        (a disk store reads its files, mapping nothing)."""
        with self._mapped(memory_map=False) as (values, offsets):
            for start in range(0, len(self), size):
                stop = min(start + size, len(self))
                first, last = int(offsets[start]), int(offsets[stop])
                yield self.lengths[start:stop], values(first, last)

    def _mapped(self, memory_map: bool = True):
        return _Mapped(self, memory_map)


class _Mapped:
    """A store's (values, offsets): its arrays, or its files mapped for one use (or,
    with memory_map False, values as a function (first, last) -> array read from disk)."""

    def __init__(self, store: TokenStore, memory_map: bool):
        self.store, self.memory_map, self.file = store, memory_map, None

    def __enter__(self):
        store = self.store
        if store.path is None:
            values = store._values
            return (values if self.memory_map else lambda a, b: values[a:b]), store._offsets
        offsets = np.memmap(f"{store.path}.offsets", np.int64, mode="r")
        if self.memory_map:
            values = (np.memmap(f"{store.path}.ids", store.dtype, mode="r")
                      if offsets[-1] else np.zeros(0, store.dtype))
            return values, offsets
        self.file = open(f"{store.path}.ids", "rb")
        item = store.dtype.itemsize

        def read(first: int, last: int) -> np.ndarray:
            self.file.seek(first * item)
            return np.fromfile(self.file, store.dtype, last - first)
        return read, offsets

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.file.close()


def check_sizes(directory: Path, name: str, dtype: np.dtype, count: int) -> None:
    """A CorpusError naming the file unless DIR/NAME.* have the sizes of a store of `count`
    sentences of `dtype` values: the lengths and offsets `count`'s, the values those the
    last offset ends at. Reads 8 bytes: a truncated or extended file is found, values
    overwritten in place are not (gather's vocabulary check finds those)."""
    path = Path(directory) / name
    for suffix, item, entries in (("lengths", 2, count), ("offsets", 8, count + 1)):
        size = os.path.getsize(f"{path}.{suffix}")
        if size != item * entries:
            raise damaged(f"{path}.{suffix}", f"is {size} bytes, not {item * entries} (the "
                          f"{suffix} of its {count} sentences)")
    end = int(np.fromfile(f"{path}.offsets", np.int64, count=1, offset=8 * count)[0])
    dtype = np.dtype(dtype)
    size = os.path.getsize(f"{path}.ids")
    if size != end * dtype.itemsize:
        raise damaged(f"{path}.ids", f"is {size} bytes, not {end * dtype.itemsize} (the {end} "
                      f"{dtype.name} values its offsets end at)")


def damaged(file: str | os.PathLike, why: str) -> CorpusError:
    """The error for `file` of a prepared directory, not as the preparation wrote it: the
    directory must be prepared anew (jaxformer-prepare keeps one whose sizes and key are
    right, and a run reuses it)."""
    directory = Path(file).parent
    return CorpusError(f"{file} {why}: {directory} is damaged; remove it and prepare it again")


class StoreWriter:
    """Writes DIR/NAME.* a batch of sentences at a time (`add`), in order."""

    def __init__(self, directory: Path, name: str, dtype: np.dtype):
        self.path, self.dtype = Path(directory) / name, np.dtype(dtype)
        self.values = open(f"{self.path}.ids", "wb")
        self.offsets = open(f"{self.path}.offsets", "wb")
        self.lengths = open(f"{self.path}.lengths", "wb")
        self.end = 0  # values written so far
        np.zeros(1, np.int64).tofile(self.offsets)

    def add(self, lengths: np.ndarray, values: np.ndarray) -> None:
        """Sentences of these `lengths`, their `values` one after another."""
        lengths = np.asarray(lengths, np.int64)
        if len(lengths) and lengths.max() > MAX_LENGTH:
            raise ValueError(f"a sentence of {lengths.max()} values is longer than a store "
                             f"holds ({MAX_LENGTH})")
        np.asarray(values, self.dtype).tofile(self.values)
        (self.end + np.cumsum(lengths)).tofile(self.offsets)
        lengths.astype(np.uint16).tofile(self.lengths)
        self.end += int(lengths.sum())

    def close(self) -> None:
        for f in (self.values, self.offsets, self.lengths):
            f.flush()
            os.fsync(f.fileno())
            f.close()


def fingerprint(sides: Sequence[TokenStore | None]) -> str:
    """A digest of the sentences of each side, in order (16 hex digits): each
    FINGERPRINT_CHUNK sentences' lengths (int64) then their ids (int32), side after side.
    A training run's saved data position is valid only for data of the same digest."""
    digest = hashlib.sha256()
    for store in sides:
        if store is None:
            continue
        for lengths, values in store.chunks(FINGERPRINT_CHUNK):
            digest.update(lengths.astype(np.int64).tobytes())
            digest.update(values.astype(np.int32).tobytes())
    return digest.hexdigest()[:16]
