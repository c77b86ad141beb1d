"""Attention masks: boolean, True = may attend, shaped to broadcast as (B, H, Tq, Tk)."""

import jax.numpy as jnp


def padding_mask(ids, pad_id: int):
    """(B, L) ids -> (B, 1, 1, L): every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int):
    """(1, 1, L, L): query i may attend to keys 0..i."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]

