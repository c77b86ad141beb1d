"""What train.py trains (--task), and how each task judges a model: the test set
decoded, the dev set's scores, a figure (its corpus: train.corpus).

    translate    TranslationTask (translation.py): sentence pairs, the encoder-decoder
    lm           LanguageModelTask (language_model.py): lines of text, a decoder-only model
    metrics.py   held-out loss and nll, exact match, sacreBLEU, chrF, unigram entropy

train.settings.data.TASK_ARCHITECTURES names each task's architecture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, Sequence

from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.tasks.language_model import LanguageModelTask
from jax_transformer.train.tasks.translation import TranslationTask
from transformer_core.tokenizer import Tokenizer

Log = Callable[[str], None]


class Task(Protocol):
    def evaluate_test(self, model, tokenizer: Tokenizer, examples: Sequence,
                      settings: TrainSettings, log: Log) -> dict:
        """{"decoding": how, "test": figures, "samples": the first few outputs}."""

    def dev_scores(self, model, tokenizer: Tokenizer, examples: Sequence,
                   settings: TrainSettings) -> dict:
        """Scores of the dev set decoded at an evaluation besides its loss ({} for none):
        "bleu", "chrf" and their signatures, "decode_seconds"."""

    def attention_figure(self, model, tokenizer: Tokenizer, sample: dict, path: Path) -> None:
        """A heatmap of the last layer's attention over one sample."""


TASKS: dict[str, Task] = {"translate": TranslationTask(), "lm": LanguageModelTask()}
