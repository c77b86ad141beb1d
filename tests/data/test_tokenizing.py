"""The tokenizer and encoding (data/tokenizing.py): a round trip, a stop while it
trains, long pairs dropped and counted."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jax_transformer.data import tokenizing
from jax_transformer.data.corpora import number_corpus
from jax_transformer.data.tokenizing import TOO_MANY_TOKENS, encode_pairs, train_tokenizer
from transformer_core.tokenizer import EOS_ID

REPO = Path(__file__).resolve().parents[2]


# --- Tokenizer and encoding -----------------------------------------------------------------

@pytest.fixture(scope="module")
def numbers_and_tokenizer(tmp_path_factory):
    corpus = number_corpus(num_train=2000, num_dev=100, num_test=200, seed=0)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    return corpus, train_tokenizer(corpus["train"], path, vocab_size=300)


def test_tokenizer_round_trip_on_held_out_numbers(numbers_and_tokenizer):
    corpus, tokenizer = numbers_and_tokenizer
    for src, tgt in corpus["test"]:
        for text in (src, tgt):
            ids = tokenizer.encode(text)
            assert all(i > EOS_ID for i in ids), text  # no unk, no specials
            assert tokenizer.decode(ids + [EOS_ID, 7]) == text


# Trains a tokenizer with a command's stop handlers (exit_codes.run), and sends itself
# SIGTERM once SentencePiece has read every sentence and trains in C++; stderr's first line
# is when the signal went.
TRAIN_AND_STOP = """
import os, random, signal, sys, threading, time
from jax_transformer.commands import exit_codes
from transformer_core.tokenizer import Tokenizer

def sentences():
    rng = random.Random(0)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))
             for _ in range(20000)]
    for _ in range(60000):
        yield " ".join(rng.choices(words, k=12))
    threading.Timer(0.5, lambda: (print(time.time(), file=sys.stderr, flush=True),
                                  os.kill(os.getpid(), signal.SIGTERM))).start()

sys.exit(exit_codes.run(lambda argv: Tokenizer.train(sentences(), sys.argv[1], 8000) and None))
"""


@pytest.mark.slow  # a subprocess that trains a tokenizer for seconds
def test_sigterm_stops_tokenizer_training_at_once(tmp_path):
    """Before: SentencePiece's training in the main thread kept the handler waiting until it
    returned (~18 s on a real corpus)."""
    result = subprocess.run([sys.executable, "-c", TRAIN_AND_STOP, str(tmp_path / "t.model")],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    sent, stopped = [line for line in result.stderr.splitlines() if line]
    assert stopped == "SIGTERM: stopped"
    assert ended - float(sent) < 2, f"stopped {ended - float(sent):.1f} s after SIGTERM"
    assert not (tmp_path / "t.model").exists()


def test_encode_pairs_drops_and_counts_long_pairs(numbers_and_tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizing, "ENCODE_CHUNK", 7)  # encode in several chunks
    corpus, tokenizer = numbers_and_tokenizer
    pairs = corpus["dev"]
    src_ids, tgt_ids, report = encode_pairs(tokenizer, pairs, max_len=10)
    fits = [max(len(tokenizer.encode(s)), len(tokenizer.encode(t))) + 1 <= 10 for s, t in pairs]
    assert 0 < report.kept == sum(fits) == len(src_ids) == len(tgt_ids) < len(pairs)
    assert report.skipped == {TOO_MANY_TOKENS: len(pairs) - sum(fits)}
    assert report.first_line == {TOO_MANY_TOKENS: fits.index(False) + 1}
    kept = [pair for pair, fit in zip(pairs, fits) if fit]
    assert [(tokenizer.decode(s), tokenizer.decode(t)) for s, t in zip(src_ids, tgt_ids)] == kept
    assert src_ids[0].dtype == tgt_ids[0].dtype == np.int32
