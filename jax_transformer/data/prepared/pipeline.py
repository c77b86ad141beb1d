"""A corpus prepared once: read, split, tokenized and encoded into memory-mappable stores.

    prepare(DIR, corpus, encoding)   read the text once (streaming), hold out dev and
                                     test, train the tokenizer on a sample, encode every
                                     split on every core, write DIR whole or not at all
                                     (its files: directory.py, which reads it back)

The pipeline (fairseq-preprocess's, with train.py's own splitting and bad-data policy):

    1. read: the corpus is read once, line by line, into raw UTF-8 stores in DIR's
       temporary twin (raw_text.py; the bad-data policy of data/corpora.py, with its line numbers)
    2. split: a user's corpus is shuffled by the encoding's seed and dev/test held out,
       exactly as corpora.holdout_split does; the built-in corpora come split
    3. tokenizer: trained on the training split (a sample of TOKENIZER_SAMPLE examples of
       a larger one), its sentences streamed from the raw store, as tokenizing.train_tokenizer
    4. encode: each split in parts, one process a part (encode_worker.py), pieces over
       max_len dropped and counted; the parts joined in order
    5. the fingerprint of each split (store.fingerprint), the manifest, and a rename

The splits hold the same examples in the same order as the in-memory path
(corpora -> tokenizing.encode_pairs), so their batches and fingerprints are the same.
Nothing but DIR's temporary twin (DIR.tmp-PID) is written until the last rename: an
interrupted preparation leaves no DIR that a later run could take for a whole one.
Nothing prepare did not write is removed: an existing DIR is replaced only when it is
empty or a preparation (refused when it is a file, a link, a directory of other files,
or holds a corpus file), and a twin left by a stopped preparation only when it holds
TWIN_MARKER. Needs neither JAX nor torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import numpy as np

from jax_transformer.data.corpora import CorpusError, CorpusReport
from jax_transformer.data.prepared import encode_worker
from jax_transformer.data.prepared.directory import (FORMAT, MANIFEST, SPLITS, Prepared,
                                                     file_sha256, link_or_copy)
from jax_transformer.data.prepared.raw_text import (Corpus, Log, RawSplit, read_splits,
                                                    write_examples)
from jax_transformer.data.prepared.store import TokenStore, fingerprint, ids_dtype
from jax_transformer.data.tokenizing import TOKENIZER_SAMPLE, TOO_MANY_TOKENS, UNKNOWN_SHARE
from transformer_core.checkpoint_dir import TOKENIZER_FILE
from transformer_core.errors import listing
from transformer_core.progress import progress_bar
from transformer_core.tokenizer import UNK_ID, Tokenizer

PART_EXAMPLES = 100_000  # a split smaller than twice this is encoded in this process
MOSTLY_UNKNOWN = 0.5  # a split with more than this share of many-<unk> examples is refused
TWIN_MARKER = ".jaxformer-prepare"  # in every directory prepare makes, and so in its twins
OUTPUT_NAMES = {MANIFEST, TOKENIZER_FILE, TWIN_MARKER, "dev.json", "test.json",
                *(f"{split}.{side}.{suffix}" for split in SPLITS for side in ("src", "tgt")
                  for suffix in ("ids", "offsets", "lengths"))}  # all a preparation holds


class NoneFits(CorpusError):
    """Every example of a split is longer than max_len tokens."""


@dataclasses.dataclass(frozen=True)
class Encoding:
    """How to encode: SentencePiece settings for a tokenizer trained here, or the
    `tokenizer` to use (ours, a resumed run's, or a checkpoint's with its `tokenizer_id`),
    and the longest example in tokens with its eos or bos. `seed` holds out dev and test
    and samples the tokenizer's training examples."""
    max_len: int
    seed: int = 0
    vocab_size: int = 8000
    tokenizer_type: str = "unigram"
    tokenizer: object | None = None  # Tokenizer or a CheckpointTokenizer; None: train one
    tokenizer_id: str | None = None  # what identifies a given tokenizer (default: its file)
    unknown_ids: tuple[int, int] = (1, 1)  # each side's <unk> id, for a given tokenizer


def key(corpus: Corpus, encoding: Encoding) -> dict:
    """What a prepared directory is the preparation of, less its files' contents."""
    tokenizer = encoding.tokenizer
    if tokenizer is not None and encoding.tokenizer_id is None:
        tokenizer_id = "sha256:" + file_sha256(tokenizer.path)
    else:
        tokenizer_id = encoding.tokenizer_id
    return {"format": FORMAT, "unit": corpus.unit, "corpus": corpus.settings,
            "files": [str(Path(f).resolve()) for f in corpus.files],
            "max_len": encoding.max_len, "seed": encoding.seed,
            "tokenizer": tokenizer_id or {"vocab_size": encoding.vocab_size,
                                          "type": encoding.tokenizer_type}}


