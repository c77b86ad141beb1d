"""Greedy and beam search with a key/value cache, each search one jit-compiled loop.

Read it side by side with torch_reference/decoding.py: same functions, same
steps. The pieces these searches share with the decoder-only ones
(lm_decoding.py) live in jax_transformer/search.py: the greedy pick, sampling,
log-softmax, the length penalty and the beam search's bookkeeping.

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

The model runs in eval mode (dropout off) whatever mode it is in; `model` may
also be search.eval_model(model), split once for many searches. Each search
is one `jax.jit` over a `lax.while_loop` whose carry holds a fixed-size cache
(see Transformer.init_cache / decode_step), so a batch shape compiles once, not
once per token; the loop stops early when every sentence has finished. Beam
search grows its cache between loops (search.growing_loop), and its settled
sentences leave the batch (search.leaving_when_done: 32 sentences go on as 8, then
2), inside the same program.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer.masks import padding_mask
from jax_transformer.model import Transformer
from jax_transformer.search import (LENGTH_PENALTY_STYLES, beam_result, beam_state,
                                    beam_update, beams_settled, cache_lengths, eval_split,
                                    force_tokens, greedy_pick, growing_loop, leaving_when_done,
                                    length_penalty, log_softmax, loop_invariant,
                                    prepare_sampling, sample_ids)
from transformer_core.generation import Sampling


def _prepare(model: Transformer, src_ids, src_mask, max_len: int, eos_id):
    config = model.config
    if not 0 < max_len <= config.max_len:
        raise ValueError(f"max_len must be in [1, {config.max_len}] (the model's max_len), "
                         f"got {max_len}")
    src_ids = jnp.asarray(src_ids, jnp.int32)
    graphdef, state = eval_split(model)
    ids = dict(bos=config.bos_id, pad=config.pad_id,
               eos=config.eos_id if eos_id is None else int(eos_id))
    return graphdef, state, src_ids, src_mask, ids


def _forced_ids(forced_first, batch_size: int, vocab_size: int):
    """An id or one per row (negative: none) -> (B,) int32, or None when nothing is forced."""
    if forced_first is None:
        return None
    forced = np.broadcast_to(np.asarray(forced_first, np.int64), (batch_size,))
    if (forced >= vocab_size).any():
        raise ValueError(f"forced_first ids must be below the target vocabulary size "
                         f"{vocab_size}, got {forced.max()}")
    return jnp.asarray(forced, jnp.int32)


# ------------------------------------------------------------------ greedy

def greedy_search(model: Transformer, src_ids, *, max_len: int, src_mask=None, eos_id=None,
                  forced_first=None):
    """Greedy decoding: (B, S) source ids -> tokens (B, max_len) int32, scores (B,).

    `eos_id` overrides the config's (-1: none, so every sentence runs max_len steps).
    """
    graphdef, state, src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size)
    return _pick_jit(graphdef, state, src_ids, src_mask, None, forced, max_len=max_len, k=0,
                     nucleus=False, **ids)


def sample(model: Transformer, src_ids, *, max_len: int, sampling: Sampling, uniforms=None,
           src_mask=None, eos_id=None, forced_first=None):
    """Sampling (temperature, top-k, top-p; see transformer_core.generation):
    (B, S) source ids -> tokens (B, max_len) int32, scores (B,). Token t of
    sentence b uses uniforms[b, t], by default sampling.uniforms(B, max_len).
    Temperature 0 is greedy_search."""
    graphdef, state, src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    draws, static = prepare_sampling(sampling, src_ids.shape[0], max_len,
                                     model.config.tgt_vocab_size, uniforms)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size)
    return _pick_jit(graphdef, state, src_ids, src_mask, draws, forced, max_len=max_len,
                     **static, **ids)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("max_len", "bos", "eos", "pad", "k", "nucleus"))
def _pick_jit(graphdef, state, src_ids, src_mask, draws, forced, *, max_len, bos, eos, pad, k,
              nucleus):
    """Greedy (draws None) or sampling (draws = uniforms, 1/temperature, top_p); `forced`
    None or the first tokens (B,) (negative: none)."""
    model = nnx.merge(graphdef, state)
    B = src_ids.shape[0]
    src_mask = padding_mask(src_ids, pad) if src_mask is None else src_mask  # (B, 1, 1, S)
    memory, _ = model.encode(src_ids, src_mask)  # (B, S, D)
    tokens = jnp.full((B, max_len + 1), pad, jnp.int32).at[:, 0].set(bos)  # (B, 1 + L)
    score_dtype = jnp.promote_types(memory.dtype, jnp.float32)
    init = dict(t=jnp.int32(0), tokens=tokens, scores=jnp.zeros((B,), score_dtype),
                finished=jnp.zeros((B,), bool),
                cache=loop_invariant(model.init_cache(memory, max_len)))

    def not_done(s):
        return (s["t"] < max_len) & ~jnp.all(s["finished"])

    def step(s):
        t = s["t"]
        inputs = jax.lax.dynamic_slice_in_dim(s["tokens"], t, 1, axis=1)  # (B, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t, src_mask)  # (B, V)
        if forced is not None:
            logits = force_tokens(logits, forced, (t == 0) & (forced >= 0))
        chosen = None
        if draws is not None:
            uniforms, inverse_temperature, top_p = draws
            chosen = sample_ids(logits, uniforms[:, t], inverse_temperature, top_p, k=k,
                                nucleus=nucleus)
        next_ids, scores, finished = greedy_pick(logits, s["scores"], s["finished"], pad, eos,
                                                 chosen)
        tokens = jax.lax.dynamic_update_slice_in_dim(s["tokens"], next_ids[:, None], t + 1,
                                                     axis=1)
        return dict(t=t + 1, tokens=tokens, scores=scores, finished=finished, cache=cache)

    s = jax.lax.while_loop(not_done, step, init)
    return s["tokens"][:, 1:], s["scores"]


# -------------------------------------------------------------------- beam

def beam_search(model: Transformer, src_ids, *, max_len: int, beam_size: int = 4,
                alpha: float = 0.6, src_mask=None, eos_id=None, forced_first=None,
                length_penalty_style: str = "gnmt"):
    """Beam search as in the Flax WMT example: (B, S) source ids ->
    tokens (B, K, max_len) int32 and scores (B, K), best beam first.

    Each step keeps the 2K best extensions of the K live beams; those ending in
    eos compete (score / length penalty) for the K finished slots, the best K
    others stay live. A sentence stops improving once its K finished scores
    all beat the best score a live beam could still reach; the loop ends when
    that holds for every sentence, or at max_len. A sentence with no finished
    hypothesis returns its live beams, scored logprob / lp(max_len).
    `length_penalty_style="hf"` is transformers' generate(num_beams=K,
    length_penalty=alpha) instead (see search.beam_update).
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    if length_penalty_style not in LENGTH_PENALTY_STYLES:
        raise ValueError(f"length_penalty_style must be one of {LENGTH_PENALTY_STYLES}, "
                         f"got {length_penalty_style!r}")
    graphdef, state, src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    forced = _forced_ids(forced_first, src_ids.shape[0], model.config.tgt_vocab_size)
    return _beam_jit(graphdef, state, src_ids, src_mask, jnp.asarray(alpha, float), forced,
                     max_len=max_len, beam_size=beam_size, style=length_penalty_style, **ids)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("max_len", "beam_size", "style", "bos", "eos", "pad"))
