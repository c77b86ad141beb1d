"""From sentence pairs to fixed-shape, token-budget batches that resume exactly.

    pairs --train_tokenizer--> Tokenizer (one vocabulary for both sides)
    pairs --encode_pairs-----> src_ids, tgt_ids (int32 piece arrays, no specials)
          --BucketedBatches--> {"src": (B, S), "tgt_in": (B, T), "tgt_out": (B, T)}

Shapes. The source is padded to the smallest bucket length S >= len(src) + 1
(+1 for eos), the target to the smallest T >= len(tgt) + 1 (+1 for bos on the
decoder input); pairs with the same (S, T) share a bucket. A bucket's batch
size is fixed, B = max_tokens // max(S, T) rounded down to a multiple of
`batch_multiple`, so B * max(S, T) <= max_tokens and B splits evenly over
devices. A bucket's last, partial batch is filled with
all-pad rows (src[:, 0] == PAD_ID marks them; their labels are all pad, so a
pad-masked loss ignores them). `BucketedBatches.shapes()` lists every shape an
epoch yields: jit compiles once per entry, and never again.

Resume. The batch plan of epoch e is a pure function of (seed, e): examples are
shuffled within their bucket, cut into batches, and the batches shuffled
across buckets. A `BatchIterator`'s position is {"epoch": e, "index": i, ...}, so a
run restored from a checkpoint sees exactly the batches an uninterrupted run
would have seen. Needs numpy and sentencepiece, not JAX.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
from typing import Iterable, Iterator, Sequence

import numpy as np

from jax_transformer.data.corpora import CorpusError, CorpusReport, Pair
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer

DEFAULT_BUCKETS = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
TOO_MANY_TOKENS = "too many tokens"  # skip reason counted by encode_pairs
ENCODE_CHUNK = 10_000  # pairs per SentencePiece call in encode_pairs


def train_tokenizer(pairs: Sequence[Pair], model_path: str | os.PathLike,
                    vocab_size: int = 8000, model_type: str = "unigram",
                    max_pairs: int = 1_000_000, seed: int = 0) -> Tokenizer:
    """Train one SentencePiece vocabulary on both sides of `pairs`; save to `model_path`.

    `model_type` is "unigram" or "bpe" (the paper's byte-pair encoding). Corpora
    of more than `max_pairs` pairs are sampled (by `seed`) first, as SentencePiece's
    own input_sentence_size would, to bound its memory and time.
    """
    if len(pairs) > max_pairs:
        chosen = np.random.default_rng(seed).choice(len(pairs), max_pairs, replace=False)
        pairs = [pairs[i] for i in np.sort(chosen)]
    sentences = (sentence for pair in pairs for sentence in pair)
    return Tokenizer.train(sentences, model_path, vocab_size=vocab_size, model_type=model_type)


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[Pair], max_len: int = 256,
                 ) -> tuple[list[np.ndarray], list[np.ndarray], CorpusReport]:
    """Encode pairs into piece ids, dropping those that do not fit `max_len` tokens.

    Returns (src_ids, tgt_ids, report): two lists of int32 arrays (pieces only;
    batches add eos/bos) and a report of how many pairs were dropped because a
    side needs more than `max_len` positions with its eos/bos (the report's
    "line" is the pair's 1-based position in `pairs`).
    """
    if not pairs:
        raise CorpusError("encode_pairs got no pairs")
    report = CorpusReport(f"tokenized (max_len {max_len})")
    src_ids, tgt_ids = [], []
    for start in range(0, len(pairs), ENCODE_CHUNK):  # bounds the Python lists alive at once
        src_texts, tgt_texts = zip(*pairs[start:start + ENCODE_CHUNK])
        encoded = zip(tokenizer.sp.encode(list(src_texts)), tokenizer.sp.encode(list(tgt_texts)))
        for number, (src, tgt) in enumerate(encoded, start=start + 1):
            if max(len(src), len(tgt)) + 1 > max_len:
                report.skip(TOO_MANY_TOKENS, number)
                continue
            src_ids.append(np.asarray(src, dtype=np.int32))
            tgt_ids.append(np.asarray(tgt, dtype=np.int32))
    report.kept = len(src_ids)
    if not src_ids:
        raise CorpusError(f"{report}: every pair is longer than max_len {max_len} tokens")
    return src_ids, tgt_ids, report


def bucket_lengths(max_len: int, buckets: Iterable[int] = DEFAULT_BUCKETS) -> list[int]:
    """The bucket lengths below `max_len`, then `max_len` itself, ascending."""
    return sorted({b for b in buckets if b < max_len} | {max_len})


def padded_length(length: int, boundaries: Sequence[int]) -> int:
    """The smallest of the ascending `boundaries` that holds `length` positions."""
    return int(boundaries[np.searchsorted(boundaries, length)])


@dataclasses.dataclass(frozen=True)
class Bucket:
    src_length: int  # S: sources padded to this many positions
    tgt_length: int  # T: targets padded to this many positions
    batch_size: int  # B: rows per batch, B * max(S, T) <= max_tokens
    examples: np.ndarray  # (n,) indices of the pairs in this bucket, ascending

    @property
    def num_batches(self) -> int:
        return -(-len(self.examples) // self.batch_size)


class BucketedBatches:
    """One split's encoded pairs, served as length-bucketed fixed-shape batches."""

    def __init__(self, src_ids: Sequence[np.ndarray], tgt_ids: Sequence[np.ndarray],
                 max_tokens: int, batch_multiple: int = 1,
                 buckets: Iterable[int] = DEFAULT_BUCKETS, shuffle: bool = True,
                 seed: int = 0):
        """`max_tokens` bounds B * L per batch (padded positions of one side, as
        fairseq's --max-tokens); `batch_multiple` is usually the device count;
        `shuffle=False` gives a fixed order for evaluation (buckets in length order)."""
        if len(src_ids) != len(tgt_ids) or not src_ids:
            raise CorpusError(f"need equally many source and target examples, at least one; "
                             f"got {len(src_ids)} and {len(tgt_ids)}")
        if batch_multiple < 1:
            raise CorpusError(f"batch_multiple must be positive, got {batch_multiple}")
        self.src_ids, self.tgt_ids = src_ids, tgt_ids
        self.shuffle, self.seed = shuffle, seed
        boundaries = np.array(sorted(set(buckets)))
        # Positions each side needs: pieces + eos (source), bos + pieces (target).
        # Each side is padded to its own bucket, so a short target is not padded
        # to its source's length (number words: ~5 German pieces, ~12 English).
        src_needed = np.array([len(s) + 1 for s in src_ids])
        tgt_needed = np.array([len(t) + 1 for t in tgt_ids])
        longest = max(src_needed.max(), tgt_needed.max())
        if longest > boundaries[-1]:
            raise CorpusError(f"a pair needs {longest} positions, more than the largest "
                             f"bucket {boundaries[-1]}; encode with max_len <= it")
        src_bucket = np.searchsorted(boundaries, src_needed)  # smallest boundary >= needed
        tgt_bucket = np.searchsorted(boundaries, tgt_needed)
        self.buckets: list[Bucket] = []
        for b_src, b_tgt in sorted(set(zip(src_bucket.tolist(), tgt_bucket.tolist()))):
            examples = np.flatnonzero((src_bucket == b_src) & (tgt_bucket == b_tgt))
            S, T = int(boundaries[b_src]), int(boundaries[b_tgt])
            batch_size = max_tokens // max(S, T) // batch_multiple * batch_multiple
            if batch_size == 0:
                raise CorpusError(f"max_tokens {max_tokens} cannot hold {batch_multiple} rows of "
                                 f"length {max(S, T)}; need max_tokens >= "
                                 f"{batch_multiple * max(S, T)}")
            self.buckets.append(Bucket(S, T, int(batch_size), examples))
        self.num_batches = sum(bucket.num_batches for bucket in self.buckets)  # per epoch

    @functools.cached_property
    def fingerprint(self) -> str:
        """A digest of the encoded examples, in order: saved positions are only valid
        for the same data."""
        digest = hashlib.sha256()
        for ids in (self.src_ids, self.tgt_ids):
            for start in range(0, len(ids), ENCODE_CHUNK):
                chunk = ids[start:start + ENCODE_CHUNK]
                digest.update(np.array([len(x) for x in chunk], np.int64).tobytes())
                digest.update(np.concatenate(chunk).astype(np.int32).tobytes())
        return digest.hexdigest()[:16]

    def shapes(self) -> list[tuple[int, int, int]]:
        """Every (B, S, T) an epoch yields: src is (B, S), tgt_in and tgt_out (B, T)."""
        return [(bucket.batch_size, bucket.src_length, bucket.tgt_length)
                for bucket in self.buckets]

    def epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
        """The batches of `epoch` as (bucket index, example indices), a function of (seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
        plan = []
        for b, bucket in enumerate(self.buckets):
            order = rng.permutation(bucket.examples) if rng is not None else bucket.examples
            plan += [(b, order[start:start + bucket.batch_size])
                     for start in range(0, len(order), bucket.batch_size)]
        if rng is not None:
            plan = [plan[i] for i in rng.permutation(len(plan))]
        return plan

    def make_batch(self, bucket_index: int, examples: np.ndarray) -> dict[str, np.ndarray]:
        """Pad the given examples into one batch of the bucket's shape."""
        bucket = self.buckets[bucket_index]
        src = np.full((bucket.batch_size, bucket.src_length), PAD_ID, np.int32)  # pieces + [eos]
        tgt_in = np.full((bucket.batch_size, bucket.tgt_length), PAD_ID, np.int32)  # [bos] + pieces
        tgt_out = np.full_like(tgt_in, PAD_ID)  # pieces + [eos]
        for row, i in enumerate(examples):  # rows past len(examples) stay all-pad
            s, t = self.src_ids[i], self.tgt_ids[i]
            src[row, :len(s)] = s
            src[row, len(s)] = EOS_ID
            tgt_in[row, 0] = BOS_ID
            tgt_in[row, 1:len(t) + 1] = t
            tgt_out[row, :len(t)] = t
            tgt_out[row, len(t)] = EOS_ID
        return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}

    def epoch(self, epoch: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """One pass over the split (e.g. for evaluation)."""
        for bucket_index, examples in self.epoch_plan(epoch):
            yield self.make_batch(bucket_index, examples)

    def iterator(self, state: dict | None = None) -> "BatchIterator":
        """An endless iterator over epochs 0, 1, 2, ..., or from a saved `state`."""
        iterator = BatchIterator(self)
        if state is not None:
            iterator.set_state(state)
        return iterator


class BatchIterator:
    """Endless, resumable iteration over the epochs of a `BucketedBatches`.

    get_state() -> {"epoch": e, "index": i, "num_batches": n, "fingerprint": f}:
    JSON-able; `index` is the next batch within epoch e; `num_batches` (per
    epoch) and the data's `fingerprint` let set_state refuse a state saved for
    different data or batch settings.
    """

    def __init__(self, batches: BucketedBatches):
        self.batches = batches
        self.epoch, self.index = 0, 0
        self._plan_epoch, self._plan = None, []

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._plan_epoch != self.epoch:
            self._plan_epoch, self._plan = self.epoch, self.batches.epoch_plan(self.epoch)
        batch = self.batches.make_batch(*self._plan[self.index])
        self.index += 1
        if self.index == self.batches.num_batches:
            self.epoch, self.index = self.epoch + 1, 0
        return batch

    def get_state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index,
                "num_batches": self.batches.num_batches, "fingerprint": self.batches.fingerprint}

    def set_state(self, state: dict) -> None:
        saved = state.get("fingerprint", self.batches.fingerprint)  # older checkpoints have none
        if saved != self.batches.fingerprint:
            raise CorpusError(f"iterator state {state} was saved for other data (fingerprint "
                              f"{saved}; these data give {self.batches.fingerprint})")
        if state.get("num_batches") != self.batches.num_batches:
            raise CorpusError(f"iterator state {state} was saved for {state.get('num_batches')} "
                             f"batches per epoch, these data give {self.batches.num_batches}; "
                             "resume with the same corpus, max_tokens, buckets and max_len")
        if not 0 <= state["index"] < self.batches.num_batches or state["epoch"] < 0:
            raise CorpusError(f"iterator state {state} is out of range")
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
