"""What both frameworks' samplers share: the settings, the one source of randomness, prompts.

Sampling draws its randomness here, once, in numpy, so that JAX and torch pick
the same tokens for the same seed:

    uniforms = Sampling(seed=s).uniforms(B, N)  # default_rng(s).random((B, N)), float64

Row b's n-th sampled token consumes uniforms[b, n] (n counts the tokens that
row generates, so a prompt's length does not shift its draws). Each framework
turns the model's logits (B, V) and u = uniforms[:, n] into tokens in the same
fixed order (search.sample_ids in jax_transformer and torch_reference), in the
compute dtype promote(logits dtype, float32), u cast to it too:

1. divide the logits by the temperature, after subtracting the row's best logit
   (x = (logits - max) * min(1 / temperature, the dtype's largest number)): the
   best token scores 0 and no score overflows, so a temperature so small that
   1 / temperature (or logits / temperature) overflows samples as greedy
   decoding does, but for exact ties (the limit as the temperature goes to 0);
2. sort them best first, ties to the lower token id (jax.lax.top_k's order,
   torch_reference.search.top_k's), keeping the top_k best (top_k 0: all);
3. softmax over what is kept, then cumulative sums c_0 <= c_1 <= ...;
4. top-p keeps the smallest prefix whose mass reaches top_p: token i stays when
   the mass before it, c_{i-1}, is < top_p (the first token always stays;
   top_p 1 keeps every token and skips the test);
5. inverse CDF: the first kept token i with c_i > u * c_last, c_last the mass kept.

Temperature 0 is greedy (argmax, lowest id on ties; no uniform is used).
Ties in step 2 that straddle the top_k cut are broken by token id, as in beam search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from transformer_core.errors import InputError


class SamplingError(InputError):
    """A sampling (or search) setting is out of range; the message names it."""


@dataclass(frozen=True)
class Sampling:
    """How to sample: temperature (0 = greedy), top_k (0 = no cut), top_p (1 = no cut), seed."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SamplingError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise SamplingError(f"top_k must be an integer >= 0 (0 = no cut), got {self.top_k}")
        if not 0 < self.top_p <= 1:  # NaN fails too
            raise SamplingError(f"top_p must be in (0, 1] (1 = no cut), got {self.top_p}")
        if isinstance(self.seed, bool) or int(self.seed) != self.seed or self.seed < 0:
            raise SamplingError(f"seed must be an integer >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def kept(self, vocab_size: int) -> int:
        """How many of the best tokens top_k keeps in a vocabulary of `vocab_size`."""
        return vocab_size if self.top_k == 0 else min(int(self.top_k), vocab_size)

    def uniforms(self, batch_size: int, steps: int) -> np.ndarray:
        """The draws, float64 in [0, 1): row b's n-th sampled token uses [b, n]."""
        return np.random.default_rng(int(self.seed)).random((batch_size, steps))


def check_alpha(alpha: float) -> None:
    """Raise SamplingError unless --alpha, beam search's length penalty, is a number >= 0:
    a NaN, infinite or negative one makes the search rank garbage first."""
    if not 0 <= alpha < math.inf:  # NaN fails too
        raise SamplingError(f"--alpha must be a number >= 0 (0: no length penalty), got {alpha}")


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int,
                width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token id lists -> right-padded ids (B, width) int64 and their lengths (B,).
    `width` defaults to the longest prompt's length."""
    lengths = np.array([len(p) for p in prompts], np.int64)
    if len(prompts) == 0 or lengths.min() < 1:
        raise InputError("every prompt needs at least one token (e.g. bos)")
    width = int(lengths.max()) if width is None else width
    if width < lengths.max():
        raise InputError(f"a prompt of {lengths.max()} tokens does not fit width {width}")
    ids = np.full((len(prompts), width), pad_id, np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
    return ids, lengths
