"""The search core in JAX: what the encoder-decoder searches (decoding.py) and
the decoder-only ones (lm_decoding.py) share, each piece a function of arrays
that runs inside their jit-compiled loops.

Read it side by side with torch_reference/search.py: same functions, same
steps, same dtypes, same tie-breaking (the lowest index wins a tie, as in
`jax.lax.top_k` and `jnp.argmax`), so that both frameworks turn the same logits
into the same tokens and scores.

    eval_split(model)                      the model with dropout off, split for jit
    eval_model(model)                      the same, split once for many searches
    log_softmax(logits)                    log-probabilities, at least float32
    greedy_pick(logits, ...)               the argmax (or a sampled id), scores summed
    prepare_sampling(settings, ...)        the uniforms and settings, outside jit
    sample_ids(logits, u, ...)             one sampled id per row (transformer_core.generation)
    force_tokens(scores, ids, force)       rows where `force`: only `ids` possible (log-prob 0)
    length_penalty(length, alpha, style)   GNMT's ((5 + length) / 6) ** alpha, or
                                           transformers' length ** alpha (style "hf")
    beam_state / beam_update / beams_settled / beam_result
                                           the beam search's state, step, stop test and result
    cache_lengths(max_len) / growing_loop(not_done, step, state, lengths)
                                           beam search's loop, its cache grown as it goes
    loop_invariant(cache)                  the cache as it enters the loop, left in its layout
    leaving_when_done(run, state, ...)     beam search's settled sentences leave its batch
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from transformer_core.generation import Sampling

NEG_INF = -1.0e7  # "effective -inf" for beam scores, as in the Flax WMT example


@dataclasses.dataclass(frozen=True)
class EvalModel:
    """A model split once in eval mode, for many searches: given the model itself, each
    search splits it again (nnx.view and nnx.split, at every batch of a file:
    docs/performance.md, "Decoding against CTranslate2 (CPU)"). The weights are those
    of the split."""
    graphdef: Any
    state: Any
    config: Any


def eval_split(model):
    """(graphdef, state) of the model in eval mode (dropout off), for a jit-compiled
    search to merge; torch's counterpart is the eval_mode context."""
    if isinstance(model, EvalModel):
        return model.graphdef, model.state
    return nnx.split(nnx.view(model, deterministic=True))


def eval_model(model) -> EvalModel:
    return EvalModel(*eval_split(model), model.config)


# ------------------------------------------------------------ the search loop

CACHE_LENGTHS = 4  # the lengths a search's self-attention cache grows through, at most


def cache_lengths(max_len: int) -> list[int]:
    """max_len halved up to three times, at least 32 (128 -> 32, 64, 128): the
    self-attention cache's lengths as a search goes (growing_loop)."""
    return sorted({max(max_len >> halvings, min(32, max_len))
                   for halvings in range(CACHE_LENGTHS)})


def loop_invariant(cache):
    """The cache as a search's loop receives it, its layout fixed: without this, XLA folds
    the heads-first transpose of the cross-attention keys/values (Decoder.init_cache)
    into the attention's own and redoes it inside the loop, at every step (1.2 ms of a
    10 ms greedy step on XLA:CPU: docs/performance.md, "Decoding against CTranslate2
    (CPU)")."""
    return jax.lax.optimization_barrier(cache)


def grow_cache(cache, length: int):  # self_k/self_v (B, H, L, Dh) -> (B, H, length, Dh)
    def grown(x):
        return jnp.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2]), (0, 0)))
    return [{**c, "self_k": grown(c["self_k"]), "self_v": grown(c["self_v"])} for c in cache]


def growing_loop(not_done, step, state: dict, lengths: list[int]) -> dict:
    """jax.lax.while_loop(not_done, step, state) for a search `state` with a step
    counter "t" and a decoding "cache" (model.init_cache(..., lengths[0])), run as one
    loop per cache length in `lengths` (cache_lengths), the cache padded to the next
    length between them: each step attends to (and a beam search reorders) the
    positions the search can have reached, not all of them. A beam step's time grows
    with its cache's length, a greedy step's hardly (docs/performance.md, "Decoding
    against CTranslate2 (CPU)"), so greedy search keeps one length, and one loop to compile.
    torch needs no such thing: its shapes may change at every step."""
    for length in lengths:
        state = jax.lax.while_loop(lambda s: (s["t"] < length) & not_done(s), step,
                                   {**state, "cache": grow_cache(state["cache"], length)})
    return state


# ------------------------------------------- finished sentences leave the batch

def narrower(width: int) -> int:
    """The batch a search of `width` sentences goes on in once at most that many still
    run: the widest of 2, 8, 32, 128, ... (2 * 4**k) within a quarter of `width` (32 -> 8
    -> 2; 16 -> 2; 250 -> 32), or 0 (under 8): it runs to its end at `width`."""
    narrow = 2 if width >= 8 else 0
    while narrow and narrow * 16 <= width:
        narrow *= 4
    return narrow


