"""Greedy and beam search with a key/value cache, in PyTorch.

The reference for jax_transformer/decoding.py: same functions, same steps,
same tie-breaking (the lowest index wins a tie, as `jax.lax.top_k` and
`jnp.argmax` do; torch.topk does not promise that, so `top_k` below uses a
stable sort), same length penalty. Here the loops are Python loops.

    greedy_search(model, src_ids, max_len=...)          -> tokens (B, L), scores (B,)
    sample(model, src_ids, max_len=..., sampling=Sampling(temperature=0.8, top_p=0.9, seed=0))
                                                         -> tokens (B, L), scores (B,)
    beam_search(model, src_ids, max_len=..., beam_size=4, alpha=0.6)
                                                         -> tokens (B, K, L), scores (B, K)
    greedy_search_uncached(model, src_ids, max_len=...) -> the seed-style baseline

Tokens are the generated ids (the decoder's start token is not included),
ending with eos and padded with pad after it; L = max_len. Greedy and sampled
scores are sums of the model's log-probabilities (eos included; sampling's
temperature and cuts do not change them); beam scores are those sums divided
by the GNMT length penalty ((5 + length) / 6) ** alpha, best beam first.
Sampling draws its randomness in numpy (transformer_core.generation), so both
frameworks pick the same tokens for the same seed.
The model runs in eval mode (its mode is restored afterwards).
"""

from __future__ import annotations

import contextlib

import torch

from torch_reference.masks import padding_mask
from torch_reference.model import Transformer
from torch_reference import sampling as sampling_module
from torch_reference.sampling import top_k
from transformer_core.generation import Sampling

NEG_INF = -1.0e7  # "effective -inf" for beam scores, as in the Flax WMT example


def length_penalty(length, alpha: float):
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6) ** alpha."""
    return ((5.0 + length) / 6.0) ** alpha


@contextlib.contextmanager
def _eval_mode(model: Transformer):
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


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


def _log_softmax(logits):  # (..., V), at least float32
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


# ------------------------------------------------------------------ greedy

def greedy_pick(log_probs, scores, finished, pad: int, eos: int, next_ids=None):
    """One step from log-probabilities (B, V): the next ids (B,) (the argmax unless
    given; pad once a sentence has finished), the summed scores (B,) and the
    finished flags (B,)."""
    if next_ids is None:
        next_ids = log_probs.argmax(dim=-1)  # (B,)
    best = log_probs.gather(-1, next_ids[:, None])[:, 0]
    next_ids = torch.where(finished, pad, next_ids)
    scores = scores + torch.where(finished, 0.0, best).to(scores.dtype)
    return next_ids, scores, finished | (next_ids == eos)


def greedy_search(model: Transformer, src_ids, *, max_len: int, src_mask=None, eos_id=None):
    """Greedy decoding: (B, S) source ids -> tokens (B, max_len) int64, scores (B,).

    `eos_id` overrides the config's (benchmarks pass -1 to never stop early).
    """
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    with _eval_mode(model):
        return _pick(model, src_ids, src_mask, None, max_len=max_len, k=0, nucleus=False, **ids)


def sample(model: Transformer, src_ids, *, max_len: int, sampling: Sampling, uniforms=None,
           src_mask=None, eos_id=None):
    """Sampling (temperature, top-k, top-p; see transformer_core.generation):
    (B, S) source ids -> tokens (B, max_len) int64, scores (B,). Token t of
    sentence b uses uniforms[b, t], by default sampling.uniforms(B, max_len).
    Temperature 0 is greedy_search."""
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    draws, static = sampling_module.prepare(sampling, src_ids.shape[0], max_len,
                                            model.config.tgt_vocab_size, model.device, uniforms)
    with _eval_mode(model):
        return _pick(model, src_ids, src_mask, draws, max_len=max_len, **static, **ids)


def _pick(model, src_ids, src_mask, draws, *, max_len, bos, eos, pad, k, nucleus):
    """Greedy (draws None) or sampling (draws = uniforms, 1/temperature, top_p)."""
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
        chosen = None
        if draws is not None:
            uniforms, inverse_temperature, top_p = draws
            chosen = sampling_module.sample_ids(logits, uniforms[:, t], inverse_temperature,
                                                top_p, k=k, nucleus=nucleus)
        next_ids, scores, finished = greedy_pick(_log_softmax(logits), scores, finished, pad, eos,
                                                 chosen)
        tokens[:, t + 1] = next_ids
        if finished.all():
            break
    return tokens[:, 1:], scores


# -------------------------------------------------------------------- beam

def beam_search(model: Transformer, src_ids, *, max_len: int, beam_size: int = 4,
                alpha: float = 0.6, src_mask=None, eos_id=None):
    """Beam search as in the Flax WMT example: (B, S) source ids ->
    tokens (B, K, max_len) int64 and scores (B, K), best beam first.
    See jax_transformer.decoding.beam_search for the algorithm."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    with _eval_mode(model):
        return _beam(model, src_ids, src_mask, max_len=max_len, beam_size=beam_size,
                     alpha=float(alpha), **ids)


