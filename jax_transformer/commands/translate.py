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
file is refused. From a pipe or a terminal, stdin is translated as its lines arrive
(each batch: the lines waiting) and the output flushed after each batch, so the
command answers interactively; a file (--input, or stdin redirected from one) is read
whole and sorted by length into full batches, its translations written, in order, as
each batch completes the lines before them, so a reader that goes away (`| head -1`)
stops the command at the next write (exit 141, quietly). --nbest K writes each line's
K best translations (those with the same text as a better one left out) as
INPUT_INDEX<TAB>SCORE<TAB>TRANSLATION, --print-scores SCORE<TAB>TRANSLATION for the
best; --sample draws one translation (--temperature, --top-k, --top-p, --seed).
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
lengths (jax_transformer.data.batches.rows), so JAX compiles once per length bucket,
not once per batch; each compiled search is kept in the compilation cache
(applications/compiled_searches.py), so a later call loads it without building the
model or tracing anything. Progress and errors go to stderr. `--framework torch` runs
torch_reference (on CUDA when torch sees a GPU) and does not import JAX.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import os
import queue
import secrets
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from jax_transformer.applications.translator import (TranslateError, check_nbest, load,
                                                     searched, set_languages)
from jax_transformer.commands import exit_codes, parsing
from transformer_core.errors import counted
from transformer_core.generation import check_alpha
from transformer_core.progress import progress_bar
from transformer_core.text import (SNIFF_BYTES, TextError, decode_line, encoding_problem,
                                   split_lines)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """--nbest, --print-scores, and --sample with its settings."""
    p.add_argument("--nbest", type=int, default=None, metavar="K",
                   help="write the K best translations of each line (at most --beam), best "
                        "first, each as INPUT_INDEX<TAB>SCORE<TAB>TRANSLATION (0-based index; "
                        "the search's score: log-probability over the length penalty); "
                        "beams with the same text are one, with the best score, so a line "
                        "may have fewer")
    p.add_argument("--print-scores", action="store_true",
                   help="write SCORE<TAB>TRANSLATION for each line's best translation")
    p.add_argument("--sample", action="store_true",
                   help="sample one translation per line (--temperature, --top-k, --top-p, "
                        "--seed) instead of searching for the best")
    parsing.add_sampling_flags(p, when="--sample: ")


