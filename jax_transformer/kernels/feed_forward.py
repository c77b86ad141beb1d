"""The position-wise feed-forward network's inner steps:

    feed_forward(x, W_1, W_2, activation, dropout) = W_2(dropout(activation(W_1(x))))

The tuned version runs them on the positions as rows, x (B, L, D) -> (B*L, D):
the dropout output then feeds W_2's matmul as it is, and XLA keeps it for
W_2's weight gradient rather than recomputing the dropout (its mask hash
included) inside that gradient's transpose (docs/performance.md, "What made the JAX
step fast").
"""

from __future__ import annotations

from jax_transformer.kernels import switch
from jax_transformer.kernels.dropout import activation_dropout


def feed_forward_plain(x, W_1, W_2, activation, dropout):
    return W_2(activation_dropout(W_1(x), activation, dropout))


def feed_forward_rows(x, W_1, W_2, activation, dropout):  # (B, L, D) -> (B, L, D)
    rows = x.reshape(-1, x.shape[-1])  # (B*L, D)
    return feed_forward_plain(rows, W_1, W_2, activation, dropout).reshape(x.shape)


feed_forward = switch.kernel("feed_forward", plain=feed_forward_plain, tuned=feed_forward_rows)
