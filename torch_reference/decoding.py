"""Greedy and beam search with a key/value cache, in PyTorch.

The reference for jax_transformer/decoding.py: same functions, same steps,
the shared pieces (greedy pick, sampling, log-softmax, length penalty, beam
bookkeeping, tie-breaking) in torch_reference/search.py. Here the loops are
Python loops.

    greedy_search(model, src_ids, max_len=...)          -> tokens (B, L), scores (B,)
    sample(model, src_ids, max_len=..., sampling=Sampling(temperature=0.8, top_p=0.9, seed=0))
                                                         -> tokens (B, L), scores (B,)
    beam_search(model, src_ids, max_len=..., beam_size=4, alpha=0.6)
                                                         -> tokens (B, K, L), scores (B, K)
    beam_search(..., alpha=1.0, length_penalty_style="hf")   transformers' beam search
    greedy_search_uncached(model, src_ids, max_len=...) -> the seed-style baseline

Tokens are the generated ids (the decoder's start token is not included),
ending with eos and padded with pad after it; L = max_len. Greedy and sampled
scores are sums of the model's log-probabilities (eos included; sampling's
temperature and cuts do not change them); beam scores are those sums divided
by the GNMT length penalty ((5 + length) / 6) ** alpha, best beam first (or,
with length_penalty_style="hf", transformers' length ** alpha and its rules for
which beams finish: search.beam_update).

`forced_first` (an id, or one per sentence; a negative id forces nothing) is
the first generated token, as transformers' `forced_bos_token_id` (M2M100 and
NLLB's target-language code): every search must pick it, and, as in
transformers, its log-probability counts as 0 in the scores (the logits
processor leaves it probability 1).
Sampling draws its randomness in numpy (transformer_core.generation), so both
frameworks pick the same tokens for the same seed.
The model runs in eval mode (its mode is restored afterwards).
"""

from __future__ import annotations

import torch

from torch_reference.masks import padding_mask
from torch_reference.model import Transformer
from torch_reference.search import (LENGTH_PENALTY_STYLES, beam_result, beam_state,
                                    beam_update, beams_settled, eval_mode, force_tokens,
                                    greedy_pick, length_penalty, log_softmax, prepare_sampling,
                                    sample_ids)
from transformer_core.generation import Sampling


def _prepare(model: Transformer, src_ids, src_mask, max_len: int, eos_id):
    config = model.config
    if not 0 < max_len <= config.max_len:
        raise ValueError(f"max_len must be in [1, {config.max_len}] (the model's max_len), "
                         f"got {max_len}")
    src_ids = torch.as_tensor(src_ids, dtype=torch.long, device=model.device)
    if src_mask is None:
        src_mask = padding_mask(src_ids, config.pad_id)  # (B, 1, 1, S)
    ids = dict(bos=config.bos_id, pad=config.pad_id,
               eos=config.eos_id if eos_id is None else int(eos_id))
    return src_ids, src_mask, ids


def _forced_ids(forced_first, batch_size: int, vocab_size: int, device):
    """An id or one per row (negative: none) -> (B,) int64, or None when nothing is forced."""
    if forced_first is None:
        return None
    forced = torch.as_tensor(forced_first, dtype=torch.long, device=device)
    forced = torch.broadcast_to(forced, (batch_size,))
    if (forced >= vocab_size).any():
        raise ValueError(f"forced_first ids must be below the target vocabulary size "
                         f"{vocab_size}, got {int(forced.max())}")
    return forced


# ------------------------------------------------------------------ greedy

def greedy_search(model: Transformer, src_ids, *, max_len: int, src_mask=None, eos_id=None,
                  forced_first=None):
    """Greedy decoding: (B, S) source ids -> tokens (B, max_len) int64, scores (B,).

    `eos_id` overrides the config's (-1: none, so every sentence runs max_len steps).
    """
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size,
                         src_ids.device)
    with eval_mode(model):
        return _pick(model, src_ids, src_mask, None, forced, max_len=max_len, k=0,
                     nucleus=False, **ids)


def sample(model: Transformer, src_ids, *, max_len: int, sampling: Sampling, uniforms=None,
           src_mask=None, eos_id=None, forced_first=None):
    """Sampling (temperature, top-k, top-p; see transformer_core.generation):
    (B, S) source ids -> tokens (B, max_len) int64, scores (B,). Token t of
    sentence b uses uniforms[b, t], by default sampling.uniforms(B, max_len).
    Temperature 0 is greedy_search."""
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    draws, static = prepare_sampling(sampling, src_ids.shape[0], max_len,
                                     model.config.tgt_vocab_size, model.device, uniforms)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size,
                         src_ids.device)
    with eval_mode(model):
        return _pick(model, src_ids, src_mask, draws, forced, max_len=max_len, **static, **ids)


