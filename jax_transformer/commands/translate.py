"""Translate sentences with a checkpoint directory.

    jaxformer-translate --checkpoint DIR < source.txt > translations.txt
    jaxformer-translate --checkpoint DIR --input source.txt --beam 4
    jaxformer-translate --checkpoint DIR --framework torch   # torch_reference

One sentence per line in, one translation per line out, in input order. Lines
end at "\\n" only (a "\\r\\n" ending counts as one); a blank line gives a blank
line, without running the model. Input must be UTF-8. --output is checked
before any work and written atomically: a failed write keeps the old file.
The tokenizer is the checkpoint's tokenizer.model (source ids: its pieces plus
eos) or, in a converted opus-mt model, Marian's source.spm + vocab.json
(transformer_core.marian_tokenizer): a multilingual model's target language is a code at the
start of each line, ">>fra<< text", as with transformers; a converted M2M100/NLLB
model's (sentencepiece.bpe.model + fairseq_tokenizer.json) takes --src-lang and
--tgt-lang (codes as transformers names them: fr, fra_Latn); a converted FSMT model's
(vocab-src.json + merges.txt + fsmt_tokenizer.json) Moses-normalises, tokenises and
applies BPE itself. --normalize-punctuation applies the Moses punctuation normaliser
of OPUS-MT's pre-processing first.
Sentences are sorted by length into batches and padded to the training buckets'
lengths (jax_transformer.data.packing), so JAX compiles once per length bucket,
not once per batch. Progress and errors go to stderr. `--framework torch` runs
torch_reference (on CUDA when torch sees a GPU) and does not import JAX.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tqdm import tqdm

from jax_transformer.applications.translator import (TranslateError, load, set_languages,
                                                     translate_lines)
from jax_transformer.commands import exit_codes
from transformer_core import checkpoint_dir
from transformer_core.generation import check_alpha
from transformer_core.text import split_lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="jaxformer-translate",
                                description="Translate one sentence per line.")
    p.add_argument("--checkpoint", required=True,
                   help="checkpoint directory (config.json, model.safetensors, tokenizer.model "
                        "or a converted Marian model's source.spm + vocab.json)")
    p.add_argument("--input", help="source file, one sentence per line (default: stdin)")
    p.add_argument("--output", help="where to write translations (default: stdout)")
    p.add_argument("--framework", choices=("jax", "torch"), default="jax")
    p.add_argument("--beam", type=int, default=4, help="beam size; 1 = greedy search (default 4)")
    p.add_argument("--alpha", type=float, default=0.6, help="beam length penalty (default 0.6)")
    p.add_argument("--length-penalty-style", choices=("gnmt", "hf"), default="gnmt",
                   help="gnmt: ((5 + len) / 6) ** alpha (default); hf: transformers' "
                        "generate(num_beams, length_penalty=alpha), len ** alpha")
    p.add_argument("--src-lang", help="M2M100/NLLB checkpoints: the source language code "
                                      "(fr, fra_Latn)")
    p.add_argument("--tgt-lang", help="M2M100/NLLB checkpoints: the target language code, "
                                      "forced as the first generated token")
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


def main(argv=None) -> int:
    """The command line; returns the exit code (exit_codes)."""
    return exit_codes.run(translate_command, argv)


def check_output(path: Path) -> None:
    """Raise TranslateError unless translations can be written to `path`."""
    if path.is_dir():
        raise TranslateError(f"--output {path} is a directory")
    if not path.parent.is_dir():
        raise TranslateError(f"--output {path}: directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise TranslateError(f"--output {path}: directory {path.parent} is not writable")


def translate_command(argv=None) -> int:
    args = parse_args(argv)
    check_alpha(args.alpha)
    if args.output:
        check_output(Path(args.output))
    model, tokenizer = load(args.checkpoint, args.framework)
    set_languages(tokenizer, args.src_lang, args.tgt_lang)
    if args.normalize_punctuation and not tokenizer.normalizes:
        raise TranslateError(f"--normalize-punctuation needs a Marian tokenizer (source.spm + "
                             f"vocab.json); {args.checkpoint}'s tokenizer "
                             f"({type(tokenizer).__name__}) has no separate normalising step")
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
                                   batch_size=args.batch_size, progress=progress,
                                   length_penalty_style=args.length_penalty_style)
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
