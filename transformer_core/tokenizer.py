"""The tokenizer interface of a checkpoint, and our SentencePiece tokenizer with the
project's special ids.

One shared vocabulary for source and target (the paper's setting); the model
file is saved as `tokenizer.model` in the checkpoint directory. Needs neither
JAX nor torch.

    pad 0, unk 1, bos 2, eos 3   (TransformerConfig's defaults)
    source ids:     pieces + [eos]
    decoder input:  [bos] + pieces
    labels:         pieces + [eos]
"""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

import sentencepiece as spm

from transformer_core.errors import InputError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class TokenizerError(InputError):
    """A tokenizer model is missing, unreadable or does not fit the model."""


def in_a_thread(work: Callable[[], object]) -> None:
    """Run `work()` in a thread of its own and wait for it; its error is raised here.
    Python runs signal handlers in the main thread, between bytecodes: a long C++ call
    there (SentencePiece's training, which releases the GIL) would keep a command's
    SIGINT and SIGTERM handlers waiting until it returned, while a main thread that waits
    on another thread runs them at once. The thread is a daemon, so a process that stops
    does not wait for it."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # noqa: BLE001  (raised in the waiting thread)
            failure.append(error)

    thread = threading.Thread(target=run, name="sentencepiece-trainer", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def pieces_before_eos(ids: Sequence[int], eos_id: int, dropped: set[int],
                      pieces: dict[int, str]) -> list[str]:
    """The pieces of `ids` up to the first eos, the `dropped` ids (special tokens,
    language codes) left out; an id without a piece is "<unk>"."""
    kept = []
    for i in ids:
        i = int(i)
        if i == eos_id:
            break
        if i not in dropped:
            kept.append(pieces.get(i, "<unk>"))
    return kept


class CheckpointTokenizer(Protocol):
    """What translating and checking a checkpoint need of its tokenizer, whichever it is:
    ours (Tokenizer) or a converted model's (marian_tokenizer.MarianTokenizer);
    checkpoint_dir.load_tokenizer picks it."""

    def encode_source(self, text: str) -> list[int]:
        """Model-ready source ids, ending in eos."""

    def encode_target(self, text: str) -> list[int]:
        """Target-side ids without bos or eos (teacher forcing adds them)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids -> text, up to the first eos."""

    normalizes: bool  # whether `normalize` has a step to apply

    def normalize(self, text: str) -> str:
        """The text as the model's training data was pre-processed before tokenizing."""

    def check_fits(self, config) -> None:
        """Raise TokenizerError unless these ids fit the model config."""


class Tokenizer:
    """Our SentencePiece tokenizer (CheckpointTokenizer), shared by source and target."""

    def __init__(self, model_path: str | os.PathLike):
        path = Path(model_path)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model {path} does not exist")
        self.path = path
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.Load(str(path))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path} is not a SentencePiece model: {e}") from e

    @classmethod
    def train(cls, sentences: Iterable[str], model_path: str | os.PathLike,
              vocab_size: int = 8000, model_type: str = "unigram") -> "Tokenizer":
        """Train on `sentences` (source and target text together) and save to `model_path`."""
        model = io.BytesIO()
        try:
            in_a_thread(lambda: spm.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
                model_type=model_type, character_coverage=1.0, hard_vocab_limit=False,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                num_threads=os.cpu_count() or 1, minloglevel=2))
        except RuntimeError as e:  # "INTERNAL: src/trainer_interface.cc(638) [check] reason"
            reason = str(e).split("] ", 1)[-1].strip() or str(e)
            raise TokenizerError(f"SentencePiece cannot train {vocab_size} pieces on this "
                                 f"text: {reason}") from None
        Path(model_path).parent.mkdir(parents=True, exist_ok=True)
        Path(model_path).write_bytes(model.getvalue())
        return cls(model_path)

    @property
    def vocab_size(self) -> int:
        return self.sp.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        """Text -> piece ids, without special tokens."""
        return self.sp.EncodeAsIds(text)

    def encode_source(self, text: str) -> list[int]:
        return self.encode(text) + [EOS_ID]

    def encode_target(self, text: str) -> list[int]:
        return self.encode(text)

    normalizes = False  # train.py's corpora are tokenized as they are

    def normalize(self, text: str) -> str:
        return text

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text; stops at the first eos and drops pad/bos."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                pieces.append(i)
        return self.sp.DecodeIds(pieces)

    def check_fits(self, config) -> None:
        """Raise TokenizerError unless this tokenizer's ids fit the model config."""
        if self.vocab_size > min(config.src_vocab_size, config.tgt_vocab_size):
            raise TokenizerError(
                f"tokenizer {self.path} has {self.vocab_size} pieces but the model's "
                f"vocabulary is {config.src_vocab_size}/{config.tgt_vocab_size}")
        specials = (config.pad_id, config.bos_id, config.eos_id)
        if specials != (PAD_ID, BOS_ID, EOS_ID):
            raise TokenizerError(
                f"model uses pad/bos/eos ids {specials}, tokenizer {self.path} uses "
                f"{(PAD_ID, BOS_ID, EOS_ID)}")
