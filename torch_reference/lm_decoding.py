"""Continuing prompts with a DecoderOnlyTransformer: greedy, sampling and beam search
with the key/value cache, in PyTorch.

The reference for jax_transformer/lm_decoding.py (the scheme is explained
there): same functions, same steps, the shared pieces in torch_reference/search.py
(as for the encoder-decoder searches). Here the loops are Python loops.

    greedy_search(model, prompt_ids, prompt_lengths, max_new_tokens=N)
                                                    -> tokens (B, N), scores (B,)
    sample(model, prompt_ids, prompt_lengths, max_new_tokens=N, sampling=Sampling(...))
                                                    -> tokens (B, N), scores (B,)
    beam_search(model, prompt_ids, prompt_lengths, max_new_tokens=N, beam_size=4, alpha=0.6)
                                                    -> tokens (B, K, N), scores (B, K)

Prompts are right-padded, row b's prompt is prompt_ids[b, :prompt_lengths[b]];
inside it the prompt's tokens are forced, after it the decoder chooses. Tokens
are each row's N generated ids, ending with eos and padded with pad after it.
The model runs in eval mode (its mode is restored afterwards).
"""

from __future__ import annotations

import numpy as np
import torch

from torch_reference.model import DecoderOnlyTransformer
from torch_reference.search import (NEG_INF, beam_result, beam_state, beam_update,
                                    beams_settled, eval_mode, greedy_pick, length_penalty,
                                    log_softmax, prepare_sampling, sample_ids)
from transformer_core.generation import Sampling


def _prepare(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths, max_new_tokens: int,
             eos_id):
    """The token buffer (B, P + N) (prompts, then pad), the prompt lengths (B,)
    and the special ids."""
    config = model.config
    prompt_ids = np.asarray(prompt_ids.cpu() if torch.is_tensor(prompt_ids) else prompt_ids)
    if prompt_ids.ndim != 2 or prompt_ids.shape[1] < 1:
        raise ValueError(f"prompt_ids must be (batch, length >= 1), got shape {prompt_ids.shape}")
    B, P = prompt_ids.shape
    lengths = np.full(B, P) if prompt_lengths is None else np.asarray(prompt_lengths)
    if lengths.shape != (B,) or not ((1 <= lengths) & (lengths <= P)).all():
        raise ValueError(f"prompt_lengths must be {B} lengths in [1, {P}], got {lengths}")
    if not 0 < max_new_tokens <= config.max_len - P:
        raise ValueError(f"max_new_tokens must be in [1, {config.max_len - P}] (prompts of width "
                         f"{P} in the model's max_len {config.max_len}), got {max_new_tokens}")
    tokens = np.full((B, P + max_new_tokens), config.pad_id, np.int64)  # (B, P + N)
    for row, (prompt, n) in enumerate(zip(prompt_ids, lengths)):
        tokens[row, :n] = prompt[:n]
    ids = dict(pad=config.pad_id, eos=config.eos_id if eos_id is None else int(eos_id))
    return (torch.as_tensor(tokens, device=model.device),
            torch.as_tensor(lengths, dtype=torch.long, device=model.device), ids)


def _continuations(seqs, lengths, new_tokens: int):  # (B, ..., P + N) -> (B, ..., N)
    """Each row's N positions after its prompt."""
    index = lengths[:, None] + torch.arange(new_tokens, device=lengths.device)  # (B, N)
    index = index.reshape(index.shape[:1] + (1,) * (seqs.ndim - 2) + index.shape[1:])
    return seqs.gather(-1, index.expand(*seqs.shape[:-1], new_tokens))


# ---------------------------------------------------------- greedy, sampling

def greedy_search(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
                  max_new_tokens: int, eos_id=None):
    """Greedy continuations: (B, P) prompts -> tokens (B, N) int64, scores (B,)."""
    tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths, max_new_tokens, eos_id)
    with eval_mode(model):
        return _pick(model, tokens, lengths, None, new_tokens=max_new_tokens, k=0,
                     nucleus=False, **ids)


def sample(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
           max_new_tokens: int, sampling: Sampling, uniforms=None, eos_id=None):
    """Sampled continuations (temperature, top-k, top-p; see transformer_core.generation):
    (B, P) prompts -> tokens (B, N) int64, scores (B,). Temperature 0 is greedy."""
    tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths, max_new_tokens, eos_id)
    draws, static = prepare_sampling(sampling, tokens.shape[0], max_new_tokens,
                                     model.config.vocab_size, model.device, uniforms)
    with eval_mode(model):
        return _pick(model, tokens, lengths, draws, new_tokens=max_new_tokens, **static, **ids)


