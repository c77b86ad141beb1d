"""Translate sentences with a checkpoint directory: the library behind `jaxformer-translate`.

The tokenizer is the checkpoint's (checkpoint_dir.load_tokenizer): ours, or a
converted opus-mt model's Marian tokenizer, whose multilingual models take the
target language as a code at the start of each line, ">>fra<< text", as with
transformers; a converted M2M100/NLLB model's (transformer_core.fairseq_tokenizer) needs
the source and target languages (set_languages), and its searches force the target
code as the first generated token (transformers' forced_bos_token_id); a converted
FSMT model's (transformer_core.fsmt_tokenizer) takes neither. `framework="torch"` runs
torch_reference (on CUDA when torch sees a GPU) and does not import JAX.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np

from jax_transformer.applications.batch_search import run_search
from jax_transformer.applications.compiled_searches import CompiledSearches
from jax_transformer.data.batches.rows import padded_length
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.generation import Sampling
from transformer_core.tokenizer import CheckpointTokenizer, TokenizerError


class TranslateError(InputError):
    """The translation request cannot be served as given."""


def load(checkpoint, framework: str, *, compiled_searches: bool = False,
         keep_compiled_in: Path | None = None):
    """(model, tokenizer) from a checkpoint directory, or a clear error (the config's and
    the weights' before the tokenizer's). With `compiled_searches`, JAX's "model" is the
    checkpoint's CompiledSearches, kept in `keep_compiled_in` (the compilation cache's
    directory; None: in this process only): searched() runs them like the model's."""
    directory = Path(checkpoint)
    if not directory.is_dir():
        raise TranslateError(f"checkpoint directory {directory} does not exist")
    config_file = directory / checkpoint_dir.CONFIG_FILE
    architecture = (TransformerConfig.from_json(config_file).architecture
                    if config_file.is_file() else "encoder_decoder")  # load_dir names it
    if architecture != "encoder_decoder":
        hint = (f"; continue text with it: jaxformer-generate --checkpoint {directory}"
                if architecture == "decoder_only" else "")
        raise TranslateError(f"{directory} holds a {architecture} model; translate runs "
                             f"encoder_decoder models (a translator){hint}")
    if framework == "torch":
        import torch

        import torch_reference
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = torch_reference.Transformer.from_pretrained(directory, device=device).eval()
    elif compiled_searches:  # no Flax model: it is built only to compile a missing search
        config, tensors = checkpoint_dir.load_dir(directory)
        model = CompiledSearches(config, tensors, keep_compiled_in)
    else:
        from jax_transformer.model import Transformer
        model = Transformer.from_pretrained(directory)
    tokenizer = checkpoint_dir.load_tokenizer(directory)
    tokenizer.check_fits(model.config)
    return model, tokenizer


def set_languages(tokenizer: CheckpointTokenizer, src_lang: str | None,
                  tgt_lang: str | None) -> None:
    """Give an M2M100/NLLB tokenizer its language codes (both required); refuse codes for
    a tokenizer that takes none, and unknown codes with the list of known ones."""
    takes_codes = hasattr(tokenizer, "set_languages")
    if not takes_codes:
        if src_lang or tgt_lang:
            raise TranslateError("--src-lang/--tgt-lang are for converted M2M100/NLLB "
                                 "checkpoints; this one takes none (a multilingual opus-mt "
                                 "model takes >>code<< at the start of each line)")
        return
    if not (src_lang and tgt_lang):
        raise TranslateError(f"this {tokenizer.family} checkpoint needs --src-lang and "
                             f"--tgt-lang; known codes: {' '.join(tokenizer.languages)}")
    try:
        tokenizer.set_languages(src_lang, tgt_lang)
    except TokenizerError as e:
        raise TranslateError(str(e)) from None


def source_ids(tokenizer: CheckpointTokenizer, text: str, line: int) -> list[int]:
    """Input line number `line`'s source ids, ending in eos."""
    try:
        return tokenizer.encode_source(text)
    except TokenizerError as e:
        raise TranslateError(f"line {line} {e}") from None


SOURCE_WIDTHS = 4  # the source widths a translation pads its batches to, at most
NARROWEST = 8  # the narrowest source width (but for a model's max_len below it)


