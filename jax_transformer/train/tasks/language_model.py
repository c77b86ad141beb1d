"""train.py's language-model task (`--task lm`): lines of text, a decoder-only model,
the test lines continued.

The built-in text counts in words (corpora.counting_text); `--text-path` reads
one example per line. Each line is a sequence of its own: decoder input bos +
pieces, labels pieces + eos, packed several to a row like a translation's targets.
Evaluation: the test text's negative log-likelihood against its unigram entropy
(the loss of the best model that ignores context); how many test lines' second
half greedy decoding writes exactly, given their first half; and sampled
continuations.
It implements train.tasks.Task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import numpy as np

from jax_transformer import lm_decoding
from jax_transformer.data.tokenizing import encode_lines
from jax_transformer.model import DecoderOnlyTransformer
from jax_transformer.train.records import plots
from jax_transformer.train.settings.training import TrainSettings
from jax_transformer.train.tasks import metrics
from transformer_core.generation import Sampling, pad_prompts
from transformer_core.tokenizer import Tokenizer


class LanguageModelTask:
    """--task lm (train.tasks.Task): lines of text, a decoder-only model."""

    def dev_scores(self, model, tokenizer, lines, settings: TrainSettings) -> dict:
        """None: a language model's dev evaluation is its loss."""
        return {}

    def evaluate_test(self, model: DecoderOnlyTransformer, tokenizer: Tokenizer, lines,
                      settings: TrainSettings, log: Callable[[str], None]) -> dict:
        """Continue each test line from its first half. Returns {"decoding", "test":
        second_half_match (the share of lines whose second half greedy decoding writes
        token for token; what follows is not judged, since where a line ends is often
        unpredictable, as in the counting text) and the test text's unigram entropy,
        "samples": the first lines' prompt, and the line as written, as greedy decoding
        ends it and as sampling ends it}."""
        config = model.config
        pieces, _ = encode_lines(tokenizer, lines, max_len=config.max_len)
        halves = [len(p) // 2 for p in pieces]
        prompts = [[config.bos_id] + p[:h].tolist() for p, h in zip(pieces, halves)]
        second_halves = [p[h:].tolist() for p, h in zip(pieces, halves)]
        prompt_ids, prompt_lengths = pad_prompts(prompts, config.pad_id)  # (n, P), (n,)
        # Room for the longest second half and its eos.
        new_tokens = min(max(map(len, second_halves)) + 1, config.max_len - prompt_ids.shape[1])

        def continue_lines(rows, sampling=None):  # -> (len(rows), new_tokens) ids
            batch = min(settings.decode_batch_size, len(rows))
            out = []
            for start in range(0, len(rows), batch):  # every batch full: one compiled shape
                chunk = np.resize(rows[start:start + batch], batch)
                args = (model, prompt_ids[chunk], prompt_lengths[chunk])
                tokens, _ = (lm_decoding.greedy_search(*args, max_new_tokens=new_tokens)
                             if sampling is None else
                             lm_decoding.sample(*args, max_new_tokens=new_tokens, sampling=sampling))
                out.append(np.asarray(tokens)[: len(rows) - start])
            return np.concatenate(out)

        rows = np.arange(len(prompts))
        greedy = continue_lines(rows)
        written = [g[: len(half)].tolist() == half for g, half in zip(greedy, second_halves)]
        shown = rows[: settings.samples]
        sampled = continue_lines(shown, Sampling(temperature=settings.temperature,
                                                 seed=settings.seed)) if len(shown) else []

        def line(i, ending):  # line i's prompt and an ending, as text
            return tokenizer.decode(prompts[i][1:] + ending.tolist())

        samples = [{"prompt": tokenizer.decode(prompts[i][1:]),
                    "reference": line(i, pieces[i][halves[i]:]),
                    "greedy": line(i, greedy[i]), "sampled": line(i, sampled[n])}
                   for n, i in enumerate(shown)]
        for n, sample in zip(shown, samples):
            mark = "ok " if written[n] else "   "
            log(f"  {mark}{sample['prompt']!r} -> {sample['greedy']!r}; sampled "
                f"{sample['sampled']!r}")
        return {"decoding": f"greedy from each test line's first half; samples at temperature "
                            f"{settings.temperature}",
                "test": {"second_half_match": float(np.mean(written)), "lines": len(written),
                         "unigram_entropy": metrics.unigram_entropy(
                             [np.append(p, config.eos_id) for p in pieces])},
                "samples": samples}


    def attention_figure(self, model: DecoderOnlyTransformer, tokenizer: Tokenizer, sample: dict,
                         path: Path) -> None:
        """The last layer's self-attention over a sample's line as greedy decoding ends it."""
        ids = [model.config.bos_id] + tokenizer.encode(sample["greedy"])  # re-encoded: may be longer
        ids = np.array([ids[:model.config.max_len]], np.int32)
        _, attention = model(jnp.asarray(ids), return_attention=True)
        tokens = [tokenizer.sp.IdToPiece(int(i)) for i in ids[0]]
        plots.attention_heatmap(np.asarray(attention["decoder_self"][-1][0], np.float32), tokens,
                                tokens, path, f"last layer's self-attention: {sample['prompt']!r}")
