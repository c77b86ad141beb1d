"""One part of a split encoded, in a process of its own: `python -m
jax_transformer.data.prepared.encode_worker JOB.json`; `run` starts one a part
(pipeline.py: one a core) and `join_parts` joins their stores in order.

It reads examples start..stop of the split from the raw stores (the split's order is
RAW/SPLIT.index.npy, rows of RAW/STORE.SIDE.*), encodes them as tokenizing.encode_pairs
would (our tokenizer a chunk of texts a call; a checkpoint's pair by pair), drops those
over max_len, and writes OUTPUT.SIDE.* (store.py) and, last, OUTPUT.json: how many it
kept, how many were too long (and the first, counted from `start`), how many are mostly
<unk>, its seconds. A process of its own, not a thread or a fork: the Python work
(decoding, numpy) runs on every core, and the parent's threads (JAX's) are not copied.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.prepared.store import StoreWriter, TokenStore
from jax_transformer.data.tokenizing import UNKNOWN_SHARE
from transformer_core.errors import InputError
from transformer_core.tokenizer import Tokenizer

CHUNK = 10_000  # examples encoded and written at a time
PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent ends


@dataclasses.dataclass
class Job:
    raw: str  # the raw stores' directory
    split: str  # its order is RAW/SPLIT.index.npy, rows of the raw stores RAW/STORE.SIDE.*
    store: str
    start: int
    stop: int
    output: str  # OUTPUT.SIDE.* and OUTPUT.json
    sides: list[str]  # ["src", "tgt"], or ["tgt"] for a language model's lines
    max_len: int
    unknown_ids: list[int]  # each side's <unk>
    dtype: str  # the ids' type
    tokenizer: str  # our tokenizer's model file ("" for a checkpoint's, encoded in-process)
    parent: int = 0  # the preparing process, which a worker dies with


def encode(job: Job, tokenizer, progress: Callable[[int], object] = lambda n: None) -> None:
    """Encode the job's examples with `tokenizer` (ours, or a checkpoint's)."""
    began, raw = time.monotonic(), Path(job.raw)
    index = np.load(raw / f"{job.split}.index.npy", mmap_mode="r")[job.start:job.stop]
    stores = [TokenStore.open(raw, f"{job.store}.{side}", np.uint8) for side in job.sides]
    writers = [StoreWriter(Path(job.output).parent, f"{Path(job.output).name}.{side}",
                           np.dtype(job.dtype)) for side in job.sides]
    kept = too_long = many_unknown = 0
    first_too_long = None
    for first in range(0, len(index), CHUNK):
        rows = np.asarray(index[first:first + CHUNK])
        texts = [texts_of(store, rows) for store in stores]
        pieces = _encode(tokenizer, texts, job.start + first)  # per side: lists of ids
        fits = np.array([max(map(len, example)) + 1 <= job.max_len
                         for example in zip(*pieces)])
        if not fits.all():
            too_long += int((~fits).sum())
            if first_too_long is None:
                first_too_long = first + int(np.argmin(fits)) + 1
        unknown = np.zeros(int(fits.sum()), bool)
        for writer, side_pieces, unk in zip(writers, pieces, job.unknown_ids):
            kept_pieces = [p for p, ok in zip(side_pieces, fits) if ok]
            lengths = np.fromiter(map(len, kept_pieces), np.int64, len(kept_pieces))
            ids = np.fromiter(itertools.chain.from_iterable(kept_pieces), np.int64,
                              int(lengths.sum()))
            writer.add(lengths, ids)
            # count_many_unknown's rule: a non-empty side UNKNOWN_SHARE or more <unk>.
            sentence = np.repeat(np.arange(len(lengths)), lengths)  # each id's sentence
            unknown_count = np.bincount(sentence[ids == unk], minlength=len(lengths))
            unknown |= (lengths > 0) & (unknown_count >= UNKNOWN_SHARE * lengths)
        kept += int(fits.sum())
        many_unknown += int(unknown.sum())
        progress(len(rows))
    for writer in writers:
        writer.close()
    Path(f"{job.output}.json").write_text(json.dumps(
        {"start": job.start, "output": job.output, "kept": kept, "too_long": too_long,
         "first_too_long": first_too_long, "many_unknown": many_unknown,
         "seconds": round(time.monotonic() - began, 2)}))


def texts_of(store: TokenStore, rows: np.ndarray) -> list[str]:
    """The UTF-8 texts of a raw store's `rows`."""
    return [text.decode("utf-8") for text in store.each(rows)]