def add_compile_cache_flags(p: argparse.ArgumentParser) -> None:
    """--compile-cache and --no-compile-cache, as train.py has them."""
    p.add_argument("--compile-cache", type=parsing.path, metavar="DIR",
                   help="--framework jax: JAX's persistent compilation cache, train.py's: "
                        "a later call loads the searches compiled here instead of compiling "
                        "them (default: train.py's, $JAX_COMPILATION_CACHE_DIR or "
                        "~/.cache/jax_transformer/xla)")
    p.add_argument("--no-compile-cache", action="store_true",
                   help="compile every search afresh and keep none")


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
    p.add_argument("--framework", choices=("jax", "torch"), default="jax",
                   help="jax: our Flax model; torch: torch_reference, on CUDA when torch sees "
                        "a GPU, without importing JAX (default: jax)")
    p.add_argument("--beam", type=int, default=None,
                   help="beam size; 1 = greedy search, the test translation of train.py's "
                        "default run (default 4)")
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
    p.add_argument("--batch-size", type=int, default=32,
                   help="most sentences translated at once; from a pipe or a terminal, each "
                        "batch takes the lines waiting, up to this (default: 32)")
    add_output_flags(p)
    add_compile_cache_flags(p)
    p.add_argument("--normalize-punctuation", action="store_true",
                   help="Marian (opus-mt) checkpoints: Moses punctuation normalisation of each "
                        "line first, as transformers' MarianTokenizer.normalize")
    args = p.parse_args(argv)
    for name in ("beam", "batch_size", "max_len", "nbest"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be positive, got {value}")
    sampling_flags = [f"--{name.replace('_', '-')}" for name in parsing.SAMPLING_FLAGS
                      if getattr(args, name) is not None]
    if sampling_flags and not args.sample:
        p.error(f"{' '.join(sampling_flags)} set how --sample draws: add --sample")
    if args.sample and args.beam is not None:
        p.error(f"--sample draws one translation per line; drop --beam {args.beam}")
    if args.nbest and args.print_scores:
        p.error("--nbest writes every translation with its score already; drop --print-scores")
    if args.compile_cache and args.no_compile_cache:
        p.error(f"--no-compile-cache turns off the --compile-cache {args.compile_cache} it names; "
                "drop one")
    if args.framework == "torch" and (args.compile_cache or args.no_compile_cache):
        p.error("--compile-cache and --no-compile-cache are JAX's; torch compiles nothing")
    args.beam = 1 if args.sample else 4 if args.beam is None else args.beam
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

    def flush(self) -> None:
        self._attempt(self.file.flush)

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
    sampling = parsing.sampling_from(args) if args.sample else None
    check_nbest(args.nbest or 1, args.beam, sampling is not None)
    if args.output not in (None, STDIO):
        check_not_input(args.output, args.input)
    if args.input in (None, STDIO) and sys.stdin is None:  # Python's stdin when fd 0 is closed
        raise TranslateError("stdin is closed (<&-), so there is nothing to translate: give "
                             "the sentences on stdin (< FILE, a pipe) or with --input FILE")
    with Output(args.output) as output:
        cache = (use_compile_cache(args.compile_cache, off=args.no_compile_cache)
                 if args.framework == "jax" else None)
        model, tokenizer = load(args.checkpoint, args.framework, compiled_searches=True,
                                keep_compiled_in=cache)
        set_languages(tokenizer, args.src_lang, args.tgt_lang)
        if args.normalize_punctuation and not tokenizer.normalizes:
            raise TranslateError(f"--normalize-punctuation needs a Marian tokenizer (source.spm "
                                 f"+ vocab.json); {args.checkpoint}'s tokenizer "
                                 f"({type(tokenizer).__name__}) has no separate normalising step")
        prepare = tokenizer.normalize if args.normalize_punctuation else (lambda line: line)
        search = dict(framework=args.framework, beam=args.beam, alpha=args.alpha,
                      max_len=args.max_len, batch_size=args.batch_size, nbest=args.nbest or 1,
                      sampling=sampling, length_penalty_style=args.length_penalty_style)
        streaming = args.input in (None, STDIO) and stdin_is_a_stream()
        batches = (stream_batches(sys.stdin.buffer, args.batch_size) if streaming
                   else [read_input(args.input)])
        progress = None if streaming else lambda batches: progress_bar(  # noqa: E731
            iterable=batches, desc="batches", unit="batch")
        start, count = time.perf_counter(), 0
        for lines in batches:  # a pipe or a terminal: the lines waiting, as they come
            for done in searched([prepare(line) for line in lines], model, tokenizer,
                                 first_line=count + 1, progress=progress, **search):
                output.write(formatted(done, args, first_index=count))
                output.flush()  # a reader gone (| head -1) stops the command here
                count += len(done)
        seconds = time.perf_counter() - start
    how = "sampling" if sampling else "greedy" if args.beam == 1 else f"beam {args.beam}"
    print(f"translated {counted(count, 'sentence')} in {seconds:.1f}s ({args.framework}, "
          f"{how})", file=sys.stderr)
    return 0


def use_compile_cache(directory: str | None, off: bool) -> Path | None:
    """Keep the compiled programs in JAX's persistent cache, `directory` or train.py's
    default (none when `off`), so that a later call loads its searches instead of
    compiling them (applications/compiled_searches.py); a cache that cannot be used is
    train.py's warning or error. Returns the directory used, or None."""
    from jax_transformer.train.runtime.compiling import use_compilation_cache
    from jax_transformer.train.settings.training import default_compile_cache
    default = default_compile_cache()
    return use_compilation_cache(None if off else directory or default, default=default)


def stdin_is_a_stream() -> bool:
    """Whether stdin is a pipe or a terminal (not a file, nor replaced by a buffer)."""
    try:
        return not stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def stream_batches(stream, batch_size: int) -> Iterator[list[str]]:
    """`stream`'s lines as they arrive, in batches of those already waiting (at most
    `batch_size`): a thread reads while the model translates, so a line typed at a
    terminal is answered at once and a fast pipe still fills whole batches."""
    waiting: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            problem = encoding_problem(stream.peek(SNIFF_BYTES)[:SNIFF_BYTES], "stdin")
            if problem:
                raise TextError(problem)
            for number, raw in enumerate(stream, start=1):
                raw = raw.removesuffix(b"\n")
                waiting.put(decode_line(raw.removeprefix(codecs.BOM_UTF8) if number == 1
                                        else raw, number, "stdin"))
        except Exception as error:  # noqa: BLE001  (re-raised by the main thread)
            waiting.put(error)
        waiting.put(None)

    threading.Thread(target=read, daemon=True).start()
    ended = False
    while not ended:
        batch = [waiting.get()]
        while len(batch) < batch_size and not waiting.empty():
            batch.append(waiting.get())
        if any(isinstance(item, Exception) for item in batch):
            raise next(item for item in batch if isinstance(item, Exception))
        ended = None in batch
        lines = [line for line in batch if line is not None]
        if lines:
            yield lines


def formatted(hypotheses, args, first_index: int = 0) -> str:
    """The output lines: each input's best translation (with --print-scores, its score
    first), or with --nbest K its K best, INPUT_INDEX<TAB>SCORE<TAB>TRANSLATION."""
    if args.nbest:
        return "".join(f"{first_index + i}\t{h.score:.6f}\t{h.text}\n"
                       for i, best in enumerate(hypotheses) for h in best)
    if args.print_scores:
        return "".join(f"{best[0].score:.6f}\t{best[0].text}\n" for best in hypotheses)
    return "".join(best[0].text + "\n" for best in hypotheses)


if __name__ == "__main__":
    sys.exit(main())
