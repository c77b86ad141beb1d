"""Dropout's keep mask, and an activation followed by dropout (the FFN's inner step).

    draw_keep_mask(key, keep_prob, shape, sharding) -> bool mask, True = keep
    activation_dropout(h, activation, dropout) = dropout(activation(h))

`draw_keep_mask` (kernel "dropout_mask") has two generators, both drawing from
the key the layer takes from its nnx stream, so the same key gives the same mask
and a resumed run draws the masks it would have drawn:
- plain, `keep_mask_threefry`: nnx.Dropout's own draw (bernoulli with the
  stream's threefry key), the default on TPU.
- tuned, `keep_mask_hash`: a counter hash. Each element's flat index is mixed
  with 64 bits drawn from that key by two rounds of murmur3's finaliser and
  compared with a threshold: P(keep) = keep_prob to 2^-32. It is element-wise,
  so XLA fuses it into the mask's consumers and no random bits are written to
  memory (threefry's are, on XLA:CPU). Other masks from the same distribution;
  the default on CPU and GPU (switch.py says where, docs/performance.md why).

`Dropout` is nnx.Dropout with its mask from `draw_keep_mask`; `keep_mask` gives
that mask, for layers that apply it themselves. With the plain generator its
outputs are nnx.Dropout's, bit for bit.

The tuned activation_dropout, for ReLU in training, is `relu_dropout`: the same
values and gradients, with a backward pass that needs no mask (below). Other
activations, and eval mode, take the plain path.

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


def keep_mask_threefry(key, keep_prob: float, shape, sharding=None):
    """nnx.Dropout's draw: bernoulli with `key` itself."""
    return jax.random.bernoulli(key, p=keep_prob, shape=shape, out_sharding=sharding)


def _mix(h):
    """murmur3's 32-bit finaliser: a bijection of uint32 in which every input bit
    flips every output bit with probability ~1/2."""
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def keep_mask_hash(key, keep_prob: float, shape, sharding=None):
    """bernoulli from a counter hash: each element's flat index, mixed with 64 bits
    drawn from `key`, compared with keep_prob's threshold."""
    if keep_prob <= 0.0:
        return jnp.zeros(shape, jnp.bool_)
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index, stride = jnp.zeros((), jnp.uint32), 1  # the flat (row-major) index, as uint32
    for axis in reversed(range(len(shape))):
        iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis, out_sharding=sharding)
        index, stride = index + iota * jnp.uint32(stride % 2 ** 32), stride * shape[axis]
    bits = _mix(_mix(index * jnp.uint32(0x9E3779B9) + seed[0]) ^ seed[1])
    dropped = min(round((1.0 - keep_prob) * 2 ** 32), 2 ** 32 - 1)  # P(bits < dropped)
    return bits >= jnp.uint32(dropped)


draw_keep_mask = switch.kernel("dropout_mask", plain=keep_mask_threefry, tuned=keep_mask_hash)


class Dropout(nnx.Dropout):
    """nnx.Dropout with its mask from `draw_keep_mask`. Called as the model calls it,
    on inputs alone: the mode comes from the constructor or nnx.view, the key from
    the layer's own stream."""

    def __call__(self, inputs):
        if self.rate == 1.0 and not self.deterministic:
            return jnp.zeros_like(inputs)  # as nnx.Dropout: no 0 * inf in the gradient
        keep = self.keep_mask(inputs)
        if keep is None:
            return inputs
        return jax.lax.select(keep, inputs / (1.0 - self.rate), jnp.zeros_like(inputs))

    def keep_mask(self, inputs) -> jax.Array | None:
        """The keep mask (bool, inputs' shape) this layer would apply to `inputs`, or
        None when it would return them unchanged (eval mode, rate 0)."""
        if self.deterministic or self.rate == 0.0:
            return None
        rngs = self.rngs
        key = rngs[self.rng_collection]() if isinstance(rngs, nnx.Rngs) else rngs()
        shape = list(inputs.shape)
        for axis in self.broadcast_dims:
            shape[axis] = 1  # one draw along these axes
        keep = draw_keep_mask(key, 1.0 - self.rate, shape, jax.typeof(inputs).sharding)
        return jnp.broadcast_to(keep, inputs.shape)


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
