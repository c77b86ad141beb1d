"""Training maths, mirroring jax_transformer/training.py."""

from __future__ import annotations

import torch.nn.functional as F


def label_smoothed_cross_entropy(logits, labels, pad_id: int, smoothing: float = 0.1):
    """Cross-entropy against (1 - smoothing) * one_hot + smoothing / V, summed over
    the non-pad labels. Returns (loss_sum, num_tokens); the loss is their ratio.

    logits (B, T, V), labels (B, T).
    """
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=pad_id, label_smoothing=smoothing, reduction="sum")
    return loss_sum, (labels != pad_id).sum()
