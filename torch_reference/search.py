"""The search core in PyTorch: what the encoder-decoder searches (decoding.py)
and the decoder-only ones (lm_decoding.py) share, each piece a function of
tensors called from their Python loops.

The reference for jax_transformer/search.py: same functions, same steps, same
dtypes, same tie-breaking (the lowest index wins a tie, as `jax.lax.top_k` and
`jnp.argmax` do; torch.topk does not promise that, so `top_k` below uses a
stable sort), so that both frameworks turn the same logits into the same
tokens and scores.

    eval_mode(model)                       a context: dropout off, no autograd
    log_softmax(logits)                    log-probabilities, at least float32
    greedy_pick(logits, ...)               the argmax (or a sampled id), scores summed
    prepare_sampling(settings, ...)        the uniforms and settings
    sample_ids(logits, u, ...)             one sampled id per row (transformer_core.generation)
    force_tokens(scores, ids, force)       rows where `force`: only `ids` possible (log-prob 0)
    length_penalty(length, alpha, style)   GNMT's ((5 + length) / 6) ** alpha, or
                                           transformers' length ** alpha (style "hf")
    beam_state / beam_update / beams_settled / beam_result
                                           the beam search's state, step, stop test and result
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from transformer_core.generation import Sampling

NEG_INF = -1.0e7  # "effective -inf" for beam scores, as in the Flax WMT example


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode (dropout off) under torch.inference_mode, its mode
    restored afterwards; JAX's counterpart is eval_split."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def log_softmax(logits):  # (..., V), at least float32
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


# ---------------------------------------------------------- greedy, sampling

def greedy_pick(logits, scores, finished, pad: int, eos: int, next_ids=None):
    """One step from next-token logits (B, V): the next ids (B,) (the argmax unless
    given; pad once a sentence has finished), the summed log-probabilities (B,)
    and the finished flags (B,)."""
    log_probs = log_softmax(logits)  # (B, V)
    if next_ids is None:
        next_ids = log_probs.argmax(dim=-1)  # (B,)
    best = log_probs.gather(-1, next_ids[:, None])[:, 0]
    next_ids = torch.where(finished, pad, next_ids)
    scores = scores + torch.where(finished, 0.0, best).to(scores.dtype)
    return next_ids, scores, finished | (next_ids == eos)


def prepare_sampling(settings: Sampling, batch_size: int, steps: int, vocab_size: int, device,
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


def force_tokens(scores, forced_ids, force):
    """scores (N, V) (logits or log-probabilities), forced_ids (N,), force (N,) bool: in
    the rows where `force`, the forced id gets 0 and every other id NEG_INF, as
    transformers' ForcedBOSTokenLogitsProcessor does (with -inf). Greedy and sampling
    then pick it, beam search keeps it, and its log-probability counts as 0."""
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    one_hot = torch.where(vocab == forced_ids[:, None], 0.0, NEG_INF).to(scores.dtype)
    return torch.where(force[:, None], one_hot, scores)


# ---------------------------------------------------------------------- beam

LENGTH_PENALTY_STYLES = ("gnmt", "hf")


def length_penalty(length, alpha: float, style: str = "gnmt"):
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6) ** alpha; "hf": transformers'
    |Y| ** alpha (its generate's length_penalty), |Y| counting eos, not the start token."""
    if style == "hf":
        return length ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def gather_beams(x, beam_indices):  # x (B, K_old, ...), indices (B, K_new) -> (B, K_new, ...)
    return x[torch.arange(x.shape[0], device=x.device)[:, None], beam_indices]


# The beam search's state: step t; live and finished sequences (B, K, L') with
# their log-probabilities and scores (B, K), best first; finished flags; the
# cache, one row per beam (row b * K + k is beam k of sentence b); with the "hf"
# style, `settled` (B,): sentences whose finished beams no longer change.
def beam_state(seqs, cache, dtype) -> dict:
    """The state before the first step: every beam holds `seqs` (B, K, L'), only beam 0 lives."""
    B, K = seqs.shape[:2]
    live_logprobs = torch.full((B, K), NEG_INF, dtype=dtype, device=seqs.device)  # (B, K)
    live_logprobs[:, 0] = 0.0
    return dict(t=0, live_seqs=seqs, live_logprobs=live_logprobs, finished_seqs=seqs.clone(),
                finished_scores=torch.full((B, K), NEG_INF, dtype=dtype, device=seqs.device),
                finished_flags=torch.zeros((B, K), dtype=torch.bool, device=seqs.device),
                settled=torch.zeros((B,), dtype=torch.bool, device=seqs.device), cache=cache)