def _gather_beams(x, beam_indices):  # x (B, K_old, ...), indices (B, K_new) -> (B, K_new, ...)
    return x[torch.arange(x.shape[0], device=x.device)[:, None], beam_indices]


def _beam(model, src_ids, src_mask, *, max_len, beam_size, alpha, bos, eos, pad):
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
    best_possible_lp = length_penalty(max_len, alpha)

    def not_done(s):
        return s["t"] < max_len and not bool(beams_settled(s, best_possible_lp).all())

    def step(s):
        t = s["t"]
        inputs = s["live_seqs"][:, :, t].reshape(B * K, 1)  # (B*K, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t, src_mask)  # (B*K, V)
        log_probs = _log_softmax(logits).reshape(B, K, -1)  # (B, K, V)
        return beam_update({**s, "cache": cache}, log_probs, t + 1, alpha, eos)

    while not_done(s):
        s = step(s)
    tokens, scores = beam_result(s, best_possible_lp)
    return tokens[:, :, 1:], scores


# The beam search's state and step, shared with lm_decoding. The state: step t;
# live and finished sequences (B, K, 1 + L) with their log-probabilities and
# scores (B, K), best first; finished flags; the cache, one row per beam.
def beam_state(seqs, cache, dtype) -> dict:
    """The state before the first step: every beam holds `seqs` (B, K, L'), only beam 0 lives."""
    B, K = seqs.shape[:2]
    live_logprobs = torch.full((B, K), NEG_INF, dtype=dtype, device=seqs.device)  # (B, K)
    live_logprobs[:, 0] = 0.0
    return dict(t=0, live_seqs=seqs, live_logprobs=live_logprobs, finished_seqs=seqs.clone(),
                finished_scores=torch.full((B, K), NEG_INF, dtype=dtype, device=seqs.device),
                finished_flags=torch.zeros((B, K), dtype=torch.bool, device=seqs.device),
                cache=cache)


def beams_settled(s, best_possible_lp):  # -> (B,)
    """Sentences whose K finished scores all beat the best score a live beam could
    still reach: a live beam's score can only fall, so its best reachable finished
    score is live_logprob / lp(max length). Beams are sorted best first."""
    best_live = s["live_logprobs"][:, 0] / best_possible_lp  # (B,)
    worst_finished = torch.where(s["finished_flags"].all(dim=1),
                                 s["finished_scores"].min(dim=1).values, NEG_INF)  # (B,)
    return worst_finished > best_live


