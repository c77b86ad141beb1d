"""One batch's search in either framework, as translate runs it: the function the live
model runs (translator.search_batch) and the one compiled_searches.py compiles."""

from __future__ import annotations

from transformer_core.generation import Sampling


def run_search(model, src, out_len: int, *, framework: str, beam: int, alpha: float = 0.6,
               sampling: Sampling | None, length_penalty_style: str, forced, uniforms=None):
    """(B, S) source ids -> tokens (B, K, out_len) and scores (B, K) as the framework's
    arrays (traceable: CompiledSearches compiles it); `uniforms` sampling's draws (default:
    `sampling`'s own)."""
    if framework == "torch":
        from torch_reference import decoding
    else:
        from jax_transformer import decoding
    if sampling is not None:
        tokens, scores = decoding.sample(model, src, max_len=out_len, sampling=sampling,
                                         uniforms=uniforms, forced_first=forced)
    elif beam == 1:
        tokens, scores = decoding.greedy_search(model, src, max_len=out_len, forced_first=forced)
    else:
        return decoding.beam_search(model, src, max_len=out_len, beam_size=beam, alpha=alpha,
                                    forced_first=forced, length_penalty_style=length_penalty_style)
    return tokens[:, None], scores[:, None]
