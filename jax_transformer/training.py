"""Training maths: label-smoothed loss, the paper's schedule, Adam, jit steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def label_smoothed_cross_entropy(logits, labels, pad_id: int, smoothing: float = 0.1):
    """Cross-entropy against (1 - smoothing) * one_hot + smoothing / V, summed over
    the non-pad labels. Returns (loss_sum, num_tokens); the loss is their ratio.

    logits (B, T, V), labels (B, T). Same definition as torch's
    F.cross_entropy(label_smoothing=..., ignore_index=pad_id).
    """
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    targets = optax.smooth_labels(jax.nn.one_hot(labels, logits.shape[-1], dtype=logits.dtype),
                                  smoothing)
    per_token = optax.softmax_cross_entropy(logits, targets)  # (B, T)
    weights = labels != pad_id
    return jnp.sum(per_token * weights), jnp.sum(weights)
