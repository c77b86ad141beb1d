"""From text to piece ids: the run's SentencePiece vocabulary, and the corpus encoded.

    pairs or lines --train_tokenizer--> Tokenizer (one vocabulary for both sides)
    pairs --encode_pairs--> src_ids, tgt_ids (int32 piece arrays, no specials; with our
                            tokenizer or any checkpoint's, e.g. a converted Marian model's)
    lines --encode_lines--> ids, a language model's (batches.packed.PackedBatches(None, ids))

Examples longer than max_len tokens are skipped and counted. Needs numpy and
sentencepiece, not JAX.
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np

from jax_transformer.data.corpora import CorpusError, CorpusReport, Pair
from transformer_core.errors import InputError
from transformer_core.tokenizer import UNK_ID, CheckpointTokenizer, Tokenizer

TOO_MANY_TOKENS = "too many tokens"  # skip reason counted by encode_pairs
ENCODE_CHUNK = 10_000  # texts per SentencePiece call (encode_pairs, encode_lines)
# Examples a tokenizer trains on, at most: SentencePiece holds every sentence it trains
# on in memory (docs/data.md, "Prepared corpora").
TOKENIZER_SAMPLE = 250_000
UNKNOWN_SHARE = 0.25  # a text this much <unk> has many unknown pieces (prepared/encode_worker)


def train_tokenizer(examples: Sequence[Pair] | Sequence[str], model_path: str | os.PathLike,
                    vocab_size: int = 8000, model_type: str = "unigram",
                    max_pairs: int = TOKENIZER_SAMPLE, seed: int = 0) -> Tokenizer:
    """Train one SentencePiece vocabulary on both sides of sentence pairs (or on lines
    of text); save to `model_path`.

    `model_type` is "unigram" or "bpe" (the paper's byte-pair encoding). Corpora
    of more than `max_pairs` examples are sampled (by `seed`) first, as
    SentencePiece's own input_sentence_size would, to bound its memory and time.
    """
    if len(examples) > max_pairs:
        chosen = np.random.default_rng(seed).choice(len(examples), max_pairs, replace=False)
        examples = [examples[i] for i in np.sort(chosen)]
    sentences = (sentence for example in examples
                 for sentence in ((example,) if isinstance(example, str) else example))
    return Tokenizer.train(sentences, model_path, vocab_size=vocab_size, model_type=model_type)


def encode_pairs(tokenizer: CheckpointTokenizer, pairs: Sequence[Pair], max_len: int = 256,
                 name: str | None = None,
                 ) -> tuple[list[np.ndarray], list[np.ndarray], CorpusReport]:
    """Encode pairs into piece ids, dropping those that do not fit `max_len` tokens.

    Returns (src_ids, tgt_ids, report): two lists of int32 arrays (pieces only;
    batches add eos/bos) and a report of how many pairs were dropped because a
    side needs more than `max_len` positions with its eos/bos (the report's
    "line" is the pair's 1-based position in `pairs`). When none fits, the
    CorpusError names the pairs as `name` ("the test split"). Our tokenizer
    encodes ENCODE_CHUNK texts a call; any other checkpoint tokenizer (a converted
    Marian, FSMT or M2M100/NLLB model's, --init-from) one pair at a time:
    `encode_source` less its final eos, and `encode_target` (an M2M100/NLLB one's
    language codes included).
    """
    if not pairs:
        raise CorpusError("encode_pairs got no pairs")
    report = CorpusReport(f"tokenized (max_len {max_len})")
    src_ids, tgt_ids = [], []
    if isinstance(tokenizer, Tokenizer):
        encoded = zip(_encode(tokenizer, [src for src, _ in pairs]),
                      _encode(tokenizer, [tgt for _, tgt in pairs]))
    else:
        encoded = _encode_one_by_one(tokenizer, pairs)
    for number, (src, tgt) in enumerate(encoded, start=1):
        if max(len(src), len(tgt)) + 1 > max_len:
            report.skip(TOO_MANY_TOKENS, number)
            continue
        src_ids.append(np.asarray(src, dtype=np.int32))
        tgt_ids.append(np.asarray(tgt, dtype=np.int32))
    report.kept = len(src_ids)
    if not src_ids:
        raise CorpusError(f"every pair{_of(name, pairs)} is longer than max_len {max_len} "
                          "tokens with its eos or bos")
    return src_ids, tgt_ids, report


def encode_lines(tokenizer: Tokenizer, lines: Sequence[str], max_len: int = 256,
                 name: str | None = None) -> tuple[list[np.ndarray], CorpusReport]:
    """Encode a language model's lines into piece ids, dropping those that need more
    than `max_len` positions with their bos (or eos). Returns (ids, report), as
    `encode_pairs` does for pairs."""
    if not lines:
        raise CorpusError("encode_lines got no lines")
    report = CorpusReport(f"tokenized (max_len {max_len})", unit="lines")
    ids = []
    for number, pieces in enumerate(_encode(tokenizer, lines), start=1):
        if len(pieces) + 1 > max_len:
            report.skip(TOO_MANY_TOKENS, number)
            continue
        ids.append(np.asarray(pieces, dtype=np.int32))
    report.kept = len(ids)
    if not ids:
        raise CorpusError(f"every line{_of(name, lines)} is longer than max_len {max_len} "
                          "tokens with its bos or eos")
    return ids, report


def _of(name: str | None, examples: Sequence) -> str:
    """' of the test split (1)': what an error about all `examples` calls them."""
    return f" of {name} ({len(examples)})" if name else ""


def _encode(tokenizer: Tokenizer, texts: Sequence[str]) -> Iterator[list[int]]:
    """Each text's piece ids, encoded ENCODE_CHUNK texts at a time (one SentencePiece
    call each), which bounds the Python lists alive at once."""
    for start in range(0, len(texts), ENCODE_CHUNK):
        yield from tokenizer.sp.encode(list(texts[start:start + ENCODE_CHUNK]))


def _encode_one_by_one(tokenizer: CheckpointTokenizer,
                       pairs: Sequence[Pair]) -> Iterator[tuple[list[int], list[int]]]:
    """Each pair's (source pieces, target pieces) from a checkpoint's tokenizer."""
    for number, (src, tgt) in enumerate(pairs, start=1):
        try:
            yield tokenizer.encode_source(src)[:-1], tokenizer.encode_target(tgt)
        except InputError as e:  # e.g. a language code the vocabulary lacks
            raise CorpusError(f"pair {number} {e}") from None


def unknown_id(tokenizer, side: str) -> int:
    """The <unk> id of a side: a Marian or FSMT tokenizer's vocabulary of that side, an
    M2M100/NLLB tokenizer's, or ours."""
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, dict) and isinstance(vocab.get(side), dict):  # one per side
        return vocab[side]["<unk>"]
    return getattr(tokenizer, "unk_id", UNK_ID)