def source_widths(max_len: int) -> list[int]:
    """The widths batches of sources are padded to: `max_len` halved up to three times,
    at least NARROWEST (128 -> 16, 32, 64, 128). Each search compiles once per width, so
    decoding a file of any length mix compiles at most SOURCE_WIDTHS programs."""
    return sorted({max(max_len >> halvings, min(NARROWEST, max_len))
                   for halvings in range(SOURCE_WIDTHS)})


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One translation: its text, the search's score (greedy or sampled: the sum of its
    tokens' log-probabilities; beam: that sum over the length penalty) and its ids
    (the generated tokens, eos included when reached)."""
    text: str
    score: float
    ids: tuple[int, ...]


def translate_lines(lines, model, tokenizer: CheckpointTokenizer, **search) -> list[str]:
    """One translation per line, in order: the best of `search_lines(lines, ...)`."""
    return [hypotheses[0].text for hypotheses in search_lines(lines, model, tokenizer, **search)]


def search_lines(lines, model, tokenizer: CheckpointTokenizer, **search
                 ) -> list[list[Hypothesis]]:
    """Per line, in order, its best hypotheses: all that `searched(lines, ...)` yields."""
    return [hypotheses for done in searched(lines, model, tokenizer, **search)
            for hypotheses in done]


def searched(lines, model, tokenizer: CheckpointTokenizer, *, framework="jax", beam=4,
             alpha=0.6, max_len=None, batch_size=32, progress=None,
             length_penalty_style="gnmt", nbest=1, sampling: Sampling | None = None,
             first_line=1) -> Iterator[list[list[Hypothesis]]]:
    """Per line, in input order, its best hypotheses, best first, yielded as they are
    done: beam search's `nbest` best beams (at most `beam`) with distinct texts
    (`distinct`), or greedy search's or `sampling`'s one. A blank line gives one blank
    hypothesis without running the model. Sentences are sorted by length into batches
    and padded to one of the `source_widths` of the longest source's length rounded up
    to a power of two (at most the model's max_len), so JAX compiles each search at most
    SOURCE_WIDTHS times whatever the lengths (once more for the last, smaller batch),
    not once per batch, and buffers grow with the input, not with max_len. The batches
    run in the order of the first line each holds, and after each the lines done since
    (all before them done too) are yielded: the first translations come after a batch,
    not after the whole input, so a caller writing them as they come learns at once
    that its reader has gone (`| head -1`). JAX searches BATCHES_AT_ONCE batches at a
    time, each on a thread of its own. `length_penalty_style` "hf" is
    transformers' beam search (length_penalty = alpha).
    `first_line` numbers the lines in warnings and errors."""
    config = model.config
    if max_len is not None and max_len > config.max_len:
        raise TranslateError(f"--max-len {max_len} exceeds the model's max_len {config.max_len}")
    check_nbest(nbest, beam, sampling is not None)
    if framework == "jax" and not isinstance(model, CompiledSearches):
        from jax_transformer.search import eval_model
        model = eval_model(model)  # split once, not at every batch
    sources = encode_sources(lines, tokenizer, config, first_line)
    order = sorted(sources, key=lambda i: len(sources[i]))
    # Sized by the input, not by max_len, which would pad a word to 8192 positions for a
    # max_len of 65536 (17 GB of attention scores in a batch of 32). At least NARROWEST
    # wide, so that the short lines typed one at a time share one program.
    longest = max((len(ids) for ids in sources.values()), default=1)
    widths = source_widths(min(config.max_len,
                               max(NARROWEST, 1 << (longest - 1).bit_length())))
    results = [None if i in sources else [Hypothesis("", 0.0, ())] for i in range(len(lines))]
    batches = sorted((order[i:i + batch_size] for i in range(0, len(order), batch_size)),
                     key=min)
    search = dict(framework=framework, beam=beam, alpha=alpha, sampling=sampling,
                  length_penalty_style=length_penalty_style,
                  forced=getattr(tokenizer, "forced_first_id", None))  # the target language's

    def search_one(batch):  # -> batch, tokens (B, K, L), scores (B, K)
        width = padded_length(max(len(sources[i]) for i in batch), widths)
        # Few shapes for jit: a batch is (batch_size, width), the last one's rows rounded up
        # to a power of two (12 sentences: 16 rows, not 32); filler rows are [eos].
        rows = (min(batch_size, 1 << (len(batch) - 1).bit_length()) if framework == "jax"
                else len(batch))
        src = np.full((rows, width), config.pad_id, np.int32)
        src[:, 0] = config.eos_id
        for row, i in enumerate(batch):
            src[row, : len(sources[i])] = sources[i]
        return batch, *search_batch(model, src, max_len or min(config.max_len, 2 * width + 10),
                                    **search)

    written = 0
    at_once = BATCHES_AT_ONCE if framework == "jax" else 1
    for batch, tokens, scores in in_turn(keeping_jax_settings(search_one) if at_once > 1
                                         else search_one,
                                         progress(batches) if progress else batches, at_once):
        for row, i in enumerate(batch):
            ids = [generated_ids(t, config.eos_id) for t in tokens[row, :nbest]]
            results[i] = distinct([Hypothesis(tokenizer.decode(list(t)), float(score), t)
                                   for t, score in zip(ids, scores[row, :nbest])])
        done = next((i for i in range(written, len(lines)) if results[i] is None), len(lines))
        yield results[written:done]
        written = done
    if written < len(lines):  # no batch ran: every line blank
        yield results[written:]


# JAX searches a file's batches this many at a time, each on a thread of its own: a search
# on XLA:CPU keeps about one core busy, and two at once on 2 cores translate a file 1.35x
# faster (docs/performance.md, "Decoding against CTranslate2 (CPU)"). torch's ops use
# every core themselves.
BATCHES_AT_ONCE = 2


def keeping_jax_settings(work):
    """`work`, run under the caller's JAX settings on whatever thread calls it: contexts
    such as jax.enable_x64(True), jax.default_matmul_precision(...) and
    jax.default_device(...) hold for the thread that entered them only."""
    import jax
    x64, precision = jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision
    device = jax.config.jax_default_device

    def kept(*args):
        with jax.enable_x64(x64), jax.default_matmul_precision(precision), \
                jax.default_device(device):
            return work(*args)
    return kept


def in_turn(work, items, at_once: int) -> Iterator:
    """work(item) for each item, in order, up to `at_once` of them running at a time."""
    if at_once <= 1:
        yield from map(work, items)
        return
    with ThreadPoolExecutor(at_once) as pool:
        running = collections.deque()
        try:
            for item in items:
                running.append(pool.submit(work, item))
                if len(running) == at_once:
                    yield running.popleft().result()
            while running:
                yield running.popleft().result()
        finally:  # a caller that stops early does not wait for the work queued behind
            for future in running:
                future.cancel()


def distinct(hypotheses: list[Hypothesis]) -> list[Hypothesis]:
    """`hypotheses` (best first) without those whose text a better one has: beams that
    detokenize alike (two segmentations of one string) are one translation, with the
    best one's score and ids."""
    kept, texts = [], set()
    for hypothesis in hypotheses:
        if hypothesis.text not in texts:
            kept.append(hypothesis)
            texts.add(hypothesis.text)
    return kept


def check_nbest(nbest: int, beam: int, sampled: bool) -> None:
    """Refuse asking for more translations of a line than its search finds."""
    if nbest > (1 if sampled else beam):
        raise TranslateError(f"--nbest {nbest} is more than the search finds: "
                             + ("sampling draws one translation" if sampled
                                else f"--beam {beam} keeps {beam}"))


def encode_sources(lines, tokenizer: CheckpointTokenizer, config: TransformerConfig,
                   first_line: int = 1) -> dict[int, list[int]]:
    """Line index -> its source ids, cut to the model's max_len (with a warning); blank
    lines have none."""
    sources = {}
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        ids = source_ids(tokenizer, line.strip(), first_line + i)
        if len(ids) > config.max_len:
            print(f"warning: line {first_line + i} truncated to the model's max_len "
                  f"({config.max_len} tokens)", file=sys.stderr)
            ids = ids[: config.max_len - 1] + [config.eos_id]
        sources[i] = ids
    return sources


def search_batch(model, src: np.ndarray, out_len: int, **search
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(B, S) source ids -> tokens (B, K, out_len) and scores (B, K) as numpy: K = `beam`
    for beam search, 1 for greedy search and sampling (run_search's, or the compiled
    searches')."""
    if isinstance(model, CompiledSearches):
        tokens, scores = model(src, out_len, **search)
    else:
        tokens, scores = (np.asarray(x.cpu() if search["framework"] == "torch" else x)
                          for x in run_search(model, src, out_len, **search))
    return (tokens, scores) if tokens.ndim == 3 else (tokens[:, None], scores[:, None])


def generated_ids(tokens: np.ndarray, eos_id: int) -> tuple[int, ...]:
    """A hypothesis's tokens up to and including eos (all of them where it never ended)."""
    ends = np.flatnonzero(tokens == eos_id)
    return tuple(int(t) for t in tokens[: ends[0] + 1 if ends.size else len(tokens)])
