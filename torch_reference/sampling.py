"""Sampling a token per row from logits, in PyTorch: the scheme of transformer_core.generation.

The reference for jax_transformer/sampling.py: same steps, same order, same
dtypes, so that both frameworks turn the same logits and uniforms into the
same tokens.

    draws, static = prepare(settings, batch_size, steps, vocab_size, device)
    ids = sample_ids(logits, u, *draws[1:], **static)
"""

from __future__ import annotations

import numpy as np
import torch

from transformer_core.generation import Sampling


def prepare(settings: Sampling, batch_size: int, steps: int, vocab_size: int, device,
            uniforms=None):
    """(draws, static) for a search: draws = (uniforms (B, steps) float64,
    1 / temperature, top_p), or None when greedy; static = k (how many best
    tokens top-k keeps) and whether top-p cuts. `uniforms` defaults to
    settings.uniforms(batch_size, steps)."""
    if settings.greedy:
        return None, dict(k=0, nucleus=False)
    uniforms = settings.uniforms(batch_size, steps) if uniforms is None else np.asarray(uniforms)
    if uniforms.shape != (batch_size, steps):
        raise ValueError(f"uniforms must have shape {(batch_size, steps)}, got {uniforms.shape}")
    draws = (torch.as_tensor(uniforms, device=device), 1.0 / settings.temperature,
             float(settings.top_p))
    return draws, dict(k=settings.kept(vocab_size), nucleus=settings.top_p < 1)


def top_k(x, k: int):
    """Like jax.lax.top_k along the last axis: ties go to the lowest index."""
    values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def sample_ids(logits, u, inverse_temperature, top_p, *, k: int, nucleus: bool):
    """logits (B, V), uniforms u (B,) -> sampled token ids (B,) int64.

    In the compute dtype promote(logits, float32), u, 1/temperature and top_p
    cast to it: scale (the best logit at 0, 1/temperature at most the dtype's
    largest number), keep the k best (ties to the lower id), softmax,
    cumulative sums; top-p keeps token i while the mass before it is < top_p;
    the first kept token whose cumulative sum exceeds u * (the kept mass) wins.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)
    x = logits.to(dtype)
    inverse = torch.tensor(inverse_temperature, dtype=dtype, device=logits.device).clamp(
        max=torch.finfo(dtype).max)
    x = (x - x.max(dim=-1, keepdim=True).values) * inverse  # <= 0: no overflow to +inf
    values, order = top_k(x, k)  # (B, K), best first
    cdf = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)  # (B, K)
    kept = torch.full(cdf.shape[:1], k, device=cdf.device)  # (B,)
    if nucleus:
        threshold = torch.tensor(top_p, dtype=dtype, device=cdf.device)
        kept = 1 + torch.sum(cdf[:, :-1] < threshold, dim=-1)
    mass = cdf.gather(-1, kept[:, None] - 1)  # (B, 1)
    choice = torch.sum(cdf <= u.to(dtype)[:, None] * mass, dim=-1)  # (B,)
    choice = torch.minimum(choice, kept - 1)  # u * mass may round up to mass
    return order.gather(-1, choice[:, None])[:, 0]
