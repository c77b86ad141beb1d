"""A synthetic parallel corpus whose sentence lengths look like real text (WMT14 en-de).

Why: length buckets, token budgets and packing behave very differently on the
number-words corpus (every sentence under ~15 pieces) than on real text, where
most sentences are 10-50 pieces and a thin tail runs past 200. Tests and
benchmarks of the batching code use this one, since nothing is downloaded:
deterministic, numpy only.

The language. Each side has its own invented vocabulary of 20k pronounceable
words built from syllables; frequent words are short. Words are drawn with
Zipf frequencies (p ~ 1/rank), so a SentencePiece vocabulary of 8000 keeps the
frequent words whole and splits the rare ones into pieces, as it does on real
text. Sentence lengths in words are log-normal, clipped at 140 words. Under a
BPE 8000 model trained on the corpus itself, source sentences have a median of
25 pieces, a 90th percentile of 50, a 99th of ~88, about 1 in 2000 above 150,
and a longest of ~215 in 100k pairs, the shape of WMT14 en-de it imitates
(median ~25, 90th percentile 50-60, a thin tail to 200-250). Targets: median
27-28, 90th percentile 54, longest ~235.

The translation is a fixed function of the source: every source word has one
target word, and about 1 in 5 of the less frequent ones also a particle before
it (two target words). A "modifier" (a quarter of the less frequent words)
followed by a non-modifier trades places with it, as an English adjective and
its noun do in French. Targets are ~1.1x their source in words and pieces.

The language (vocabularies, dictionary, modifiers) is the same for every seed;
`seed` picks only the sentences, so a dev or test set is the same call with
another seed. The first k pairs of a corpus do not depend on its size.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from jax_transformer.data.corpora import CorpusError, Pair

VOCABULARY_SIZE = 20_000  # words per language
ZIPF_OFFSET = 2.7  # p(rank) ~ 1 / (rank + offset), Zipf-Mandelbrot: the top word ~4%
FUNCTION_WORDS = 100  # the most frequent words: never modifiers, never take a particle
PARTICLES = 10  # a particle is one of the 10 most frequent target words
PARTICLE_RATE = 0.2  # share of the other source words that translate to two target words
MODIFIER_RATE = 0.25  # share of the other source words that swap with the next word
MEDIAN_WORDS, LENGTH_SIGMA, MAX_WORDS = 17.0, 0.55, 140  # calibrated: see the docstring
LANGUAGE_SEED = 2017  # the language is fixed; only the sentences depend on `seed`


@dataclasses.dataclass(frozen=True)
class Sounds:
    """A language's spelling: a syllable is onset + vowel + coda."""

    onsets: tuple[str, ...]
    vowels: tuple[str, ...]
    codas: tuple[str, ...]

    def syllables(self) -> list[str]:
        return [o + v + c for o in self.onsets for v in self.vowels for c in self.codas]


SOURCE_SOUNDS = Sounds(
    onsets=("", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
            "br", "pr", "tr", "st", "sh", "th"),
    vowels=("a", "e", "i", "o", "u", "ea"),
    codas=("", "", "", "n", "r", "s", "t", "l"))
TARGET_SOUNDS = Sounds(
    onsets=("", "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "w", "z",
            "sch", "kr", "tr", "gr", "st", "zw"),
    vowels=("a", "e", "i", "o", "u", "ei"),
    codas=("", "", "", "n", "r", "s", "t", "ch"))


def invent_words(sounds: Sounds, count: int, rng: np.random.Generator) -> list[str]:
    """`count` distinct words, most frequent first: the early words have one or two
    syllables, the late (rare) ones up to four, as in real languages."""
    candidates = 2 * count  # duplicates are dropped (there are few)
    # Syllables per word: 1 + Binomial(3, p), p rising from 0 to ~0.5 over the ranks.
    num_syllables = 1 + rng.binomial(3, np.log10(np.arange(candidates) + 1.0) / 9)
    parts = rng.choice(np.array(sounds.syllables(), dtype=object), size=(candidates, 4))
    words = dict.fromkeys("".join(row[:k]) for row, k in zip(parts, num_syllables))
    return list(words)[:count]


@dataclasses.dataclass(frozen=True)
class Language:
    """Both vocabularies and the dictionary between them, indexed by source word rank."""

    source_words: np.ndarray  # (V,) str objects, most frequent first
    target_phrases: np.ndarray  # (V,) the translation of each source word: 1 or 2 words
    is_modifier: np.ndarray  # (V,) bool: swaps places with a following non-modifier
    frequencies: np.ndarray  # (V,) Zipf probability of each source word


@functools.cache
def language() -> Language:
    """The one language pair every corpus is written in (built once per process)."""
    rng = np.random.default_rng(LANGUAGE_SEED)
    source = invent_words(SOURCE_SOUNDS, VOCABULARY_SIZE, rng)
    target = invent_words(TARGET_SOUNDS, VOCABULARY_SIZE, rng)
    content = np.arange(VOCABULARY_SIZE) >= FUNCTION_WORDS
    has_particle = content & (rng.random(VOCABULARY_SIZE) < PARTICLE_RATE)
    particles = rng.integers(0, PARTICLES, VOCABULARY_SIZE)
    phrases = [f"{target[particle]} {word}" if has else word
               for word, has, particle in zip(target, has_particle, particles)]
    weights = 1.0 / (np.arange(VOCABULARY_SIZE) + ZIPF_OFFSET)
    return Language(source_words=np.array(source, dtype=object),
                    target_phrases=np.array(phrases, dtype=object),
                    is_modifier=content & (rng.random(VOCABULARY_SIZE) < MODIFIER_RATE),
                    frequencies=weights / weights.sum())


def natural_length_corpus(num_pairs: int, seed: int = 0) -> list[Pair]:
    """`num_pairs` (source, target) sentence pairs, lowercase ASCII words, ending in ".".

    Same (num_pairs, seed), same pairs on any machine; the first k pairs are
    the same for any num_pairs >= k.
    """
    if num_pairs < 1:
        raise CorpusError(f"natural_length_corpus needs at least one pair, got {num_pairs}")
    if seed < 0:
        raise CorpusError(f"natural_length_corpus needs a seed >= 0, got {seed}")
    lang = language()
    # Lengths and words come from two streams, each drawn in order, so that the
    # first k pairs do not depend on how many follow.
    length_rng = np.random.default_rng([seed, 0])
    word_rng = np.random.default_rng([seed, 1])
    lengths = length_rng.lognormal(math.log(MEDIAN_WORDS), LENGTH_SIGMA, num_pairs)
    lengths = np.minimum(np.ceil(lengths), MAX_WORDS).astype(np.int64)  # 1..MAX_WORDS
    ends = np.cumsum(lengths)
    starts = ends - lengths
    words = word_rng.choice(VOCABULARY_SIZE, size=ends[-1], p=lang.frequencies)
    # Target word order: a modifier followed by a non-modifier in the same sentence
    # swaps with it. Two swaps never overlap: the second word of one is no modifier.
    swap = lang.is_modifier[words[:-1]] & ~lang.is_modifier[words[1:]]
    swap[ends[:-1] - 1] = False  # no swap across the end of a sentence
    first = np.flatnonzero(swap)
    order = np.arange(len(words))
    order[first], order[first + 1] = first + 1, first
    source = lang.source_words[words].tolist()
    target = lang.target_phrases[words[order]].tolist()
    return [(" ".join(source[a:b]) + ".", " ".join(target[a:b]) + ".")
            for a, b in zip(starts.tolist(), ends.tolist())]