def _pick(model, src_ids, src_mask, draws, forced, *, max_len, bos, eos, pad, k, nucleus):
    """Greedy (draws None) or sampling (draws = uniforms, 1/temperature, top_p); `forced`
    None or the first tokens (B,) (negative: none)."""
    B = src_ids.shape[0]
    memory, _ = model.encode(src_ids, src_mask)  # (B, S, D)
    cache = model.init_cache(memory, max_len)
    tokens = src_ids.new_full((B, max_len + 1), pad)  # (B, 1 + L)
    tokens[:, 0] = bos
    scores = memory.new_zeros(B, dtype=torch.promote_types(memory.dtype, torch.float32))
    finished = src_ids.new_zeros(B, dtype=torch.bool)
    for t in range(max_len):
        inputs = tokens[:, t:t + 1]  # (B, 1)
        logits, cache = model.decode_step(inputs, cache, t, src_mask)  # (B, V)
        if forced is not None:
            logits = force_tokens(logits, forced, (t == 0) & (forced >= 0))
        chosen = None
        if draws is not None:
            uniforms, inverse_temperature, top_p = draws
            chosen = sample_ids(logits, uniforms[:, t], inverse_temperature, top_p, k=k,
                                nucleus=nucleus)
        next_ids, scores, finished = greedy_pick(logits, scores, finished, pad, eos, chosen)
        tokens[:, t + 1] = next_ids
        if finished.all():
            break
    return tokens[:, 1:], scores


# -------------------------------------------------------------------- beam

def beam_search(model: Transformer, src_ids, *, max_len: int, beam_size: int = 4,
                alpha: float = 0.6, src_mask=None, eos_id=None, forced_first=None,
                length_penalty_style: str = "gnmt"):
    """Beam search as in the Flax WMT example: (B, S) source ids ->
    tokens (B, K, max_len) int64 and scores (B, K), best beam first.
    See jax_transformer.decoding.beam_search for the algorithm."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    if length_penalty_style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, "
                         f"got {length_penalty_style!r}")
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size,
                         src_ids.device)
    with eval_mode(model):
        return _beam(model, src_ids, src_mask, forced, max_len=max_len, beam_size=beam_size,
                     alpha=float(alpha), style=length_penalty_style, **ids)


def _beam(model, src_ids, src_mask, forced, *, max_len, beam_size, alpha, style, bos, eos, pad):
    B, K = src_ids.shape[0], beam_size
    memory, _ = model.encode(src_ids, src_mask)  # (B, S, D)
    # Beams are flattened into the batch: row b * K + k is beam k of sentence b.
    # All beams of a sentence share its cross-attention keys/values.
    cache = [{name: x.repeat_interleave(K, dim=0) for name, x in c.items()}
             for c in model.init_cache(memory, max_len)]
    src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
    dtype = torch.promote_types(memory.dtype, torch.float32)

    seqs = src_ids.new_full((B, K, max_len + 1), pad)  # (B, K, 1 + L)
    seqs[:, :, 0] = bos
    s = beam_state(seqs, cache, dtype)
    best_possible_lp = length_penalty(max_len, alpha, style)
    forced = None if forced is None else forced.repeat_interleave(K)  # (B*K,)

    def not_done(s):
        return s["t"] < max_len and not bool(beams_settled(s, best_possible_lp, style).all())

    def step(s):
        t = s["t"]
        inputs = s["live_seqs"][:, :, t].reshape(B * K, 1)  # (B*K, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t, src_mask)  # (B*K, V)
        log_probs = log_softmax(logits)  # (B*K, V)
        if forced is not None:
            log_probs = force_tokens(log_probs, forced, (forced >= 0) & (t == 0))
        return beam_update({**s, "cache": cache}, log_probs.reshape(B, K, -1), t + 1, alpha, eos,
                           style=style, last=t + 1 >= max_len)

    while not_done(s):
        s = step(s)
    tokens, scores = beam_result(s, best_possible_lp)
    return tokens[:, :, 1:], scores


# ------------------------------------------------------- uncached baseline

def greedy_search_uncached(model: Transformer, src_ids, *, max_len: int, src_mask=None,
                           eos_id=None):
    """Decoding without a cache, a baseline for tests and timings: every step
    re-runs the decoder over the whole prefix (cross-attention keys/values
    included). Same results as greedy_search; quadratic work."""
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    with eval_mode(model):
        B = src_ids.shape[0]
        memory, _ = model.encode(src_ids, src_mask)
        tokens = src_ids.new_full((B, 1), ids["bos"])
        scores = memory.new_zeros(B, dtype=torch.promote_types(memory.dtype, torch.float32))
        finished = src_ids.new_zeros(B, dtype=torch.bool)
        for _ in range(max_len):
            hidden, _, _ = model.decode(tokens, memory, src_mask)  # (B, T, D)
            logits = model.project(hidden[:, -1:])[:, 0]  # (B, V)
            next_ids, scores, finished = greedy_pick(logits, scores, finished, ids["pad"],
                                                     ids["eos"])
            tokens = torch.cat([tokens, next_ids[:, None]], dim=1)
            if finished.all():
                break
        out = src_ids.new_full((B, max_len), ids["pad"])
        out[:, : tokens.shape[1] - 1] = tokens[:, 1:]
        return out, scores
