"""The sinusoidal position table (Vaswani et al. 2017, section 3.5), in float64 numpy."""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from transformer_core.config import TransformerConfig


@functools.lru_cache(maxsize=None)
def sinusoidal_positions(length: int, d_model: int, layout: str) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...): (length, D) float64.

    "interleaved" puts sin/cos in even/odd columns (the paper); "half_split"
    puts all sines first, then all cosines (Marian). "fairseq" (fairseq,
    FSMT, M2M100) is sines then cosines of pos * exp(-i log(10000) / (D//2 - 1)),
    i < D//2, with a zero last column when D is odd. Read-only: it is cached.
    """
    position = np.arange(length, dtype=np.float64)[:, None]  # (L, 1)
    table = np.zeros((length, d_model))
    if layout == "fairseq":
        half = d_model // 2
        angle = position * np.exp(np.arange(half) * -(math.log(10000.0) / (half - 1)))
        table[:, :half], table[:, half: 2 * half] = np.sin(angle), np.cos(angle)
        table.flags.writeable = False
        return table  # (L, D)
    angle = position / 10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    sin, cos = np.sin(angle), np.cos(angle[:, : d_model // 2])  # (L, ceil(D/2)), (L, D//2)
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = sin, cos
    else:
        table[:, : sin.shape[1]], table[:, sin.shape[1]:] = sin, cos
    table.flags.writeable = False
    return table  # (L, D)


def half_split_order(d_model: int) -> np.ndarray:
    """The interleaved layout's columns in half_split order, the even ones (sines) then
    the odd ones (cosines): sinusoidal_positions(L, D, "half_split") equals
    sinusoidal_positions(L, D, "interleaved")[:, half_split_order(D)]. (D,) int."""
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


def position_rows(config: TransformerConfig) -> np.ndarray:
    """What both models add to the embeddings under position_encoding "sinusoidal":
    row p is position p's sinusoid,
    row p + `position_offset` of a (max_len + offset)-row table. (max_len, D),
    read-only. fairseq numbers positions from pad_id + 1 (its rows up to the pad
    row, which it zeroes, are never read for a real token)."""
    offset = config.position_offset
    return sinusoidal_positions(config.max_len + offset, config.d_model,
                                config.position_layout)[offset:]
