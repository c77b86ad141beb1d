"""Attention masks: boolean, True = may attend, shaped to broadcast as (B, H, Tq, Tk)."""

import jax.numpy as jnp


def padding_mask(ids, pad_id: int):
    """(B, L) ids -> (B, 1, 1, L): every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int):
    """(1, 1, L, L): query i may attend to keys 0..i."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def same_segment(query_segments, key_segments):
    """Packed rows: segment ids (B, Lq) and (B, Lk), 1, 2, ... for the sequences of a
    row and 0 for padding -> (B, 1, Lq, Lk): a query may attend to the keys of its
    own sequence (pad keys hidden)."""
    return ((query_segments[:, None, :, None] == key_segments[:, None, None, :])
            & (key_segments != 0)[:, None, None, :])


def segment_masks(src_segments, tgt_segments):
    """Packed rows of sentence pairs: segment ids (B, S) and (B, T) -> the three masks
    that keep every pair to itself: src_mask (B, 1, S, S), tgt_mask (B, 1, T, T)
    (also causal), memory_mask (B, 1, T, S)."""
    tgt_mask = same_segment(tgt_segments, tgt_segments) & causal_mask(tgt_segments.shape[1])
    return (same_segment(src_segments, src_segments), tgt_mask,
            same_segment(tgt_segments, src_segments))
