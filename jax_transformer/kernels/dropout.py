"""Dropout, and an activation followed by dropout (the FFN's inner step).

    activation_dropout(h, activation, dropout) = dropout(activation(h))

The tuned version, for ReLU in training, is `relu_dropout`: the same values and
gradients, with a backward pass that needs no mask (below). Other activations,
and eval mode, take the plain path.

`Dropout` is nnx.Dropout plus `keep_mask`, which draws the mask nnx.Dropout
would draw for the same input (same key from the same stream, same bernoulli
call), for layers that apply it themselves.

`relu_dropout(h, keep, rate)` is dropout(relu(h)) with the same values and the
same gradient as autodiff gives, computed from the output alone:
    y = keep ? relu(h) / (1 - rate) : 0
    dh = dy / (1 - rate) where y > 0 (that is, where keep and h > 0), else 0.
Autodiff's backward instead needs the mask again and h. Where XLA lowers
threefry unrolled (GPU, TPU) it may recompute the mask (the hash of every
element) in the backward pass rather than keep it; on CPU it keeps it. y is
kept anyway (the next matmul's weight gradient reads it), so this backward
reads nothing extra.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from jax_transformer.kernels import switch


class Dropout(nnx.Dropout):
    def keep_mask(self, inputs) -> jax.Array | None:
        """The keep mask (bool, inputs' shape) this layer would apply to `inputs`, or
        None when it would return them unchanged (eval mode, rate 0)."""
        if self.deterministic or self.rate == 0.0:
            return None
        if self.broadcast_dims:
            raise NotImplementedError("Dropout.keep_mask with broadcast_dims")
        rngs = self.rngs
        key = rngs[self.rng_collection]() if isinstance(rngs, nnx.Rngs) else rngs()
        return jax.random.bernoulli(key, p=1.0 - self.rate, shape=inputs.shape,
                                    out_sharding=jax.typeof(inputs).sharding)


def _relu_then_dropout(h, keep, rate):  # as nnx.Dropout applies its mask
    return jax.lax.select(keep, jax.nn.relu(h) / (1.0 - rate), jnp.zeros_like(h))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def relu_dropout(h, keep, rate: float):
    """dropout(relu(h)) with the mask `keep` (bool, h's shape)."""
    return _relu_then_dropout(h, keep, rate)


def _relu_dropout_fwd(h, keep, rate):
    y = _relu_then_dropout(h, keep, rate)
    return y, y


def _relu_dropout_bwd(rate, y, dy):
    dh = jax.lax.select(y > 0, dy / (1.0 - rate), jnp.zeros_like(dy))
    return dh, None


relu_dropout.defvjp(_relu_dropout_fwd, _relu_dropout_bwd)


def activation_dropout_plain(h, activation, dropout: Dropout):
    return dropout(activation(h))


def activation_dropout_fused(h, activation, dropout: Dropout):
    keep = dropout.keep_mask(h) if activation is jax.nn.relu else None
    if keep is None:
        return dropout(activation(h))
    return relu_dropout(h, keep, dropout.rate)


activation_dropout = switch.kernel("activation_dropout", plain=activation_dropout_plain,
                                   tuned=activation_dropout_fused)
