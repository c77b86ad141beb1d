"""Held-out metrics: loss and perplexity, translation quality (exact match, sacreBLEU, chrF),
and a text's unigram entropy (the baseline a language model must beat)."""

from __future__ import annotations

import collections
import math
from typing import Iterator, Sequence

import jax
import numpy as np
from sacrebleu.metrics import BLEU, CHRF
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from jax_transformer.data.batches.packed import PackedBatches


# Batches an evaluation dispatches before it reads the first one's sums: the host
# builds and shards the next batches while the devices run these.
EVAL_BATCHES_IN_FLIGHT = 2


def lagging(items: Iterator, lag: int) -> Iterator:
    """`items`' items in order, each once `lag` more have been taken from `items`
    (or it ran out)."""
    window = collections.deque()
    for item in items:
        window.append(item)
        if len(window) > lag:
            yield window.popleft()
    yield from window


def heldout_loss(trainer, state, batches: PackedBatches) -> dict:
    """Over one pass, per target token: the label-smoothed loss (what training
    minimises), the negative log-likelihood in nats and its perplexity exp(nll)."""
    loss_sum, nll_sum, tokens = 0.0, 0.0, 0
    dispatched = (trainer.eval_step(state, trainer.shard_batch(batch))
                  for batch in batches.epoch(0, trainer.local_rows))
    for metrics in lagging(dispatched, EVAL_BATCHES_IN_FLIGHT):
        metrics = jax.device_get(metrics)  # explicit: the loop runs under a transfer guard
        loss_sum += float(metrics["loss_sum"])
        nll_sum += float(metrics["nll_sum"])
        tokens += int(metrics["tokens"])
    loss, nll = loss_sum / max(tokens, 1), nll_sum / max(tokens, 1)
    return {"loss": loss, "nll": nll, "perplexity": math.exp(min(nll, 50.0)), "tokens": tokens}


BLEU_ORDER = 4  # BLEU's usual n-grams: 1 to 4 words


def bleu_order(references: Sequence[str]) -> int:
    """The longest n-grams, at most BLEU_ORDER, that at least half of the references
    have (words as sacreBLEU's default 13a tokenizer splits them; 1 at least)."""
    lengths = sorted((len(Tokenizer13a()(r).split()) for r in references), reverse=True)
    return max(1, min(BLEU_ORDER, lengths[(len(lengths) - 1) // 2])) if lengths else BLEU_ORDER


def translation_metrics(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Exact match (whitespace-normalised), corpus sacreBLEU and chrF, each score with
    sacreBLEU's signature string (how it was computed: tokenizer, smoothing, version).

    BLEU counts n-grams of up to 4 words; where most references are shorter it is 0
    (or nearly) for any output, however good: on the built-in number corpus every
    German target is one compound word. So "bleu" counts n-grams only as long as
    half of the references are ("bleu_order", 4 on real text), and then "bleu4"
    gives BLEU-4 beside it and "bleu_note" says why; chrF (character n-grams) and
    exact match are the informative scores there.
    """
    exact = [" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references)]
    hypotheses, references = list(hypotheses), [list(references)]
    order = bleu_order(references[0])
    bleu, chrf = BLEU(max_ngram_order=order), CHRF()
    results = {"exact_match": float(np.mean(exact)) if exact else 0.0,
               "bleu": bleu.corpus_score(hypotheses, references).score,
               "bleu_order": order,
               "bleu_signature": bleu.get_signature().format(),
               "chrf": chrf.corpus_score(hypotheses, references).score,
               "chrf_signature": chrf.get_signature().format(),
               "sentences": len(exact)}
    if order < BLEU_ORDER:
        short = sum(len(Tokenizer13a()(r).split()) < BLEU_ORDER for r in references[0])
        results["bleu4"] = BLEU().corpus_score(hypotheses, references).score
        results["bleu_note"] = (
            f"bleu is BLEU-{order}, not BLEU-4: {short} of the {len(references[0])} "
            f"references have fewer than 4 tokens, and BLEU-4 (bleu4) is 0 where none has "
            f"4, whatever the output; judge by exact_match and chrf")
    return results


def unigram_entropy(labels: Sequence[np.ndarray]) -> float:
    """The entropy, in nats per token, of the tokens' unigram distribution: the loss of
    the best model that ignores context, to compare a language model's nll with."""
    counts = np.bincount(np.concatenate(labels))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