def take_rows(s: dict, rows, beam_size: int) -> dict:
    """A search's state cut to the sentences `rows` (W,): each array with a row per
    sentence (B, ...) or per beam (B*K, ...) keeps theirs, scalars stay."""
    B = s["finished_rows"].shape[0]
    beam_rows = (rows[:, None] * beam_size + jnp.arange(beam_size)).reshape(-1)  # (W*K,)

    def take(x):
        if jnp.ndim(x) == 0:
            return x
        return x[beam_rows] if x.shape[0] == B * beam_size else x[rows]
    s = jax.tree.map(take, s)
    return {**s, "cache": loop_invariant(s["cache"])}


def leaving_when_done(run, s: dict, result, lengths: list[int], beam_size: int):
    """A search whose finished sentences leave its batch, inside one jit-compiled program:
    run(state, until, lengths) steps the search (growing_loop through the cache
    `lengths`) until it ends or at most `until` sentences still run, and keeps
    state["finished_rows"] (B,), the sentences whose result is final; result(state) ->
    (tokens, scores), a row per sentence. The full batch runs until at most narrower(B)
    sentences still run; those go on alone at that width (the rest of it filled with
    finished ones, which change nothing), their cache at its longest, and so on down
    the ladder; each stage's results are written back to their rows. A sentence's steps
    do not depend on the others', so its tokens are the full-width loop's (in float32 a
    matmul of another width may round its last bit otherwise, and so may the scores).
    Each narrower width is one more loop to compile, and compacting a stage costs a copy
    of the running sentences' state."""
    B = s["finished_rows"].shape[0]
    s = run(s, narrower(B), lengths)
    tokens, scores = result(s)
    index, width = jnp.arange(B), B  # the batch row of each row of the state
    while narrower(width):
        width = narrower(width)
        rows = jnp.argsort(s["finished_rows"], stable=True)[:width]  # the running first
        s, index = take_rows(s, rows, beam_size), index[rows]
        s = run(s, narrower(width), lengths[-1:])
        narrow_tokens, narrow_scores = result(s)
        tokens, scores = tokens.at[index].set(narrow_tokens), scores.at[index].set(narrow_scores)
    return tokens, scores


def log_softmax(logits):  # (..., V), at least float32
    return jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)), axis=-1)


# ---------------------------------------------------------- greedy, sampling

def greedy_pick(logits, scores, finished, pad: int, eos: int, next_ids=None):
    """One step from next-token logits (B, V): the next ids (B,) (the argmax unless
    given; pad once a sentence has finished), the summed log-probabilities (B,)
    and the finished flags (B,)."""
    log_probs = log_softmax(logits)  # (B, V)
    if next_ids is None:
        next_ids = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)  # (B,)
    best = jnp.take_along_axis(log_probs, next_ids[:, None], axis=-1)[:, 0]
    next_ids = jnp.where(finished, pad, next_ids)
    scores = scores + jnp.where(finished, 0.0, best).astype(scores.dtype)
    return next_ids, scores, finished | (next_ids == eos)


def prepare_sampling(settings: Sampling, batch_size: int, steps: int, vocab_size: int,
                     uniforms=None):
    """(draws, static) for a jit-compiled search: draws = (uniforms (B, steps),
    1 / temperature, top_p), traced, or None when greedy; static = the settings
    that fix the compiled program (k, how many best tokens top-k keeps, and
    whether top-p cuts). `uniforms` defaults to settings.uniforms(batch_size, steps)."""
    if settings.greedy:
        return None, dict(k=0, nucleus=False)
    uniforms = settings.uniforms(batch_size, steps) if uniforms is None else uniforms  # or traced
    if np.shape(uniforms) != (batch_size, steps):
        raise ValueError(f"uniforms must have shape {(batch_size, steps)}, "
                         f"got {np.shape(uniforms)}")
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


def force_tokens(scores, forced_ids, force):
    """scores (N, V) (logits or log-probabilities), forced_ids (N,), force (N,) bool: in
    the rows where `force`, the forced id gets 0 and every other id NEG_INF, as
    transformers' ForcedBOSTokenLogitsProcessor does (with -inf). Greedy and sampling
    then pick it, beam search keeps it, and its log-probability counts as 0."""
    one_hot = jnp.where(jnp.arange(scores.shape[-1]) == forced_ids[:, None], 0.0, NEG_INF)
    return jnp.where(force[:, None], one_hot.astype(scores.dtype), scores)


# ---------------------------------------------------------------------- beam

LENGTH_PENALTY_STYLES = ("gnmt", "hf")


def length_penalty(length, alpha: float, style: str = "gnmt"):
    """GNMT (Wu et al. 2016): lp(Y) = ((5 + |Y|) / 6) ** alpha; "hf": transformers'
    |Y| ** alpha (its generate's length_penalty), |Y| counting eos, not the start token."""
    if style == "hf":
        return length ** alpha
    return ((5.0 + length) / 6.0) ** alpha


