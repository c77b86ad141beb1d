"""Translate sentences with a checkpoint directory.

    jaxformer-translate --checkpoint DIR < source.txt > translations.txt
    jaxformer-translate --checkpoint DIR --input source.txt --beam 4
    jaxformer-translate --checkpoint DIR --framework torch   # torch_reference

One sentence per line in, one translation per line out, in input order. Lines
end at "\\n" only (a "\\r\\n" ending counts as one); a blank line gives a blank
line, without running the model. Input must be UTF-8. `--input -` is stdin and
`--output -` stdout. --output is opened before any work: a regular file is written
atomically (a failed write keeps the old file), a FIFO or a device (/dev/null,
/dev/stdout on a pipe, a process substitution) in place; --output naming the --input
file is refused.
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

import contextlib
import os
import secrets
import stat
import sys
import time
from pathlib import Path

from tqdm import tqdm

from jax_transformer.applications.translator import (TranslateError, load, set_languages,
                                                     translate_lines)
from jax_transformer.commands import exit_codes, parsing
from transformer_core.generation import check_alpha
from transformer_core.text import split_lines


def parse_args(argv=None):
    p = parsing.ArgumentParser(prog="jaxformer-translate",
                               description="Translate one sentence per line.")
    p.add_argument("--checkpoint", required=True, type=parsing.path,
                   help="checkpoint directory (config.json, model.safetensors, tokenizer.model "
                        "or a converted Marian model's source.spm + vocab.json)")
    p.add_argument("--input", type=parsing.path,
                   help="source file, one sentence per line (default, and -: stdin)")
    p.add_argument("--output", type=parsing.path,
                   help="where to write translations (default, and -: stdout); a regular file "
                        "is replaced whole once all are written, a FIFO or a device (a pipe, "
                        "/dev/null) written in place")
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


STDIO = "-"  # --input - is stdin and --output - stdout, as Unix tools have it


def check_output(path: Path) -> None:
    """Raise TranslateError unless a new file can replace `path` (a regular file, or none
    yet; a link's target)."""
    if path.is_dir():
        raise TranslateError(f"--output {path} is a directory")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise TranslateError(f"--output {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TranslateError(f"--output {path}: directory {parent} is not writable")


def is_special(path: Path) -> bool:
    """Whether `path` (a link followed) is a FIFO, a device, a terminal or a socket: a
    pipe, /dev/null, /dev/stdout or a process substitution, which readers hold open."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def check_not_input(output: str, source: str | None) -> None:
    """Refuse --output naming the --input file: replacing it would lose the sentences."""
    if source in (None, STDIO) or not Path(source).is_file() or not Path(output).exists():
        return
    if os.path.samefile(source, output):
        raise TranslateError(f"--output {output} is the --input file {source}: its sentences "
                             "would be replaced by their translations; write them elsewhere")


class Output:
    """Where translations go, opened before any work so a bad --output fails first:
    stdout for none or "-"; a special file (is_special) in place, since replacing it
    would break its readers; else a new file beside it (a link's target), renamed over it
    when the `with` block ends without an error, so a failure keeps the old file and
    leaves no new one. Its write errors are TranslateErrors naming --output."""

    def __init__(self, name: str | None):
        self.name, self.tmp = name, None
        if name in (None, STDIO):
            self.file = sys.stdout
            return
        path = Path(name)
        if not is_special(path):
            check_output(path)
            path = path.resolve()
            self.tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        self.path = path
        self.file = self._attempt(open, self.tmp or path, "x" if self.tmp else "w",
                                  encoding="utf-8")  # a new file: 0o666 & ~umask

    def _attempt(self, action, *args, **kwargs):
        """`action(...)`, its OSError a TranslateError naming --output (stdout's as is)."""
        try:
            return action(*args, **kwargs)
        except OSError as e:
            if self.name in (None, STDIO):
                raise
            raise TranslateError(f"cannot write --output {self.name}: {e}") from None

    def write(self, text: str) -> None:
        self._attempt(self.file.write, text)

    def __enter__(self) -> Output:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if self.file is sys.stdout:
                self.file.flush()
            elif kind is not None:  # the error in flight is the one to report
                with contextlib.suppress(OSError):
                    self.file.close()
            else:
                self._attempt(self.file.close)
                if self.tmp:
                    self._attempt(os.replace, self.tmp, self.path)
        finally:
            if self.tmp:
                self.tmp.unlink(missing_ok=True)


def read_input(source: str | None) -> list[str]:
    """--input's lines (stdin's for none or "-")."""
    if source in (None, STDIO):
        return split_lines(sys.stdin.buffer.read(), "stdin")
    try:
        return split_lines(Path(source).read_bytes(), f"--input {source}")
    except OSError as e:
        raise TranslateError(f"cannot read --input {source}: {e}") from e


def translate_command(argv=None) -> int:
    args = parse_args(argv)
    check_alpha(args.alpha)
    if args.output not in (None, STDIO):
        check_not_input(args.output, args.input)
    with Output(args.output) as output:
        model, tokenizer = load(args.checkpoint, args.framework)
        set_languages(tokenizer, args.src_lang, args.tgt_lang)
        if args.normalize_punctuation and not tokenizer.normalizes:
            raise TranslateError(f"--normalize-punctuation needs a Marian tokenizer (source.spm "
                                 f"+ vocab.json); {args.checkpoint}'s tokenizer "
                                 f"({type(tokenizer).__name__}) has no separate normalising step")
        lines = read_input(args.input)
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
        output.write("".join(t + "\n" for t in translations))
    print(f"translated {len(lines)} sentences in {seconds:.1f}s ({args.framework}, "
          f"{'greedy' if args.beam == 1 else f'beam {args.beam}'})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
