"""DataSettings: the task, its corpus, the tokenizer and the batches; and the corpus
settings a prepared directory (jaxformer-prepare, --data DIR) records."""

from __future__ import annotations

import dataclasses
import os
from typing import get_type_hints

from jax_transformer.data.prepared.store import damaged
from jax_transformer.train.settings.fields import (flag, name_metavars, refuse_empty_paths,
                                                   require, setting)
from transformer_core.errors import TrainError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID

SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
MIN_MAX_LEN = 8  # the shortest length bucket
# What train.py trains, and the architecture each task's model has.
TASK_ARCHITECTURES = {"translate": "encoder_decoder", "lm": "decoder_only"}


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The task, its corpus, the tokenizer and the batches (default: the built-in
    number-words corpus; with --task lm, the built-in counting text)."""
    data: str | None = setting(None, "a corpus jaxformer-prepare made, whose corpus flags are "
                               "the defaults (else: prepared in WORKDIR/data)", metavar="DIR",
                               resumable=True)
    task: str = setting("translate", "translate: an encoder-decoder on sentence pairs; lm: a "
                        "decoder-only language model on lines of text, which also prints "
                        "sampled continuations", choices=tuple(TASK_ARCHITECTURES))
    text_path: str | None = setting(None, "--task lm: a UTF-8 text file, one example "
                                    "(sentence, paragraph) per line; --num-dev and --num-test "
                                    "lines are held out")
    src_lang: str = setting("en", "number corpus source language, a num2words code; with "
                            "--task lm, the counting text's language")
    tgt_lang: str = setting("de", "number corpus target language")
    num_train: int = setting(50_000, "number corpus training pairs, or counting text lines")
    max_number: int = setting(1_000_000, "number corpus draws numbers below this; counting "
                              "lines start below it")
    src_path: str | None = setting(None, "parallel text: source file, one sentence per line")
    tgt_path: str | None = setting(None, "parallel text: target file, line-aligned with "
                                   "--src-path")
    columns_path: str | None = setting(None, "a TSV (.tsv) or CSV file with a header row")
    src_column: str = setting("source", "source column of --columns-path")
    tgt_column: str = setting("target", "target column of --columns-path")
    dev_src_path: str | None = setting(None, "parallel text: dev set source (default: hold out "
                                       "--num-dev training pairs)")
    dev_tgt_path: str | None = setting(None, "parallel text: dev set target")
    test_src_path: str | None = setting(None, "parallel text: test set source (default: hold "
                                        "out --num-test training pairs)")
    test_tgt_path: str | None = setting(None, "parallel text: test set target")
    num_dev: int = setting(1000, "held-out pairs (or lines) for the dev set")
    num_test: int = setting(1000, "held-out pairs (or lines) for the test set")
    tokenizer_type: str = setting("unigram", "SentencePiece model type; the paper used "
                                  "byte-pair encoding", choices=("unigram", "bpe"))
    vocab_size: int = setting(8000, "shared SentencePiece vocabulary size; smaller if the text "
                              "has fewer pieces")
    max_len: int = setting(256, "longest sentence in tokens; longer pairs (or lines) are "
                           "skipped and counted")
    max_tokens: int = setting(4096, "token budget per micro-batch (--accumulate of them make "
                              "one update), padding included, like fairseq's --max-tokens")

    def __post_init__(self):
        refuse_empty_paths(self)
        require(self.task in TASK_ARCHITECTURES, f"--task must be one of "
                f"{', '.join(TASK_ARCHITECTURES)}, got {self.task!r}")
        pair_flags = [flag(name) for name in
                      ("src_path", "tgt_path", "columns_path", "dev_src_path", "dev_tgt_path",
                       "test_src_path", "test_tgt_path") if getattr(self, name)]
        if self.task == "lm":
            require(not pair_flags, f"--task lm trains on --text-path (one example per line), "
                                    f"not on sentence pairs: drop {' '.join(pair_flags)}")
        else:
            require(not self.text_path, "--text-path is for --task lm; a translation corpus is "
                                        "--src-path/--tgt-path or --columns-path")
        for split in ("", "dev_", "test_"):
            src, tgt = getattr(self, f"{split}src_path"), getattr(self, f"{split}tgt_path")
            require(bool(src) == bool(tgt), f"{flag(split + 'src_path')} and "
                                            f"{flag(split + 'tgt_path')} go together")
        for name in ("num_train", "num_dev", "num_test", "max_number", "max_tokens"):
            require(getattr(self, name) >= 1, f"{flag(name)} must be at least 1, "
                                              f"got {getattr(self, name)}")
        require(self.vocab_size > len(SPECIAL_IDS), f"--vocab-size must be more than the "
                f"{len(SPECIAL_IDS)} special pieces (pad, unk, bos, eos), got {self.vocab_size}")
        require(self.max_len >= MIN_MAX_LEN, f"--max-len must be at least {MIN_MAX_LEN}, "
                                             f"got {self.max_len}")
        require(self.max_tokens >= self.max_len, f"--max-tokens {self.max_tokens} cannot hold "
                f"one sentence of --max-len {self.max_len} tokens; raise it or lower --max-len")

    @property
    def builtin(self) -> bool:
        return not (self.src_path or self.columns_path or self.text_path)

    def preparation(self) -> dict:
        """What a prepared corpus's key records of these settings: PREPARED_FIELDS."""
        return {name: getattr(self, name) for name in PREPARED_FIELDS}

    def held_out(self, available: int, source: str, unit: str,
                 given: tuple[str, ...] = ()) -> tuple[int, int]:
        """(dev, test): how many of the `available` usable examples of `source` to hold
        out (none for a split in `given`, which has files of its own); a TrainError naming
        --num-dev / --num-test when that leaves none to train on."""
        sizes = {split: 0 if split in given else getattr(self, f"num_{split}")
                 for split in ("dev", "test")}
        if sum(sizes.values()) >= available:
            flags = [f"{flag('num_' + split)} {n}" for split, n in sizes.items() if n]
            raise TrainError(f"{' + '.join(flags)} held-out {unit} leave none of the "
                             f"{available} usable {unit} of {source} to train on; lower "
                             + ("them" if len(flags) > 1 else "it"))
        return sizes["dev"], sizes["test"]

    @property
    def architecture(self) -> str:
        return TASK_ARCHITECTURES[self.task]

    @property
    def fewest_rows(self) -> int:
        """The rows of a batch of --max-len sentences, the fewest a batch has."""
        return self.max_tokens // self.max_len


