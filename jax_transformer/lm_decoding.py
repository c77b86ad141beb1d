"""Continuing prompts with a DecoderOnlyTransformer: greedy, sampling and beam search
with the key/value cache, each search one jit-compiled loop.

Read it side by side with torch_reference/lm_decoding.py: same functions, same
steps. The greedy pick, sampling, log-softmax, length penalty and beam
bookkeeping are the encoder-decoder searches' (jax_transformer/search.py), so
tie-breaking and randomness are theirs too.

    greedy_search(model, prompt_ids, prompt_lengths, max_new_tokens=N)
                                                    -> tokens (B, N), scores (B,)
    sample(model, prompt_ids, prompt_lengths, max_new_tokens=N, sampling=Sampling(...))
                                                    -> tokens (B, N), scores (B,)
    beam_search(model, prompt_ids, prompt_lengths, max_new_tokens=N, beam_size=4, alpha=0.6)
                                                    -> tokens (B, K, N), scores (B, K)

Prompts are right-padded: row b's prompt is prompt_ids[b, :prompt_lengths[b]]
(at least one token, e.g. bos; transformer_core.generation.pad_prompts builds
both; lengths default to the full width P). All rows step through positions
0, 1, ... together, one decode_step per position: while a position lies inside
a row's prompt, its prompt token is forced (fed to the cache, its score not
counted); after it the decoder chooses. So each row's cache holds exactly what
it would hold alone, at the same positions, with causality as the only mask,
and a batch of prompts of different lengths gives each row the tokens it gets
alone. The prompt is fed token by token (no separate prefill): simple and
exact, at the price of one step per prompt position.

Tokens are each row's N generated ids (the prompt excluded), ending with eos
and padded with pad after it; P + N must fit the model's max_len. Scores as in
decoding.py: sums of the model's log-probabilities; beam scores divided by the
GNMT length penalty of the generated length. Row b's n-th sampled token uses
uniforms[b, n] (default sampling.uniforms(B, N)), wherever its prompt ends.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_transformer.model import DecoderOnlyTransformer
from jax_transformer.search import (NEG_INF, beam_result, beam_state, beam_update,
                                    beams_settled, eval_split, greedy_pick, length_penalty,
                                    log_softmax, prepare_sampling, sample_ids)
from transformer_core.generation import Sampling


def _prepare(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths, max_new_tokens: int,
             eos_id):
    """The model split for jit, the token buffer (B, P + N) (prompts, then pad),
    the prompt lengths (B,) and the special ids."""
    config = model.config
    prompt_ids = np.asarray(prompt_ids)
    if prompt_ids.ndim != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids must be (batch, length >= 1), got shape {prompt_ids.shape}")
    B, P = prompt_ids.shape
    lengths = np.full(B, P) if prompt_lengths is None else np.asarray(prompt_lengths)
    if lengths.shape != (B,) or not ((1 <= lengths) & (lengths <= P)).all():
        raise ValueError(f"prompt_lengths must be {B} lengths in [1, {P}], got {lengths}")
    if not 0 < max_new_tokens <= config.max_len - P:
        raise ValueError(f"max_new_tokens must be in [1, {config.max_len - P}] (prompts of width "
                         f"{P} in the model's max_len {config.max_len}), got {max_new_tokens}")
    tokens = np.full((B, P + max_new_tokens), config.pad_id, np.int32)  # (B, P + N)
    for row, (prompt, n) in enumerate(zip(prompt_ids, lengths)):
        tokens[row, :n] = prompt[:n]
    graphdef, state = eval_split(model)
    ids = dict(pad=config.pad_id, eos=config.eos_id if eos_id is None else int(eos_id))
    return graphdef, state, jnp.asarray(tokens), jnp.asarray(lengths, jnp.int32), ids


def _continuations(seqs, lengths, new_tokens: int):  # (B, ..., P + N) -> (B, ..., N)
    """Each row's N positions after its prompt."""
    index = lengths[:, None] + jnp.arange(new_tokens)  # (B, N)
    index = index.reshape(index.shape[:1] + (1,) * (seqs.ndim - 2) + index.shape[1:])
    return jnp.take_along_axis(seqs, index, axis=-1)


# ---------------------------------------------------------- greedy, sampling

def greedy_search(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
                  max_new_tokens: int, eos_id=None):
    """Greedy continuations: (B, P) prompts -> tokens (B, N) int32, scores (B,)."""
    graphdef, state, tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths,
                                                     max_new_tokens, eos_id)
    return _pick_jit(graphdef, state, tokens, lengths, None, new_tokens=max_new_tokens, k=0,
                     nucleus=False, **ids)


def sample(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
           max_new_tokens: int, sampling: Sampling, uniforms=None, eos_id=None):
    """Sampled continuations (temperature, top-k, top-p; see transformer_core.generation):
    (B, P) prompts -> tokens (B, N) int32, scores (B,). Temperature 0 is greedy."""
    graphdef, state, tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths,
                                                     max_new_tokens, eos_id)
    draws, static = prepare_sampling(sampling, tokens.shape[0], max_new_tokens,
                                     model.config.vocab_size, uniforms)
    return _pick_jit(graphdef, state, tokens, lengths, draws, new_tokens=max_new_tokens,
                     **static, **ids)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("new_tokens", "eos", "pad", "k", "nucleus"))