def _beam_jit(graphdef, state, src_ids, src_mask, alpha, forced, *, max_len, beam_size, style,
              bos, eos, pad):
    model = nnx.merge(graphdef, state)
    B, K = src_ids.shape[0], beam_size
    src_mask = padding_mask(src_ids, pad) if src_mask is None else src_mask  # (B, 1, 1, S)
    memory, _ = model.encode(src_ids, src_mask)  # (B, S, D)
    # Beams are flattened into the batch: row b * K + k is beam k of sentence b.
    # All beams of a sentence share its cross-attention keys/values.
    cache = loop_invariant(jax.tree.map(lambda x: jnp.repeat(x, K, axis=0),
                                        model.init_cache(memory, cache_lengths(max_len)[0])))
    dtype = jnp.promote_types(memory.dtype, jnp.float32)
    alpha = alpha.astype(dtype)  # traced: another alpha does not recompile

    seqs = jnp.full((B, K, max_len + 1), pad, jnp.int32).at[:, :, 0].set(bos)  # (B, K, 1 + L)
    # What a sentence needs rides in the state, so that settled ones can leave the batch.
    init = {**beam_state(seqs, cache, dtype), "finished_rows": jnp.zeros((B,), bool),
            "src_mask": jnp.repeat(src_mask, K, axis=0),  # (B*K, 1, 1, S)
            "forced": None if forced is None else jnp.repeat(forced, K)}  # (B*K,)
    best_possible_lp = length_penalty(max_len, alpha, style)

    def run(s, until, lengths):
        def not_done(s):
            unsettled = ~beams_settled(s, best_possible_lp, style)
            return (s["t"] < max_len) & (jnp.sum(unsettled) > until)

        s = growing_loop(not_done, step, s, lengths)
        return {**s, "finished_rows": beams_settled(s, best_possible_lp, style)
                | (s["t"] >= max_len)}

    def step(s):
        t, forced, width = s["t"], s["forced"], s["live_seqs"].shape[0]
        inputs = s["live_seqs"][:, :, t].reshape(width * K, 1)  # (B*K, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t, s["src_mask"])  # (B*K, V)
        log_probs = log_softmax(logits)  # (B*K, V)
        if forced is not None:
            log_probs = force_tokens(log_probs, forced, (t == 0) & (forced >= 0))
        return {**s, **beam_update({**s, "cache": cache}, log_probs.reshape(width, K, -1),
                                   t + 1, alpha, eos, style=style, last=t + 1 >= max_len)}

    tokens, scores = leaving_when_done(run, init, lambda s: beam_result(s, best_possible_lp),
                                       cache_lengths(max_len), beam_size=K)
    return tokens[:, :, 1:], scores


