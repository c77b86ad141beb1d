"""The sinusoidal position table (Vaswani et al. 2017, section 3.5), in float64 numpy."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def sinusoidal_positions(length: int, d_model: int, layout: str) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...): (length, D) float64.

    "interleaved" puts sin/cos in even/odd columns (the paper); "half_split"
    puts all sines first, then all cosines (Marian). Read-only: it is cached.
    """
    position = np.arange(length, dtype=np.float64)[:, None]  # (L, 1)
    angle = position / 10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    sin, cos = np.sin(angle), np.cos(angle[:, : d_model // 2])  # (L, ceil(D/2)), (L, D//2)
    table = np.zeros((length, d_model))
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = sin, cos
    else:
        table[:, : sin.shape[1]], table[:, sin.shape[1]:] = sin, cos
    table.flags.writeable = False
    return table  # (L, D)