name_metavars(DataSettings)


PREPARED_FIELDS = tuple(f.name for f in dataclasses.fields(DataSettings)  # a preparation's
                        if f.name not in ("data", "max_tokens"))


def prepared_settings(recorded: dict, manifest: str | os.PathLike) -> dict:
    """The corpus settings a prepared directory's `manifest` records (its key's "corpus"):
    PREPARED_FIELDS, each of its flag's type; a CorpusError naming the manifest when one
    is missing or of another type."""
    types = get_type_hints(DataSettings)
    for name in PREPARED_FIELDS:
        if name not in recorded:
            problem = f"has no key.corpus.{name}"
        elif not isinstance(recorded[name], types[name]) or isinstance(recorded[name], bool):
            problem = f"has key.corpus.{name} {recorded[name]!r}, not a value {flag(name)} takes"
        else:
            continue
        raise damaged(manifest, problem)
    return {name: recorded[name] for name in PREPARED_FIELDS}


def from_prepared(data: DataSettings, recorded: dict, directory: str) -> DataSettings:
    """`data` with the corpus settings a prepared directory recorded (prepared_settings');
    a TrainError naming the flag when one given differs from them (a flag at its default
    follows them)."""
    for name in PREPARED_FIELDS:
        given, then = getattr(data, name), recorded[name]
        if given != then and given != getattr(DataSettings, name):
            raise TrainError(f"--data {directory} was prepared with {flag(name)} {then!r}; "
                             f"drop {flag(name)} {given!r}, or prepare the corpus again")
    return dataclasses.replace(data, **{name: recorded[name] for name in PREPARED_FIELDS})