def gather_beams(x, beam_indices):  # x (B, K_old, ...), indices (B, K_new) -> (B, K_new, ...)
    return x[jnp.arange(x.shape[0])[:, None], beam_indices]


# The beam search's state: step t; live and finished sequences (B, K, L') with
# their log-probabilities and scores (B, K), best first; finished flags; the
# cache, one row per beam (row b * K + k is beam k of sentence b); with the "hf"
# style, `settled` (B,): sentences whose finished beams no longer change.
def beam_state(seqs, cache, dtype) -> dict:
    """The state before the first step: every beam holds `seqs` (B, K, L'), only beam 0 lives."""
    B, K = seqs.shape[:2]
    live_logprobs = jnp.tile(jnp.array([0.0] + [NEG_INF] * (K - 1), dtype), (B, 1))  # (B, K)
    return dict(t=jnp.int32(0), live_seqs=seqs, live_logprobs=live_logprobs, finished_seqs=seqs,
                finished_scores=jnp.full((B, K), NEG_INF, dtype),
                finished_flags=jnp.zeros((B, K), bool), settled=jnp.zeros((B,), bool),
                cache=cache)


def beams_settled(s, best_possible_lp, style: str = "gnmt"):  # -> (B,)
    """Sentences whose K finished scores all beat the best score a live beam could
    still reach: a live beam's score can only fall, so its best reachable finished
    score is live_logprob / lp(max length). Beams are sorted best first. The "hf"
    style uses transformers' heuristic instead (beam_update keeps it in `settled`)."""
    if style == "hf":
        return s["settled"]
    best_live = s["live_logprobs"][:, 0] / best_possible_lp  # (B,)
    worst_finished = jnp.where(s["finished_flags"].all(axis=1),
                               s["finished_scores"].min(axis=1), NEG_INF)  # (B,)
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
    top_logprobs, top_indices = jax.lax.top_k(log_probs.reshape(B, K * V), 2 * K)  # (B, 2K)
    top_beams, top_tokens = top_indices // V, top_indices % V
    top_seqs = gather_beams(s["live_seqs"], top_beams).at[:, :, t + 1].set(top_tokens)
    ended = (top_tokens == eos) & may_end  # (B, 2K)
    if style == "hf":
        ended = ended | last

    # Live: the K best that did not end.
    alive_scores = jnp.where(ended, top_logprobs + NEG_INF, top_logprobs)
    _, keep = jax.lax.top_k(alive_scores, K)  # (B, K)
    live_seqs = gather_beams(top_seqs, keep)
    live_logprobs = gather_beams(alive_scores, keep)
    parent = gather_beams(top_beams, keep)  # (B, K): the old beam each comes from
    rows = (jnp.arange(B)[:, None] * K + parent).reshape(B * K)
    cache = [{**c, "self_k": c["self_k"][rows], "self_v": c["self_v"][rows]}
             for c in s["cache"]]

    # Finished: the K best of the old finished and those that ended now.
    finishing = ended
    if style == "hf":
        finishing = ended & (jnp.arange(2 * K) < K) & ~s["settled"][:, None]
    new_scores = top_logprobs / length_penalty(length, alpha, style)
    new_scores = jnp.where(finishing, new_scores, new_scores + NEG_INF)
    all_seqs = jnp.concatenate([s["finished_seqs"], top_seqs], axis=1)  # (B, 3K, L')
    all_scores = jnp.concatenate([s["finished_scores"], new_scores], axis=1)  # (B, 3K)
    all_flags = jnp.concatenate([s["finished_flags"], finishing], axis=1)
    _, best = jax.lax.top_k(all_scores, K)  # (B, K)
    out = dict(t=t + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
               finished_seqs=gather_beams(all_seqs, best),
               finished_scores=gather_beams(all_scores, best),
               finished_flags=gather_beams(all_flags, best), settled=s["settled"], cache=cache)
    if style == "hf":
        best_live = (live_logprobs[:, :1] / length_penalty(length, alpha, style))[:, 0]
        out["settled"] = s["settled"] | (out["finished_flags"].all(axis=1)
                                         & (out["finished_scores"].min(axis=1) >= best_live))
    return out


def beam_result(s, best_possible_lp):
    """Sequences (B, K, L') and scores (B, K): the finished ones, or, for a sentence
    with none, the live ones scored logprob / lp(max length)."""
    any_finished = s["finished_flags"].any(axis=1)  # (B,)
    tokens = jnp.where(any_finished[:, None, None], s["finished_seqs"], s["live_seqs"])
    scores = jnp.where(any_finished[:, None], s["finished_scores"],
                       s["live_logprobs"] / best_possible_lp)
    return tokens, scores
