"""One batch's search in either framework, as translate runs it: the function the live
model runs (translator.search_batch) and the one compiled_searches.py compiles."""

from __future__ import annotations

from transformer_core.generation import Sampling


def run_search(model, src, out_len: int, *, framework: str, beam: int, alpha: float = 0.6,
               sampling: Sampling | None, length_penalty_style: str, forced, uniforms=None):
    """(B, S) source ids -> tokens and scores as the framework's arrays: (B, K, out_len)
    and (B, K) for beam search, (B, out_len) and (B,) for greedy search and sampling
    (traceable: CompiledSearches compiles it). `uniforms` are sampling's draws (default:
    `sampling`'s own)."""
    if framework == "torch":
        from torch_reference import decoding
    else:
        from jax_transformer import decoding
    if sampling is not None:
        return decoding.sample(model, src, max_len=out_len, sampling=sampling,
                               uniforms=uniforms, forced_first=forced)
    if beam == 1:
        return decoding.greedy_search(model, src, max_len=out_len, forced_first=forced)
    return decoding.beam_search(model, src, max_len=out_len, beam_size=beam, alpha=alpha,
                                forced_first=forced, length_penalty_style=length_penalty_style)
