"""train.py's translation task: sentence pairs, the encoder-decoder, the test set translated.

It implements train.tasks.Task.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import numpy as np

from jax_transformer.applications import translator
from jax_transformer.model import Transformer
from jax_transformer.train.records import plots
from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.tasks import metrics
from transformer_core.fairseq_tokenizer import FairseqTokenizer
from transformer_core.tokenizer import Tokenizer


class TranslationTask:
    """--task translate (train.tasks.Task): sentence pairs, the encoder-decoder."""

    def evaluate_test(self, model: Transformer, tokenizer: Tokenizer, pairs, settings: TrainSettings,
                      log: Callable[[str], None]) -> dict:
        """Translate the test sources: {"decoding", "test": exact match, BLEU and chrF,
        "samples": the first few translations}."""
        sources, references = [s for s, _ in pairs], [t for _, t in pairs]
        hypotheses = translate(sources, model, tokenizer, settings)
        samples = [{"source": s, "reference": r, "translation": h}
                   for s, r, h in zip(sources[: settings.samples], references, hypotheses)]
        for sample in samples:
            mark = "ok " if sample["translation"] == sample["reference"] else "   "
            log(f"  {mark}{sample['source']!r} -> {sample['translation']!r}"
                f" (reference {sample['reference']!r})")
        return {"decoding": search_name(settings),
                "test": metrics.translation_metrics(hypotheses, references), "samples": samples}

    def dev_scores(self, model: Transformer, tokenizer: Tokenizer, pairs,
                   settings: TrainSettings) -> dict:
        """The first --dev-bleu-sentences dev pairs translated as the test set is: BLEU
        and chrF (with their signatures) and the seconds it took; {} for none."""
        pairs = pairs[: settings.dev_bleu_sentences]
        if not pairs:
            return {}
        started = time.perf_counter()
        hypotheses = translate([s for s, _ in pairs], model, tokenizer, settings)
        scores = metrics.translation_metrics(hypotheses, [t for _, t in pairs])
        return {**{k: scores[k] for k in ("bleu", "bleu_order", "bleu_signature", "chrf",
                                          "chrf_signature", "sentences")},
                "decode_seconds": round(time.perf_counter() - started, 2)}

    def attention_figure(self, model: Transformer, tokenizer: Tokenizer, sample: dict, path: Path) -> None:
        """The last decoder layer's cross-attention while it reads a sample's translation."""
        config = model.config  # either text may take more than max_len tokens
        src_ids = np.array([tokenizer.encode_source(sample["source"])[:config.max_len]],
                           np.int32)
        tgt_ids = np.array([([config.bos_id] + tokenizer.encode_target(sample["translation"]))
                            [:config.max_len]], np.int32)
        _, attention = model(jnp.asarray(src_ids), jnp.asarray(tgt_ids), return_attention=True)
        plots.attention_heatmap(np.asarray(attention["cross"][-1][0], np.float32),
                                piece_names(tokenizer, src_ids[0], "source"),
                                piece_names(tokenizer, tgt_ids[0], "target"), path,
                                f"last decoder layer's cross-attention: {sample['source']!r}")


def translate(sources: list[str], model: Transformer, tokenizer: Tokenizer,
              settings: TrainSettings) -> list[str]:
    """The run's search (--beam, --alpha) over `sources`."""
    return translator.translate_lines(sources, model, tokenizer, beam=settings.beam,
                                      alpha=settings.alpha, batch_size=settings.decode_batch_size)


def search_name(settings: TrainSettings) -> str:
    return f"beam {settings.beam}, alpha {settings.alpha:g}" if settings.beam > 1 else "greedy"


def piece_names(tokenizer, token_ids, side: str) -> list[str]:
    """Token ids' pieces: ours (one SentencePiece vocabulary), an M2M100/NLLB tokenizer's
    (one vocabulary, and its language codes) or a Marian or FSMT one's (one per side)."""
    if isinstance(tokenizer, Tokenizer):
        return [tokenizer.sp.IdToPiece(int(i)) for i in token_ids]
    if isinstance(tokenizer, FairseqTokenizer):
        names = {**tokenizer.pieces, **{i: code for code, i in tokenizer.languages.items()}}
    else:
        names = {i: piece for piece, i in tokenizer.vocab[side].items()}
    return [names.get(int(i), "<unk>") for i in token_ids]
