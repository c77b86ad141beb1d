"""Rows: their shapes, and sentences packed into them.

    bucket_lengths, padded_length   the few lengths rows (and decoding batches) come in
    fitting_row_shape               train.py's one row shape for a corpus
    pack_rows                       best-fit decreasing: longest first, each sentence into
                                    the open row with the least target room left that
                                    holds it on both sides, else into a new row of the
                                    first row shape that fits

Needs numpy alone.
"""

from __future__ import annotations

import bisect
import collections
from typing import Iterable, Sequence

import numpy as np

from jax_transformer.data.prepared.store import TokenStore

DEFAULT_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
ROWS_CHECKED = 8  # pack_rows: open rows tried per target room before looking further
ROW_SENTENCES = 4  # average sentences a row of fitting_row_shape holds, at least


def bucket_lengths(max_len: int, buckets: Iterable[int] = DEFAULT_BUCKETS) -> list[int]:
    """The bucket lengths below `max_len`, then `max_len` itself, ascending."""
    return sorted({b for b in buckets if b < max_len} | {max_len})


def padded_length(length: int, boundaries: Sequence[int]) -> int:
    """The smallest of the ascending `boundaries` that holds `length` positions."""
    return int(boundaries[np.searchsorted(boundaries, length)])


def positions_needed(ids: Sequence[np.ndarray] | TokenStore) -> np.ndarray:
    """(n,) positions each sentence takes in a row: its pieces plus eos (or bos); uint16
    (a store's lengths are)."""
    if isinstance(ids, TokenStore):
        return ids.lengths + np.uint16(1)
    return np.fromiter((len(x) + 1 for x in ids), np.uint16, len(ids))


def pack_rows(src_needed: np.ndarray, tgt_needed: np.ndarray, order: np.ndarray,
              row_shapes: Sequence[tuple[int, int]]) -> list[tuple[int, list[int]]]:
    """Best-fit-decreasing packing: [(row shape index, example indices in row order)].

    Examples are taken longest first (by the longer side; ties in `order`'s
    order); each goes into the open row with the least target room that still
    holds it on both sides, else opens a row of the first shape that holds it.
    """
    longest = np.maximum(src_needed, tgt_needed)[order].astype(np.int32)
    longest_first = order[np.argsort(-longest, kind="stable")]
    rows: list[tuple[int, list[int]]] = []
    src_room: list[int] = []
    by_tgt_room: dict[int, list[int]] = collections.defaultdict(list)  # room -> open rows
    rooms: list[int] = []  # sorted keys of by_tgt_room with open rows
    smallest = int(min(src_needed.min(), tgt_needed.min()))
    for i in longest_first.tolist():
        s, t = int(src_needed[i]), int(tgt_needed[i])
        row = None
        for room in rooms[bisect.bisect_left(rooms, t):]:
            candidates = by_tgt_room[room]
            # The newest ROWS_CHECKED rows with this target room: bounded work per pair.
            for k in range(len(candidates) - 1, max(len(candidates) - ROWS_CHECKED, 0) - 1, -1):
                if src_room[candidates[k]] >= s:
                    row = candidates.pop(k)
                    break
            if row is not None:
                if not candidates:
                    del by_tgt_room[room]
                    rooms.remove(room)
                break
        if row is None:
            shape = next(c for c, (S, T) in enumerate(row_shapes) if S >= s and T >= t)
            row, room = len(rows), row_shapes[shape][1]
            rows.append((shape, []))
            src_room.append(row_shapes[shape][0])
        rows[row][1].append(i)
        src_room[row] -= s
        room -= t
        if room >= smallest and src_room[row] >= smallest:
            if room not in by_tgt_room:
                bisect.insort(rooms, room)
            by_tgt_room[room].append(row)
    return rows


def fitting_row_shape(src_needed: np.ndarray | None, tgt_needed: np.ndarray,
                      max_len: int) -> tuple[int, int]:
    """train.py's one row shape (S, T) for sentences needing these positions. The side
    with more tokens in all gets the shortest bucket up to `max_len` that holds its
    longest sentence and ROW_SENTENCES average ones (long rows pack tightly); the other
    side a length in proportion to its tokens, and at least its longest sentence, so
    both sides fill alike. `src_needed` None (a language model's lines): (0, T)."""
    def fit(length: float) -> int:
        return padded_length(min(length, max_len), bucket_lengths(max_len))

    if src_needed is None:
        return 0, fit(max(tgt_needed.max(), ROW_SENTENCES * tgt_needed.mean()))

    swapped = src_needed.sum() < tgt_needed.sum()
    longer, shorter = (tgt_needed, src_needed) if swapped else (src_needed, tgt_needed)
    long_length = fit(max(longer.max(), ROW_SENTENCES * longer.mean()))
    short_length = fit(max(shorter.max(), long_length * shorter.sum() / longer.sum()))
    return (short_length, long_length) if swapped else (long_length, short_length)