def _pick(model, tokens, lengths, draws, *, new_tokens, eos, pad, k, nucleus):
    """Greedy (draws None) or sampling (draws = uniforms, 1/temperature, top_p)."""
    B, L = tokens.shape  # L = P + N
    cache = model.init_cache(B, L)
    scores = torch.zeros(B, dtype=torch.promote_types(model.shared_embed.weight.dtype,
                                                      torch.float32), device=tokens.device)
    finished = torch.zeros(B, dtype=torch.bool, device=tokens.device)
    t = 0
    while not (finished | (t + 1 - lengths >= new_tokens)).all():
        inputs = tokens[:, t:t + 1]  # (B, 1)
        logits, cache = model.decode_step(inputs, cache, t)  # (B, V)
        n = t + 1 - lengths  # (B,): which new token position t + 1 is (< 0: in the prompt)
        chosen = None
        if draws is not None:
            uniforms, inverse_temperature, top_p = draws
            u = uniforms.gather(1, n.clamp(0, new_tokens - 1)[:, None])
            chosen = sample_ids(logits, u[:, 0], inverse_temperature, top_p, k=k,
                                nucleus=nucleus)
        frozen = finished | (n < 0) | (n >= new_tokens)  # rows the decoder does not choose for
        next_ids, scores, ended = greedy_pick(logits, scores, frozen, pad, eos, chosen)
        prompt = tokens[:, t + 1]  # (B,)
        tokens[:, t + 1] = torch.where(n < 0, prompt, next_ids)
        finished = finished | (ended & ~frozen)
        t += 1
    return _continuations(tokens, lengths, new_tokens), scores


# -------------------------------------------------------------------- beam

def beam_search(model: DecoderOnlyTransformer, prompt_ids, prompt_lengths=None, *,
                max_new_tokens: int, beam_size: int = 4, alpha: float = 0.6, eos_id=None):
    """Beam search over continuations: (B, P) prompts -> tokens (B, K, N) int64 and
    scores (B, K), best beam first. See jax_transformer.lm_decoding.beam_search."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got {beam_size}")
    tokens, lengths, ids = _prepare(model, prompt_ids, prompt_lengths, max_new_tokens, eos_id)
    with eval_mode(model):
        return _beam(model, tokens, lengths, float(alpha), new_tokens=max_new_tokens,
                     beam_size=beam_size, **ids)


def _beam(model, tokens, lengths, alpha, *, new_tokens, beam_size, eos, pad):
    (B, L), K = tokens.shape, beam_size  # L = P + N
    # Beams are flattened into the batch: row b * K + k is beam k of prompt b.
    cache = model.init_cache(B * K, L)
    dtype = torch.promote_types(model.shared_embed.weight.dtype, torch.float32)
    s = beam_state(tokens[:, None].expand(B, K, L).clone(), cache, dtype)
    best_possible_lp = length_penalty(new_tokens, alpha)

    def not_done(s):
        in_reach = s["t"] + 1 - int(lengths.max()) < new_tokens  # some row still chooses
        return in_reach and not bool(beams_settled(s, best_possible_lp).all())

    def step(s):
        t = s["t"]
        inputs = s["live_seqs"][:, :, t].reshape(B * K, 1)  # (B*K, 1)
        logits, cache = model.decode_step(inputs, s["cache"], t)  # (B*K, V)
        V = logits.shape[-1]
        n = (t + 1 - lengths)[:, None]  # (B, 1): which new token position t + 1 is
        forced = (n < 0) | (n >= new_tokens)  # the prompt's token, or pad after N new ones
        forced_ids = tokens[:, t + 1:t + 2]  # (B, 1)
        one_hot = torch.where(torch.arange(V, device=tokens.device) == forced_ids, 0.0,
                              NEG_INF).to(dtype)  # (B, V)
        log_probs = torch.where(forced[:, :, None], one_hot[:, None],
                                log_softmax(logits).reshape(B, K, V))  # (B, K, V)
        length = (n + 1).clamp(1, new_tokens).to(dtype)  # generated tokens, for the penalty
        return beam_update({**s, "cache": cache}, log_probs, length, alpha, eos, may_end=~forced)

    while not_done(s):
        s = step(s)
    seqs, scores = beam_result(s, best_possible_lp)
    return _continuations(seqs, lengths, new_tokens), scores