@dataclasses.dataclass(frozen=True)
class Share:
    """This process's share of a preparation that several processes (hosts) make together
    in one directory they all see: process `index` of `count`; `barrier(name)` returns
    once every process has called it."""
    index: int = 0
    count: int = 1
    barrier: Callable[[str], None] = lambda name: None


def prepare(output: str | os.PathLike, corpus: Corpus, encoding: Encoding,
            log: Log = print, progress: bool = True, workers: int | None = None,
            share: Share = Share()) -> Prepared | None:
    """Prepare `corpus` into directory `output` (replaced whole, at the end); returns it
    (on process 0 of a `share`d preparation; None on the others). `workers`: processes
    that encode this process's part (default: the cores it may use). Shared, process 0
    reads the corpus and trains the tokenizer, every process encodes its share of each
    split, and process 0 joins the parts."""
    output, primary = Path(os.path.abspath(output)), share.index == 0  # "." has a name
    if primary:
        check_output(output, corpus)
    tmp = output.with_name(f"{output.name}.tmp-" + (str(os.getpid()) if share.count == 1
                                                     else "shared"))
    if primary:
        output.parent.mkdir(parents=True, exist_ok=True)
        for stale in [*output.parent.glob(f"{output.name}.tmp-*"),
                      *output.parent.glob(f"{output.name}.old-*")]:
            if (not _running(stale.name.rsplit("-", 1)[1]) and not stale.is_symlink()
                    and (stale / TWIN_MARKER).is_file()):  # an interrupted preparation's
                shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.mkdir()
        except FileExistsError:
            raise CorpusError(f"{tmp} is in the way and is not a preparation's twin (it has "
                              f"no {TWIN_MARKER}), so it is not removed: move it away") from None
        (tmp / TWIN_MARKER).write_text("made by jaxformer-prepare, which may remove it\n")
    try:
        stages = _Stages(tmp, corpus, encoding, log, progress)
        if primary:
            stages.read_and_plan()
        share.barrier("corpus read")
        stages.encode(share, workers or len(os.sched_getaffinity(0)))
        if not primary:
            return None
        (tmp / MANIFEST).write_text(json.dumps(stages.manifest(), indent=1) + "\n")
        _replace_directory(tmp, output)
    finally:
        if primary:
            shutil.rmtree(tmp, ignore_errors=True)
    return Prepared(output)


def check_output(output: Path, corpus: Corpus) -> None:
    """A CorpusError unless `output` may be replaced whole: absent, an empty directory, or
    a preparation (a manifest with a key, and no names but a preparation's) that holds no
    file of `corpus`."""
    if output.is_symlink():
        raise CorpusError(f"{output} is a symbolic link: name a directory of its own")
    if output.exists() and not output.is_dir():
        raise CorpusError(f"{output} is a file, not a directory")
    inside = [f for f in corpus.files if Path(f).resolve().is_relative_to(output.resolve())]
    if inside:
        raise CorpusError(f"{inside[0]} is inside {output}, which a preparation replaces whole: "
                          "prepare into another directory")
    if not output.is_dir() or not any(output.iterdir()):
        return
    others = sorted(entry.name for entry in output.iterdir() if entry.name not in OUTPUT_NAMES)
    if others or not _has_key(output / MANIFEST):
        raise CorpusError(f"{output} is not a prepared corpus (it holds "
                          f"{listing(others or sorted(e.name for e in output.iterdir()))}); "
                          "preparing there would replace it and delete them: choose a new "
                          "or empty directory")


def _has_key(manifest: Path) -> bool:
    """Whether `manifest` is a preparation's: a regular file, a JSON object with a key."""
    try:
        written = not manifest.is_symlink() and json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(written, dict) and "key" in written


