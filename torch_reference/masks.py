"""Attention masks: boolean, True = may attend, shaped to broadcast as (B, H, Tq, Tk).

torch.nn.MultiheadAttention's boolean masks mean the opposite (True = NOT
allowed); convert at that boundary only.
"""

import torch


def padding_mask(ids, pad_id: int):
    """(B, L) ids -> (B, 1, 1, L): every query may attend to the non-pad keys."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device=None):
    """(1, 1, L, L): query i may attend to keys 0..i."""
    return torch.tril(torch.ones(length, length, dtype=torch.bool, device=device))[None, None]

