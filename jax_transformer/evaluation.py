"""Held-out metrics: loss and perplexity, and translation quality (exact match, sacreBLEU)."""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import sacrebleu

from jax_transformer.batching import DEFAULT_BUCKETS, BucketedBatches
from jax_transformer.tokenizer import Tokenizer


def heldout_loss(trainer, state, batches: BucketedBatches) -> dict:
    """Label-smoothed loss per target token over one pass, and its perplexity."""
    loss_sum, tokens = 0.0, 0
    for batch in batches.epoch(0):
        metrics = trainer.eval_step(state, trainer.shard_batch(batch))
        loss_sum += float(metrics["loss_sum"])
        tokens += int(metrics["tokens"])
    loss = loss_sum / max(tokens, 1)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": tokens}


def bucket_length(length: int, buckets: Sequence[int] = DEFAULT_BUCKETS) -> int:
    for bucket in buckets:
        if length <= bucket:
            return bucket
    raise ValueError(f"sentence of {length} tokens is longer than the largest bucket {buckets[-1]}")


def translate_ids(search: Callable, sources: Sequence[Sequence[int]], pad_id: int, eos_id: int,
                  batch_size: int, buckets: Sequence[int] = DEFAULT_BUCKETS,
                  max_len: Callable[[int], int] = lambda bucket: 2 * bucket) -> list[list[int]]:
    """Decode token-id sentences in batches, returning output ids in input order.

    Sources (pieces, without eos) are sorted by length, grouped, padded to a
    bucket length and to `batch_size` rows, so `search(src_ids, max_len)`
    compiles once per bucket. Output ids stop before eos.
    """
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    start = 0
    while start < len(order):
        bucket = bucket_length(len(sources[order[start]]) + 1, buckets)
        group = [i for i in order[start:start + batch_size]
                 if len(sources[i]) + 1 <= bucket]
        src = np.full((batch_size, bucket), pad_id, np.int32)  # (B, S)
        for row, i in enumerate(group):
            src[row, : len(sources[i]) + 1] = [*sources[i], eos_id]
        tokens = np.asarray(search(src, max_len(bucket)))  # (B, L)
        for row, i in enumerate(group):
            ids = tokens[row].tolist()
            outputs[i] = ids[: ids.index(eos_id)] if eos_id in ids else ids
        start += len(group)
    return outputs


def translate(search: Callable, tokenizer: Tokenizer, sentences: Sequence[str], pad_id: int,
              eos_id: int, batch_size: int = 64, **kwargs) -> list[str]:
    ids = translate_ids(search, [tokenizer.encode(s) for s in sentences], pad_id, eos_id,
                        batch_size, **kwargs)
    return [tokenizer.decode(i) for i in ids]


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
