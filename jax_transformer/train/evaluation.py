"""Held-out metrics: loss and perplexity, translation quality (exact match, sacreBLEU),
and a text's unigram entropy (the baseline a language model must beat)."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import sacrebleu

from jax_transformer.data.packing import PackedBatches


def heldout_loss(trainer, state, batches: PackedBatches) -> dict:
    """Over one pass, per target token: the label-smoothed loss (what training
    minimises), the negative log-likelihood in nats and its perplexity exp(nll)."""
    loss_sum, nll_sum, tokens = 0.0, 0.0, 0
    for batch in batches.epoch(0):
        metrics = trainer.eval_step(state, trainer.shard_batch(batch))
        loss_sum += float(metrics["loss_sum"])
        nll_sum += float(metrics["nll_sum"])
        tokens += int(metrics["tokens"])
    loss, nll = loss_sum / max(tokens, 1), nll_sum / max(tokens, 1)
    return {"loss": loss, "nll": nll, "perplexity": math.exp(min(nll, 50.0)), "tokens": tokens}


def translation_metrics(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """Exact match (whitespace-normalised), corpus sacreBLEU and chrF.

    chrF (character n-grams) is the informative score when targets are single
    words, as German number compounds are: BLEU needs word 4-grams and is 0 there.
    """
    exact = [" ".join(h.split()) == " ".join(r.split()) for h, r in zip(hypotheses, references)]
    hypotheses, references = list(hypotheses), [list(references)]
    return {"exact_match": float(np.mean(exact)) if exact else 0.0,
            "bleu": sacrebleu.corpus_bleu(hypotheses, references).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, references).score,
            "sentences": len(exact)}


def unigram_entropy(labels: Sequence[np.ndarray]) -> float:
    """The entropy, in nats per token, of the tokens' unigram distribution: the loss of
    the best model that ignores context, to compare a language model's nll with."""
    counts = np.bincount(np.concatenate(labels))
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