def beams_settled(s, best_possible_lp, style: str = "gnmt"):  # -> (B,)
    """Sentences whose K finished scores all beat the best score a live beam could
    still reach: a live beam's score can only fall, so its best reachable finished
    score is live_logprob / lp(max length). Beams are sorted best first. The "hf"
    style uses transformers' heuristic instead (beam_update keeps it in `settled`)."""
    if style == "hf":
        return s["settled"]
    best_live = s["live_logprobs"][:, 0] / best_possible_lp  # (B,)
    worst_finished = torch.where(s["finished_flags"].all(dim=1),
                                 s["finished_scores"].min(dim=1).values, NEG_INF)  # (B,)
    return worst_finished > best_live


def beam_update(s, log_probs, length, alpha, eos: int, may_end=True, style: str = "gnmt",
                last=False) -> dict:
    """One step from the live beams' next-token log-probabilities (B, K, V): the
    token at position t + 1 written, the cache reordered, the finished kept.
    `length` (scalar or (B, 1)): the hypotheses' length for the penalty;
    `may_end` (B, 1): where False, eos finishes nothing (a forced token).

    style "gnmt" (the Flax WMT example): any of the 2K best extensions ending in
    eos may finish. style "hf" (transformers' generate, early_stopping=False):
    only those among the K best may, extensions at the last position (`last`)
    finish whatever their token, and a sentence is settled (finishes nothing
    more) once all K finished scores are at least its best live logprob /
    lp(length) - transformers' heuristic, the current length, not the longest."""
    t, (B, K, V) = s["t"], log_probs.shape
    log_probs = log_probs + s["live_logprobs"][:, :, None]
    # The 2K best extensions over all beams (2K, so that K stay live even if
    # K of them end here). Index beam * V + token; ties: lowest index first.
    top_logprobs, top_indices = top_k(log_probs.reshape(B, K * V), 2 * K)  # (B, 2K)
    top_beams, top_tokens = top_indices // V, top_indices % V
    top_seqs = gather_beams(s["live_seqs"], top_beams)
    top_seqs[:, :, t + 1] = top_tokens
    ended = (top_tokens == eos) & may_end  # (B, 2K)
    if style == "hf":
        ended = ended | last

    # Live: the K best that did not end.
    alive_scores = torch.where(ended, top_logprobs + NEG_INF, top_logprobs)
    _, keep = top_k(alive_scores, K)  # (B, K)
    live_seqs = gather_beams(top_seqs, keep)
    live_logprobs = gather_beams(alive_scores, keep)
    parent = gather_beams(top_beams, keep)  # (B, K): the old beam each comes from
    rows = (torch.arange(B, device=parent.device)[:, None] * K + parent).reshape(B * K)
    cache = [{**c, "self_k": c["self_k"][rows], "self_v": c["self_v"][rows]}
             for c in s["cache"]]

    # Finished: the K best of the old finished and those that ended now.
    finishing = ended
    if style == "hf":
        top = torch.arange(2 * K, device=ended.device) < K
        finishing = ended & top & ~s["settled"][:, None]
    new_scores = top_logprobs / length_penalty(length, alpha, style)
    new_scores = torch.where(finishing, new_scores, new_scores + NEG_INF)
    all_seqs = torch.cat([s["finished_seqs"], top_seqs], dim=1)  # (B, 3K, L')
    all_scores = torch.cat([s["finished_scores"], new_scores], dim=1)  # (B, 3K)
    all_flags = torch.cat([s["finished_flags"], finishing], dim=1)
    _, best = top_k(all_scores, K)  # (B, K)
    out = dict(t=t + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
               finished_seqs=gather_beams(all_seqs, best),
               finished_scores=gather_beams(all_scores, best),
               finished_flags=gather_beams(all_flags, best), settled=s["settled"], cache=cache)
    if style == "hf":
        best_live = (live_logprobs[:, :1] / length_penalty(length, alpha, style))[:, 0]
        out["settled"] = s["settled"] | (out["finished_flags"].all(dim=1)
                                         & (out["finished_scores"].min(dim=1).values >= best_live))
    return out


def beam_result(s, best_possible_lp):
    """Sequences (B, K, L') and scores (B, K): the finished ones, or, for a sentence
    with none, the live ones scored logprob / lp(max length)."""
    any_finished = s["finished_flags"].any(dim=1)  # (B,)
    tokens = torch.where(any_finished[:, None, None], s["finished_seqs"], s["live_seqs"])
    scores = torch.where(any_finished[:, None], s["finished_scores"],
                         s["live_logprobs"] / best_possible_lp)
    return tokens, scores
