"""What a training task gives the run (train.run.TrainingRun): its corpus, how to
encode it, how to judge the trained model on the test set, and a figure.

    translate  TranslationTask (translation.py): sentence pairs, the encoder-decoder
    lm         LanguageModelTask (language_model.py): lines of text, a decoder-only model

settings.TASK_ARCHITECTURES names each task's architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, Sequence

import numpy as np

from jax_transformer.data.corpora import CorpusReport
from jax_transformer.train.language_model import LanguageModelTask
from jax_transformer.train.settings import DataSettings, TrainSettings
from jax_transformer.train.translation import TranslationTask
from transformer_core.tokenizer import Tokenizer

Log = Callable[[str], None]


class Task(Protocol):
    def load_splits(self, data: DataSettings, seed: int, log: Log) -> dict[str, list]:
        """{"train", "dev", "test"}: the examples (sentence pairs, lines of text)."""

    def encode(self, tokenizer: Tokenizer, examples: Sequence, max_len: int,
               name: str | None = None
               ) -> tuple[list[np.ndarray] | None, list[np.ndarray], CorpusReport]:
        """(source ids or None for a single-stack model, target ids, what was skipped);
        a CorpusError naming the examples as `name` when none fits `max_len`."""

    def evaluate_test(self, model, tokenizer: Tokenizer, examples: Sequence,
                      settings: TrainSettings, log: Log) -> dict:
        """{"decoding": how, "test": figures, "samples": the first few outputs}."""

    def attention_figure(self, model, tokenizer: Tokenizer, sample: dict, path: Path) -> None:
        """A heatmap of the last layer's attention over one sample."""


TASKS: dict[str, Task] = {"translate": TranslationTask(), "lm": LanguageModelTask()}