def _pick_jit(graphdef, state, tokens, lengths, draws, *, new_tokens, eos, pad, k, nucleus):
    """Greedy (draws None) or sampling (draws = uniforms, 1/temperature, top_p)."""
    model = nnx.merge(graphdef, state)
    B, L = tokens.shape  # L = P + N
    dtype = model.shared_embed.dtype  # the compute dtype
    cache = model.init_cache(B, L, dtype)
    init = (jnp.int32(0), tokens, jnp.zeros((B,), jnp.promote_types(dtype, jnp.float32)),
            jnp.zeros((B,), bool), cache)

    def not_done(carry):
        t, _, _, finished, _ = carry
        return ~jnp.all(finished | (t + 1 - lengths >= new_tokens))

    def step(carry):
        t, tokens, scores, finished, cache = carry
        inputs = jax.lax.dynamic_slice_in_dim(tokens, t, 1, axis=1)  # (B, 1)
        logits, cache = model.decode_step(inputs, cache, t)  # (B, V)
        n = t + 1 - lengths  # (B,): which new token position t + 1 is (< 0: in the prompt)
        chosen = None
        if draws is not None:
            uniforms, inverse_temperature, top_p = draws
            u = jnp.take_along_axis(uniforms, jnp.clip(n, 0, new_tokens - 1)[:, None], axis=1)
            chosen = sample_ids(logits, u[:, 0], inverse_temperature, top_p, k=k,
                                nucleus=nucleus)
        frozen = finished | (n < 0) | (n >= new_tokens)  # rows the decoder does not choose for
        next_ids, scores, ended = greedy_pick(logits, scores, frozen, pad, eos, chosen)
        prompt = jax.lax.dynamic_index_in_dim(tokens, t + 1, axis=1, keepdims=False)  # (B,)
        next_ids = jnp.where(n < 0, prompt, next_ids)
        tokens = jax.lax.dynamic_update_slice_in_dim(tokens, next_ids[:, None], t + 1, axis=1)
        return t + 1, tokens, scores, finished | (ended & ~frozen), cache

    _, tokens, scores, _, _ = jax.lax.while_loop(not_done, step, init)
    return _continuations(tokens, lengths, new_tokens), scores


# -------------------------------------------------------------------- beam

def beam_search(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
                max_new_tokens: int, beam_size: int = 4, alpha: float = 0.6, eos_id=None):
    """Beam search over continuations (the algorithm of decoding.beam_search):
    (B, P) prompts -> tokens (B, K, N) int32 and scores (B, K), best beam first.
    While a row is in its prompt, every beam's next token is the prompt's (log-probability
    0 for it, NEG_INF for the rest), so beam 0 carries the prompt; once a row has
    N new tokens, pad is forced likewise and its beams stay as they are."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    graphdef, state, tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths,
                                                     max_new_tokens, eos_id)
    return _beam_jit(graphdef, state, tokens, lengths, jnp.asarray(float(alpha)),
                     new_tokens=max_new_tokens, beam_size=beam_size, **ids)


@functools.partial(jax.jit, static_argnums=0,
                   static_argnames=("new_tokens", "beam_size", "eos", "pad"))
def _beam_jit(graphdef, state, tokens, lengths, alpha, *, new_tokens, beam_size, eos, pad):
    model = nnx.merge(graphdef, state)
    (B, L), K = tokens.shape, beam_size  # L = P + N
    # Beams are flattened into the batch: row b * K + k is beam k of prompt b.
    cache = model.init_cache(B * K, L, model.shared_embed.dtype)
    dtype = jnp.promote_types(model.shared_embed.dtype, jnp.float32)
    alpha = alpha.astype(dtype)  # traced: another alpha does not recompile
    init = beam_state(jnp.broadcast_to(tokens[:, None], (B, K, L)), cache, dtype)
    best_possible_lp = length_penalty(new_tokens, alpha)

    def not_done(s):
        in_reach = s["t"] + 1 - jnp.max(lengths) < new_tokens  # some row still chooses
        return in_reach & ~jnp.all(beams_settled(s, best_possible_lp))

    def step(s):
        t = s["t"]
        inputs = s["live_seqs"][:, :, t].reshape(B * K, 1)  # (B*K, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t)  # (B*K, V)
        V = logits.shape[-1]
        n = (t + 1 - lengths)[:, None]  # (B, 1): which new token position t + 1 is
        forced = (n < 0) | (n >= new_tokens)  # the prompt's token, or pad after N new ones
        forced_ids = jax.lax.dynamic_index_in_dim(tokens, t + 1, axis=1)  # (B, 1)
        one_hot = jnp.where(jnp.arange(V) == forced_ids, 0.0, NEG_INF).astype(dtype)  # (B, V)
        log_probs = jnp.where(forced[:, :, None], one_hot[:, None],
                              log_softmax(logits).reshape(B, K, V))  # (B, K, V)
        length = jnp.clip(n + 1, 1, new_tokens).astype(dtype)  # generated tokens, for the penalty
        return beam_update({**s, "cache": cache}, log_probs, length, alpha, eos, may_end=~forced)

    seqs, scores = beam_result(jax.lax.while_loop(not_done, step, init), best_possible_lp)
    return _continuations(seqs, lengths, new_tokens), scores
