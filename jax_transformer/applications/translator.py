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

import sys
from pathlib import Path

import numpy as np

from jax_transformer.data.rows import padded_length
from transformer_core import checkpoint_dir
from transformer_core.config import TransformerConfig
from transformer_core.errors import InputError
from transformer_core.tokenizer import CheckpointTokenizer, TokenizerError


class TranslateError(InputError):
    """The translation request cannot be served as given."""


def load(checkpoint, framework: str):
    """(model, tokenizer) from a checkpoint directory, or a clear error (the config's and
    the weights' before the tokenizer's)."""
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


def source_widths(max_len: int) -> list[int]:
    """The widths batches of sources are padded to: `max_len` halved up to three times,
    at least 8 (128 -> 16, 32, 64, 128). Each search compiles once per width, so
    decoding a file of any length mix compiles at most SOURCE_WIDTHS programs."""
    return sorted({max(max_len >> halvings, min(8, max_len))
                   for halvings in range(SOURCE_WIDTHS)})


def translate_lines(lines, model, tokenizer: CheckpointTokenizer, *, framework="jax", beam=4,
                    alpha=0.6, max_len=None, batch_size=32, progress=None,
                    length_penalty_style="gnmt") -> list[str]:
    """One translation per line, in order; a blank line gives a blank translation without
    running the model. Sentences are sorted by length into batches and padded to one of
    the `source_widths` of the longest source's length rounded up to a power of two (at
    most the model's max_len), so JAX compiles each search at most SOURCE_WIDTHS times
    whatever the lengths, not once per batch, and buffers grow with the input, not with
    max_len. `length_penalty_style` "hf" is transformers' beam
    search (length_penalty = alpha)."""
    config = model.config
    if max_len is not None and max_len > config.max_len:
        raise TranslateError(f"--max-len {max_len} exceeds the model's max_len {config.max_len}")
    if framework == "torch":
        from torch_reference import decoding
    else:
        from jax_transformer import decoding

    sources = {}  # line index -> source ids; blank lines have none and stay blank
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        ids = source_ids(tokenizer, line.strip(), i + 1)
        if len(ids) > config.max_len:
            print(f"warning: line {i + 1} truncated to the model's max_len "
                  f"({config.max_len} tokens)", file=sys.stderr)
            ids = ids[: config.max_len - 1] + [config.eos_id]
        sources[i] = ids
    order = sorted(sources, key=lambda i: len(sources[i]))
    # Sized by the input: widths from max_len padded a word to 8192 positions for a
    # max_len of 65536, 17 GB of attention scores in a batch of 32.
    longest = max((len(ids) for ids in sources.values()), default=1)
    widths = source_widths(min(config.max_len, 1 << (longest - 1).bit_length()))
    translations = [""] * len(lines)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in (progress(batches) if progress else batches):
        width = padded_length(max(len(sources[i]) for i in batch), widths)
        # Fixed shapes for jit: every batch is (batch_size, width); filler rows are [eos].
        src = np.full((batch_size if framework == "jax" else len(batch), width), config.pad_id,
                      np.int32)
        src[:, 0] = config.eos_id
        for row, i in enumerate(batch):
            src[row, : len(sources[i])] = sources[i]
        out_len = max_len or min(config.max_len, 2 * width + 10)
        forced = getattr(tokenizer, "forced_first_id", None)  # the target language's code
        if beam == 1:
            tokens, _ = decoding.greedy_search(model, src, max_len=out_len, forced_first=forced)
        else:
            tokens, _ = decoding.beam_search(model, src, max_len=out_len, beam_size=beam,
                                             alpha=alpha, forced_first=forced,
                                             length_penalty_style=length_penalty_style)
            tokens = tokens[:, 0]  # the best beam
        tokens = np.asarray(tokens.cpu() if framework == "torch" else tokens)
        for row, i in enumerate(batch):
            translations[i] = tokenizer.decode(tokens[row].tolist())
    return translations