def _running(pid: str) -> bool:
    """Whether process `pid` (of this machine) is alive."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:  # someone else's
        return True
    return True


def stopped_preparing(directory) -> str:
    """What a stop (SIGINT, SIGTERM) during a preparation of `directory` says."""
    return (f"stopped while preparing {directory}: nothing of it is kept (the next "
            "preparation removes its temporary twin); run the same command to prepare it")


class _Stages:
    """One preparation's stages, in its temporary directory `tmp`: read_and_plan (process
    0: read, split, train the tokenizer; tmp/raw/plan.json tells the others what to encode),
    encode (every process its share of each split; process 0 joins and checks each split
    once all have encoded it), manifest (process 0)."""

    def __init__(self, tmp: Path, corpus: Corpus, encoding: Encoding, log: Log,
                 progress: bool):
        self.tmp, self.corpus, self.encoding, self.log = tmp, corpus, encoding, log
        self.progress, self.started = progress, time.monotonic()
        self.lines = []  # the log lines a run repeats when it uses the directory
        self.seconds = {}  # each stage's

    def say(self, line: str) -> None:
        self.lines.append(line)
        self.log(line)

    def stage(self, name: str, began: float) -> None:
        self.seconds[name] = round(time.monotonic() - began, 2)

    def read_and_plan(self) -> None:
        """Read and split the corpus, train (or take) the tokenizer, write the held-out
        texts and the plan."""
        corpus, encoding, tmp = self.corpus, self.encoding, self.tmp
        raw = read_splits(tmp / "raw", corpus, encoding.seed, self.say, self.progress)
        self.files = [{"path": str(Path(f).resolve()), "size": Path(f).stat().st_size,
                       "mtime_ns": Path(f).stat().st_mtime_ns, "sha256": file_sha256(f)}
                      for f in corpus.files]
        self.stage("read", self.started)
        began = time.monotonic()
        tokenizer = encoding.tokenizer
        if tokenizer is None:
            tokenizer = _train_tokenizer(tmp / TOKENIZER_FILE, raw["train"], encoding, self.say)
        elif isinstance(tokenizer, Tokenizer):
            link_or_copy(tokenizer.path, tmp / TOKENIZER_FILE)
        # A checkpoint's tokenizer (its language codes, two vocabularies) keeps int32 ids.
        dtype = (ids_dtype(tokenizer.vocab_size) if isinstance(tokenizer, Tokenizer)
                 else np.dtype(np.int32))
        self.stage("tokenizer", began)
        for split, texts in raw.items():
            np.save(tmp / "raw" / f"{split}.index.npy", texts.index)
            if split != "train":
                write_examples(tmp / f"{split}.json", texts)
        (tmp / "raw" / "plan.json").write_text(json.dumps({
            "dtype": dtype.name, "sides": list(corpus.sides),
            "unknown_ids": list(encoding.unknown_ids if encoding.tokenizer is not None
                                else (UNK_ID, UNK_ID)),
            "splits": {split: {"store": texts.name, "count": len(texts)}
                       for split, texts in raw.items()}}))

    def encode(self, share: Share, workers: int) -> None:
        """Each split, the small ones first (a refusal comes early): this process's share,
        in parts (tmp/raw/SPLIT.pP.partK.*); then, on process 0, all parts joined."""
        began, tmp = time.monotonic(), self.tmp
        self.plan = plan = json.loads((tmp / "raw" / "plan.json").read_text())
        tokenizer = self.encoding.tokenizer or Tokenizer(tmp / TOKENIZER_FILE)
        self.splits = {}
        for split in ("test", "dev", "train"):
            self._encode_share(split, tokenizer, share, workers)
            share.barrier(f"corpus {split} encoded")
            if share.index == 0:
                self.splits[split] = self._join(split, np.dtype(plan["dtype"]))
        self.stage("encode", began)

    def _encode_share(self, split: str, tokenizer, share: Share, workers: int) -> None:
        """Examples [count * i / n, count * (i + 1) / n) of the split, process i of n, in
        parts of at least PART_EXAMPLES, one worker process a part (one part: here)."""
        tmp, plan = self.tmp, self.plan
        count = plan["splits"][split]["count"]
        first, last = count * share.index // share.count, count * (share.index + 1) // share.count
        parts = max(1, min(workers, (last - first) // PART_EXAMPLES))
        if not isinstance(tokenizer, Tokenizer):  # a checkpoint's: here, pair by pair
            parts = 1
        bounds = [first + (last - first) * k // parts for k in range(parts + 1)]
        jobs = [encode_worker.Job(
            raw=str(tmp / "raw"), split=split, store=plan["splits"][split]["store"],
            start=a, stop=b, output=str(tmp / "raw" / f"{split}.p{share.index}.part{k}"),
            sides=plan["sides"], max_len=self.encoding.max_len,
            unknown_ids=plan["unknown_ids"], dtype=plan["dtype"],
            tokenizer=str(getattr(tokenizer, "path", "")))
            for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        bar = progress_bar(total=last - first, desc=f"encode {split}", unit=" examples",
                           disable=not self.progress, mininterval=1, delay=1)
        with bar:
            if parts == 1:
                encode_worker.encode(jobs[0], tokenizer, bar.update)
            else:
                encode_worker.run(jobs, bar)

    def manifest(self) -> dict:
        plan, splits = self.plan, self.splits
        shutil.rmtree(self.tmp / "raw")
        self.stage("total", self.started)
        self.say(f"prepared in {self.seconds['total']:.1f} s: "
                 + ", ".join(f"{split} {s['examples']:,}" for split, s in splits.items()))
        tokenizer_file = self.tmp / TOKENIZER_FILE
        return {"format": FORMAT, "key": key(self.corpus, self.encoding), "files": self.files,
                "tokenizer_sha256": (file_sha256(tokenizer_file) if tokenizer_file.exists()
                                     else None),
                "ids_dtype": plan["dtype"], "sides": plan["sides"], "splits": splits,
                "seconds": self.seconds, "log": self.lines}

    def _join(self, split: str, dtype: np.dtype) -> dict:
        """tmp/SPLIT.* from its parts (of every process, in order), checked: its manifest
        entry."""
        tmp, unit, max_len = self.tmp, self.corpus.unit, self.encoding.max_len
        parts = sorted((json.loads(path.read_text()) for path in
                        (tmp / "raw").glob(f"{split}.p*.part*.json")),
                       key=lambda summary: summary["start"])
        for side in self.plan["sides"]:
            encode_worker.join_parts(tmp, f"{split}.{side}",
                                     [f"{summary['output']}.{side}" for summary in parts], dtype)
        kept, count = sum(s["kept"] for s in parts), self.plan["splits"][split]["count"]
        report = CorpusReport(f"tokenized (max_len {max_len})", unit=unit, kept=kept)
        for summary in parts:
            if summary["too_long"]:
                report.skipped[TOO_MANY_TOKENS] += summary["too_long"]
                report.first_line.setdefault(TOO_MANY_TOKENS,
                                             summary["start"] + summary["first_too_long"])
        if not kept:
            raise NoneFits(f"every {unit[:-1] if unit == 'pairs' else 'line'} of the {split} "
                           f"split ({count}) is longer than max_len {max_len} tokens with its "
                           f"{'eos or bos' if unit == 'pairs' else 'bos or eos'}")
        if report.skipped:
            self.say(f"{split}: {report}")
        many_unknown = sum(s["many_unknown"] for s in parts)
        if many_unknown:
            line = (f"{split}: {many_unknown} of {kept} {unit} ({many_unknown / kept:.1%}) are "
                    f"{UNKNOWN_SHARE:.0%} or more unknown pieces (<unk>) to the tokenizer")
            if many_unknown > MOSTLY_UNKNOWN * kept:
                raise CorpusError(f"{line}: is the text in the languages (and script) it was "
                                  "made for? Fix the corpus, or use another checkpoint's "
                                  "tokenizer")
            self.say(line)
        src, tgt = (TokenStore.open(tmp, f"{split}.{side}", dtype)
                    if side in self.plan["sides"] else None for side in ("src", "tgt"))
        return {"examples": kept, "fingerprint": fingerprint([src, tgt]),
                "many_unknown": many_unknown, "read": count, "parts": len(parts),
                "encode_seconds": sum(s["seconds"] for s in parts)}


# --- 3. the tokenizer ----------------------------------------------------------------------

def _train_tokenizer(path: Path, train: RawSplit, encoding: Encoding, say: Log) -> Tokenizer:
    """tokenizing.train_tokenizer's sample and sentence order, streamed from the raw store."""
    chosen = np.arange(len(train))
    if len(train) > TOKENIZER_SAMPLE:
        chosen = np.sort(np.random.default_rng(encoding.seed).choice(
            len(train), TOKENIZER_SAMPLE, replace=False))
    sample = RawSplit(train.name, train.stores, train.index[chosen])
    started = time.monotonic()
    tokenizer = Tokenizer.train((text for example in sample.texts() for text in example), path,
                                vocab_size=encoding.vocab_size,
                                model_type=encoding.tokenizer_type)
    say(f"vocabulary: {tokenizer.vocab_size} pieces ({encoding.tokenizer_type}), trained on "
        f"{len(sample):,} {'examples' if len(sample) < len(train) else 'training examples'} "
        f"in {time.monotonic() - started:.1f} s")
    return tokenizer


# --- 4. encode -----------------------------------------------------------------------------

def _replace_directory(new: Path, output: Path) -> None:
    """Put directory `new` in `output`'s place: a reader sees the old one whole, or the new
    one whole, or (between the two renames, after a crash) none."""
    for path in new.iterdir():
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    old = output.with_name(f"{output.name}.old-{os.getpid()}")
    if output.exists():
        os.rename(output, old)
    os.rename(new, output)
    shutil.rmtree(old, ignore_errors=True)
    dir_fd = os.open(output.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