def _encode(tokenizer, texts: list[list[str]], first_number: int) -> list[list[list[int]]]:
    """Each side's pieces: our tokenizer's a side at a time; a checkpoint's (source
    pieces less the final eos, target pieces) pair by pair."""
    if isinstance(tokenizer, Tokenizer):
        return [tokenizer.sp.encode(side, num_threads=1) for side in texts]
    sources, targets = [], []
    for number, (src, tgt) in enumerate(zip(*texts), start=first_number + 1):
        try:
            sources.append(tokenizer.encode_source(src)[:-1])
            targets.append(tokenizer.encode_target(tgt))
        except InputError as e:  # e.g. a language code the vocabulary lacks
            raise CorpusError(f"pair {number} {e}") from None
    return [sources, targets]


# --- in the preparing process --------------------------------------------------------------

def run(jobs: list[Job], bar: tqdm) -> None:
    """One encode_worker process a job; the bar follows the lengths they have written. A
    worker that fails stops the others (RuntimeError with its stderr's end)."""
    procs = []
    for job in jobs:
        job = dataclasses.replace(job, parent=os.getpid())
        Path(f"{job.output}.job").write_text(json.dumps(dataclasses.asdict(job)))
        with open(f"{job.output}.err", "w") as err:  # no preexec_fn: no fork of JAX's threads
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "jax_transformer.data.prepared.encode_worker",
                 f"{job.output}.job"], stderr=err))
    try:
        codes = [None]
        while None in codes and not any(codes):  # some still run, none has failed
            time.sleep(0.5)
            bar.update(sum(_examples_written(job) for job in jobs) - bar.n)
            codes = [p.poll() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    # The worker that failed on its own, not one killed above because it did.
    failed_first = [p for p, code in zip(procs, codes) if code] or procs
    for job, p in zip(jobs, procs):
        if p.returncode and p in failed_first:
            error = Path(f"{job.output}.err").read_text().strip()[-2000:]
            raise RuntimeError(f"encoding examples {job.start}-{job.stop} of the {job.split} "
                               f"split failed (exit {p.returncode}): {error}")
    bar.update(bar.total - bar.n)


def _die_with(parent: int) -> None:
    """In a worker, first: the kernel kills it when the preparing process ends, however it
    ends (Linux's PR_SET_PDEATHSIG; elsewhere, nothing); and it ends at once if that
    process is gone already."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:
        sys.exit(f"the preparing process {parent} has ended")


def _examples_written(job: Job) -> int:
    try:
        return os.stat(f"{job.output}.{job.sides[-1]}.lengths").st_size // 2
    except OSError:
        return 0


def join_parts(directory: Path, name: str, parts: list[str], dtype: np.dtype) -> None:
    """DIR/NAME.* from the parts' stores, in order, a megabyte at a time."""
    if len(parts) == 1:
        for suffix in ("ids", "offsets", "lengths"):
            os.replace(f"{parts[0]}.{suffix}", directory / f"{name}.{suffix}")
        return
    with open(directory / f"{name}.ids", "wb") as ids, \
            open(directory / f"{name}.lengths", "wb") as lengths, \
            open(directory / f"{name}.offsets", "wb") as offsets:
        np.zeros(1, np.int64).tofile(offsets)
        end = 0
        for part in parts:
            for suffix, out in (("ids", ids), ("lengths", lengths)):
                with open(f"{part}.{suffix}", "rb") as f:
                    shutil.copyfileobj(f, out, 1 << 20)
            with open(f"{part}.offsets", "rb") as f:
                f.seek(8)  # its leading 0
                while True:
                    block = np.fromfile(f, np.int64, 1 << 17)
                    if not len(block):
                        break
                    (block + end).tofile(offsets)
            end += os.stat(f"{part}.ids").st_size // dtype.itemsize
        for f in (ids, lengths, offsets):
            f.flush()
            os.fsync(f.fileno())


def main(job_file: str) -> None:
    job = Job(**json.loads(Path(job_file).read_text()))
    _die_with(job.parent)
    encode(job, Tokenizer(job.tokenizer))


if __name__ == "__main__":
    main(sys.argv[1])
