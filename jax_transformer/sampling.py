"""Sampling a token per row from logits, in JAX: the scheme of transformer_core.generation.

Read it side by side with torch_reference/sampling.py: same steps, same order,
same dtypes, so that both frameworks turn the same logits and uniforms into the
same tokens.

    draws, static = prepare(settings, batch_size, steps, vocab_size)  # outside jit
    ids = sample_ids(logits, u, *draws[1:], **static)                 # inside it
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer_core.generation import Sampling


def prepare(settings: Sampling, batch_size: int, steps: int, vocab_size: int, uniforms=None):
    """(draws, static) for a jit-compiled search: draws = (uniforms (B, steps),
    1 / temperature, top_p), traced, or None when greedy; static = the settings
    that fix the compiled program (k, how many best tokens top-k keeps, and
    whether top-p cuts). `uniforms`
    defaults to settings.uniforms(batch_size, steps)."""
    if settings.greedy:
        return None, dict(k=0, nucleus=False)
    uniforms = settings.uniforms(batch_size, steps) if uniforms is None else np.asarray(uniforms)
    if uniforms.shape != (batch_size, steps):
        raise ValueError(f"uniforms must have shape {(batch_size, steps)}, got {uniforms.shape}")
    # 1 / temperature as the traced argument holds it (float32 unless x64 is on): a larger
    # number would become inf there, with numpy's overflow warning on stderr.
    inverse = min(1.0 / settings.temperature, float(np.finfo(jnp.result_type(float)).max))
    draws = (jnp.asarray(uniforms), inverse, float(settings.top_p))
    return draws, dict(k=settings.kept(vocab_size), nucleus=settings.top_p < 1)


def sample_ids(logits, u, inverse_temperature, top_p, *, k: int, nucleus: bool):
    """logits (B, V), uniforms u (B,) -> sampled token ids (B,) int32.

    In the compute dtype promote(logits, float32), u, 1/temperature and top_p
    cast to it: scale (the best logit at 0, 1/temperature at most the dtype's
    largest number), keep the k best (ties to the lower id), softmax,
    cumulative sums; top-p keeps token i while the mass before it is < top_p;
    the first kept token whose cumulative sum exceeds u * (the kept mass) wins.
    """
    dtype = jnp.promote_types(logits.dtype, jnp.float32)
    x = logits.astype(dtype)
    inverse = jnp.minimum(jnp.asarray(inverse_temperature).astype(dtype), jnp.finfo(dtype).max)
    x = (x - jnp.max(x, axis=-1, keepdims=True)) * inverse  # <= 0: no overflow to +inf
    values, order = jax.lax.top_k(x, k)  # (B, K), best first
    cdf = jnp.cumsum(jax.nn.softmax(values, axis=-1), axis=-1)  # (B, K)
    kept = jnp.full(cdf.shape[:1], k)  # (B,)
    if nucleus:
        kept = 1 + jnp.sum(cdf[:, :-1] < jnp.asarray(top_p).astype(dtype), axis=-1)
    mass = jnp.take_along_axis(cdf, kept[:, None] - 1, axis=-1)  # (B, 1)
    choice = jnp.sum(cdf <= u.astype(dtype)[:, None] * mass, axis=-1)  # (B,)
    choice = jnp.minimum(choice, kept - 1)  # u * mass may round up to mass
    return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)