# ------------------------------------------------------- uncached baseline

def greedy_search_uncached(model: Transformer, src_ids, *, max_len: int, src_mask=None,
                           eos_id=None, pad_to: int = 1):
    """Decoding without a cache, a baseline for tests and timings: every step
    re-runs the decoder over the whole prefix (cross-attention keys/values
    included) and picks the next token in the same compiled step. Same results as
    greedy_search; quadratic work, and one compilation per prefix length,
    unless `pad_to` > 1 right-pads the prefix to a multiple of it (the causal
    mask hides the padding): fewer compilations, a little more work."""
    graphdef, state, src_ids, src_mask, ids = _prepare(model, src_ids, src_mask, max_len, eos_id)
    if src_mask is None:
        src_mask = padding_mask(src_ids, ids["pad"])  # (B, 1, 1, S)
    memory = _encode_jit(graphdef, state, src_ids, src_mask)
    B = src_ids.shape[0]
    tokens = np.full((B, 1), ids["bos"], np.int32)
    scores = jnp.zeros((B,), jnp.promote_types(memory.dtype, jnp.float32))
    finished = jnp.zeros((B,), bool)
    for t in range(max_len):
        width = min(-(-(t + 1) // pad_to) * pad_to, max_len)
        prefix = np.full((B, width), ids["pad"], np.int32)
        prefix[:, : t + 1] = tokens
        next_ids, scores, finished = _greedy_step_uncached_jit(
            graphdef, state, prefix, memory, src_mask, t, scores, finished, pad=ids["pad"],
            eos=ids["eos"])
        tokens = np.concatenate([tokens, np.asarray(next_ids)[:, None]], axis=1)
        if bool(finished.all()):
            break
    out = np.full((B, max_len), ids["pad"], np.int32)
    out[:, : tokens.shape[1] - 1] = tokens[:, 1:]
    return jnp.asarray(out), scores


@functools.partial(jax.jit, static_argnums=0)
def _encode_jit(graphdef, state, src_ids, src_mask):
    return nnx.merge(graphdef, state).encode(src_ids, src_mask)[0]


@functools.partial(jax.jit, static_argnums=0, static_argnames=("pad", "eos"))
def _greedy_step_uncached_jit(graphdef, state, tgt_ids, memory, src_mask, position, scores,
                              finished, *, pad, eos):
    """The whole prefix through the decoder, then the greedy pick at `position`."""
    model = nnx.merge(graphdef, state)
    hidden, _, _ = model.decode(tgt_ids, memory, src_mask)  # (B, T, D)
    hidden = jax.lax.dynamic_slice_in_dim(hidden, position, 1, axis=1)  # (B, 1, D)
    return greedy_pick(model.project(hidden)[:, 0], scores, finished, pad, eos)  # logits (B, V)
