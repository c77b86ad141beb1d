"""Translate sentences with a checkpoint directory.

    python -m jax_transformer.translate --checkpoint DIR < source.txt > translations.txt
    python -m jax_transformer.translate --checkpoint DIR --input source.txt --beam 4
    python -m jax_transformer.translate --checkpoint DIR --framework torch   # torch_reference

One sentence per line in, one translation per line out, in input order. Lines
end at "\\n" only (a "\\r\\n" ending counts as one); a blank line gives a blank
line, without running the model. Input must be UTF-8. --output is checked
before any work and written atomically: a failed write keeps the old file.
The tokenizer is the checkpoint's tokenizer.model (source ids: its pieces plus
eos) or, in a converted opus-mt model, Marian's source.spm + vocab.json
(port.MarianTokenizer): a multilingual model's target language is a code at the
start of each line, ">>fra<< text", as with transformers; --normalize-punctuation
applies the Moses punctuation normaliser of OPUS-MT's pre-processing first.
Sentences are sorted by length into batches and padded to the training buckets'
lengths (jax_transformer.data.batching), so JAX compiles once per length bucket,
not once per batch. Progress and errors go to stderr. `--framework torch` runs
torch_reference (on CUDA when torch sees a GPU) and does not import JAX.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from jax_transformer import cli
from jax_transformer.data.batching import bucket_lengths, padded_length
from jax_transformer.port.marian_tokenizer import MarianTokenizer, split_language_code
from transformer_core import checkpoint_dir
from transformer_core.errors import InputError
from transformer_core.tokenizer import Tokenizer


class TranslateError(InputError):
    """The translation request cannot be served as given."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m jax_transformer.translate",
                                description="Translate one sentence per line.")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint directory (config.json, model.safetensors, tokenizer.model "
                        "or a converted Marian model's source.spm + vocab.json)")
    p.add_argument("--input", help="source file, one sentence per line (default: stdin)")
    p.add_argument("--output", help="where to write translations (default: stdout)")
    p.add_argument("--framework", choices=("jax", "torch"), default="jax")
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy search (default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="beam length penalty (default 0.6)")
    p.add_argument("--max-len", type=int, default=None,
                   help="most output tokens per sentence (default: twice the padded source "
                        "length + 10, at most the model's max_len)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--normalize-punctuation", action="store_true",
                   help="Marian (opus-mt) checkpoints: Moses punctuation normalisation of each "
                        "line first, as transformers' MarianTokenizer.normalize")
    args = p.parse_args(argv)
    for name in ("beam", "batch_size", "max_len"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    return args


def load(checkpoint, framework: str):
    """(model, tokenizer) from a checkpoint directory, or a clear error."""
    directory = Path(checkpoint)
    if not directory.is_dir():
        raise TranslateError(f"checkpoint directory {directory} does not exist")
    tokenizer_file = checkpoint_dir.tokenizer_path(directory)
    marian = MarianTokenizer.is_present(directory)
    if tokenizer_file is None and not marian:
        raise TranslateError(
            f"{directory} has no {checkpoint_dir.TOKENIZER_FILE} (nor Marian's source.spm + "
            "vocab.json); save the checkpoint with its tokenizer "
            "(save_pretrained(dir, tokenizer=path))")
    if framework == "torch":
        import torch

        import torch_reference
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = torch_reference.Transformer.from_pretrained(directory, device=device).eval()
    else:
        from jax_transformer.model import Transformer
        model = Transformer.from_pretrained(directory)
    tokenizer = MarianTokenizer(directory) if marian else Tokenizer(tokenizer_file)
    tokenizer.check_fits(model.config)
    return model, tokenizer


def source_ids(tokenizer, text: str, line: int, eos_id: int) -> list[int]:
    """Input line number `line`'s source ids, ending in eos. A Marian tokenizer adds its
    </s> itself and refuses a leading language code its vocabulary lacks (transformers
    would make it <unk>, and the model translate into no language asked for)."""
    if not isinstance(tokenizer, MarianTokenizer):
        return tokenizer.encode(text) + [eos_id]
    code, _ = split_language_code(text)
    if code is not None and code not in tokenizer.vocab["source"]:
        codes = tokenizer.supported_language_codes
        known = (f"its codes are {' '.join(codes[:20])}{' ...' if len(codes) > 20 else ''}"
                 if codes else "it takes no language codes")
        raise TranslateError(f"line {line} starts with the language code {code}, which "
                             f"{tokenizer.directory / 'vocab.json'} does not have; {known}")
    return tokenizer.encode(text)


def translate_lines(lines, model, tokenizer, *, framework="jax", beam=4, alpha=0.6,
                    max_len=None, batch_size=32, progress=None) -> list[str]:
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
        ids = source_ids(tokenizer, line.strip(), i + 1, config.eos_id)
        if len(ids) > config.max_len:
            print(f"warning: line {i + 1} truncated to the model's max_len "
                  f"({config.max_len} tokens)", file=sys.stderr)
            ids = ids[: config.max_len - 1] + [config.eos_id]
        sources[i] = ids
    order = sorted(sources, key=lambda i: len(sources[i]))
    buckets = bucket_lengths(config.max_len)
    translations = [""] * len(lines)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in (progress(batches) if progress else batches):
        width = padded_length(max(len(sources[i]) for i in batch), buckets)
        # Fixed shapes for jit: every batch is (batch_size, bucket); filler rows are [eos].
        src = np.full((batch_size if framework == "jax" else len(batch), width), config.pad_id,
                      np.int32)
        src[:, 0] = config.eos_id
        for row, i in enumerate(batch):
            src[row, : len(sources[i])] = sources[i]
        out_len = max_len or min(config.max_len, 2 * width + 10)
        if beam == 1:
            tokens, _ = decoding.greedy_search(model, src, max_len=out_len)
        else:
            tokens, _ = decoding.beam_search(model, src, max_len=out_len, beam_size=beam,
                                             alpha=alpha)
            tokens = tokens[:, 0]  # the best beam
        tokens = np.asarray(tokens.cpu() if framework == "torch" else tokens)
        for row, i in enumerate(batch):
            translations[i] = tokenizer.decode(tokens[row].tolist())
    return translations


def main(argv=None) -> int:
    """The command line; returns the exit code (jax_transformer.cli)."""
    return cli.run(translate_command, argv)


def check_output(path: Path) -> None:
    """Raise TranslateError unless translations can be written to `path`."""
    if path.is_dir():
        raise TranslateError(f"--output {path} is a directory")
    if not path.parent.is_dir():
        raise TranslateError(f"--output {path}: directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise TranslateError(f"--output {path}: directory {path.parent} is not writable")


def split_lines(data: bytes, source: str) -> list[str]:
    """UTF-8 `data` -> its lines, split on b"\\n" only, as the corpus readers do: U+2028,
    a form feed or a lone "\\r" is text inside a sentence. One "\\r" of a "\\r\\n" ending
    and a leading BOM are dropped; a final "\\n" ends the last line, it starts no other."""
    lines = data.removeprefix(codecs.BOM_UTF8).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    texts = []
    for number, line in enumerate(lines, start=1):
        try:
            texts.append(line.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as e:
            raise TranslateError(f"{source} is not UTF-8 text (line {number}, byte "
                                 f"{e.start + 1}: {e.reason})") from e
    return texts


def translate_command(argv=None) -> int:
    args = parse_args(argv)
    if args.output:
        check_output(Path(args.output))
    model, tokenizer = load(args.checkpoint, args.framework)
    if args.normalize_punctuation and not isinstance(tokenizer, MarianTokenizer):
        raise TranslateError(f"--normalize-punctuation needs a Marian tokenizer (source.spm + "
                             f"vocab.json); {args.checkpoint} has {checkpoint_dir.TOKENIZER_FILE}")
    if args.input:
        try:
            lines = split_lines(Path(args.input).read_bytes(), f"--input {args.input}")
        except OSError as e:
            raise TranslateError(f"cannot read --input {args.input}: {e}") from e
    else:
        lines = split_lines(sys.stdin.buffer.read(), "stdin")
    if args.normalize_punctuation:
        lines = [tokenizer.normalize(line) for line in lines]
    progress = lambda batches: tqdm(batches, desc="batches", unit="batch",  # noqa: E731
                                    file=sys.stderr, disable=None)
    start = time.perf_counter()
    translations = translate_lines(lines, model, tokenizer, framework=args.framework,
                                   beam=args.beam, alpha=args.alpha, max_len=args.max_len,
                                   batch_size=args.batch_size, progress=progress)
    seconds = time.perf_counter() - start
    text = "".join(t + "\n" for t in translations)
    if args.output:
        try:
            checkpoint_dir.write_atomically(
                args.output, lambda path: path.write_text(text, encoding="utf-8"))
        except OSError as e:
            raise TranslateError(f"cannot write --output {args.output}: {e}") from e
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    print(f"translated {len(lines)} sentences in {seconds:.1f}s ({args.framework}, "
          f"{'greedy' if args.beam == 1 else f'beam {args.beam}'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