def beam_update(s, log_probs, length, alpha, eos: int, may_end=True) -> dict:
    """One step from the live beams' next-token log-probabilities (B, K, V): the
    token at position t + 1 written, the cache reordered, the finished kept.
    `length` (scalar or (B, 1)): the hypotheses' length for the penalty;
    `may_end` (B, 1): where False, eos finishes nothing (a forced token)."""
    t, (B, K, V) = s["t"], log_probs.shape
    log_probs = log_probs + s["live_logprobs"][:, :, None]
    # The 2K best extensions over all beams (2K, so that K stay live even if
    # K of them end here). Index beam * V + token; ties: lowest index first.
    top_logprobs, top_indices = top_k(log_probs.reshape(B, K * V), 2 * K)  # (B, 2K)
    top_beams, top_tokens = top_indices // V, top_indices % V
    top_seqs = _gather_beams(s["live_seqs"], top_beams)
    top_seqs[:, :, t + 1] = top_tokens
    ended = (top_tokens == eos) & may_end  # (B, 2K)

    # Live: the K best that did not end.
    alive_scores = torch.where(ended, top_logprobs + NEG_INF, top_logprobs)
    _, keep = top_k(alive_scores, K)  # (B, K)
    live_seqs = _gather_beams(top_seqs, keep)
    live_logprobs = _gather_beams(alive_scores, keep)
    parent = _gather_beams(top_beams, keep)  # (B, K): the old beam each comes from
    rows = (torch.arange(B, device=parent.device)[:, None] * K + parent).reshape(B * K)
    cache = [{**c, "self_k": c["self_k"][rows], "self_v": c["self_v"][rows]}
             for c in s["cache"]]

    # Finished: the K best of the old finished and those that ended now.
    new_scores = top_logprobs / length_penalty(length, alpha)
    new_scores = torch.where(ended, new_scores, new_scores + NEG_INF)
    all_seqs = torch.cat([s["finished_seqs"], top_seqs], dim=1)  # (B, 3K, 1 + L)
    all_scores = torch.cat([s["finished_scores"], new_scores], dim=1)  # (B, 3K)
    all_flags = torch.cat([s["finished_flags"], ended], dim=1)
    _, best = top_k(all_scores, K)  # (B, K)
    return dict(t=t + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
                finished_seqs=_gather_beams(all_seqs, best),
                finished_scores=_gather_beams(all_scores, best),
                finished_flags=_gather_beams(all_flags, best), cache=cache)


def beam_result(s, best_possible_lp):
    """Sequences (B, K, L') and scores (B, K): the finished ones, or, for a sentence
    with none, the live ones scored logprob / lp(max length)."""
    any_finished = s["finished_flags"].any(dim=1)  # (B,)
    tokens = torch.where(any_finished[:, None, None], s["finished_seqs"], s["live_seqs"])
    scores = torch.where(any_finished[:, None], s["finished_scores"],
                         s["live_logprobs"] / best_possible_lp)
    return tokens, scores


# ------------------------------------------------------- uncached baseline

def greedy_search_uncached(model: Transformer, src_ids, *, max_len: int, src_mask=None,
                           eos_id=None):
    """The seeds' way, kept as a baseline for tests and benchmarks: every step
    re-runs the decoder over the whole prefix (cross-attention keys/values
    included). Same results as greedy_search; quadratic work."""
    src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    with _eval_mode(model):
        B = src_ids.shape[0]
        memory, _ = model.encode(src_ids, src_mask)
        tokens = src_ids.new_full((B, 1), ids["bos"])
        scores = memory.new_zeros(B, dtype=torch.promote_types(memory.dtype, torch.float32))
        finished = src_ids.new_zeros(B, dtype=torch.bool)
        for _ in range(max_len):
            hidden, _, _ = model.decode(tokens, memory, src_mask)  # (B, T, D)
            log_probs = _log_softmax(model.project(hidden[:, -1:])[:, 0])  # (B, V)
            next_ids, scores, finished = greedy_pick(log_probs, scores, finished, ids["pad"],
                                                     ids["eos"])
            tokens = torch.cat([tokens, next_ids[:, None]], dim=1)
            if finished.all():
                break
        out = src_ids.new_full((B, max_len), ids["pad"])
        out[:, : tokens.shape[1] - 1] = tokens[:, 1:]
        return out, scores
