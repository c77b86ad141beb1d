"""A training run's inputs: the corpus, the tokenizer, the packed batches, the data
position of a resumed run."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.encoding import UNKNOWN_SHARE, count_many_unknown, train_tokenizer
from jax_transformer.data.packing import (BatchMultipleChanged, PackedBatches, fitting_row_shape,
                                          positions_needed)
from jax_transformer.train import peers
from jax_transformer.train.settings import DataSettings, TrainError
from jax_transformer.train.task import TASKS
from transformer_core.checkpoint_dir import TOKENIZER_FILE
from transformer_core.tokenizer import (BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer,
                                        TokenizerError)

MOSTLY_UNKNOWN = 0.5  # a split with more than this share of such examples is refused


def log(message: str) -> None:
    """One line on stderr from process 0, between progress bar updates."""
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stderr)


def load_corpus(data: DataSettings, seed: int) -> dict[str, list]:
    """{"train", "dev", "test"}: sentence pairs (translate) or lines of text (lm)."""
    return TASKS[data.task].load_splits(data, seed, log)


def load_tokenizer(workdir: Path, examples, data: DataSettings, seed: int,
                   resuming: bool) -> Tokenizer:
    """The run's tokenizer: trained once on the training pairs (or lines) by process 0,
    which the other processes wait for and read; reused on resume."""
    path = workdir / TOKENIZER_FILE
    if resuming and path.exists():
        tokenizer = Tokenizer(path)
    elif jax.process_index() == 0:
        try:
            tokenizer = train_tokenizer(examples, path, vocab_size=data.vocab_size,
                                        model_type=data.tokenizer_type, seed=seed)
        except TokenizerError as e:
            raise TrainError(f"--vocab-size {data.vocab_size}: {e}") from None
        peers.barrier("tokenizer written")
    else:  # another host's process reads the one process 0 trained
        peers.barrier("tokenizer written")
        tokenizer = Tokenizer(path)
    log(f"tokenizer: {tokenizer.vocab_size} pieces -> {path}")
    return tokenizer


def make_batches(splits, tokenizer: Tokenizer, data: DataSettings, seed: int,
                 special_ids: tuple[int, int, int] = (PAD_ID, BOS_ID, EOS_ID),
                 ) -> dict[str, PackedBatches]:
    """Every split packed into rows of one shape, which holds the longest sentences of
    every split: one batch shape for training and evaluation. A language model's
    lines are targets without a source: rows of source length 0. `special_ids`: the
    model's (pad, bos, eos). Examples with many unknown pieces are counted; a split
    mostly made of them is refused."""
    encoded = {}
    for split, examples in splits.items():
        try:
            src_ids, tgt_ids, report = TASKS[data.task].encode(tokenizer, examples, data.max_len,
                                                               name=f"the {split} split")
        except CorpusError as e:  # none fits: the split is named, and the flag
            raise TrainError(f"{e}; raise --max-len") from None
        if report.skipped:
            log(f"{split}: {report}")
        check_unknown(split, src_ids, tgt_ids, tokenizer, report.unit)
        encoded[split] = src_ids, tgt_ids

    def needed(side: int):  # positions every example of every split needs on that side
        if encoded["train"][side] is None:
            return None
        return np.concatenate([positions_needed(ids[side]) for ids in encoded.values()])

    row_shape = fitting_row_shape(needed(0), needed(1), data.max_len)
    batches = {split: PackedBatches(src_ids, tgt_ids, data.max_tokens, [row_shape],
                                    batch_multiple=jax.device_count(),
                                    shuffle=split == "train", seed=seed, special_ids=special_ids)
               for split, (src_ids, tgt_ids) in encoded.items()}
    fill = batches["train"].fill()
    log(f"train batches: shapes (rows, source length, target length) "
        f"{', '.join(map(str, batches['train'].shapes()))}; {fill['batches']} per epoch; "
        f"{fill['real_fraction']:.1%} of token slots hold real tokens; "
        f"{fill['tgt_tokens_per_batch']:,.0f} real target tokens per batch "
        f"({fill['tgt_tokens_per_batch'] / data.max_tokens:.0%} of --max-tokens)")
    return batches


def set_data_position(batches, data_state: dict, data_settings: DataSettings,
                      step: int) -> None:
    """Put the batch iterator where checkpoint `step` left it, or say what changed."""
    try:
        batches.set_state(data_state)
    except BatchMultipleChanged as e:
        raise TrainError(other_device_count(data_state, batches, step, e.saved_multiple)
                         ) from None
    except CorpusError as e:
        if rows_alone_differ(data_state, batches.batches):
            # A state saved before it recorded its multiple: the settings (max_tokens) and
            # row lengths match, so the rows were rounded to another device count.
            raise TrainError(other_device_count(data_state, batches, step, None)) from None
        corpus = ("the built-in corpus (its flags)" if data_settings.builtin else
                  "--columns-path" if data_settings.columns_path else
                  "--text-path" if data_settings.text_path else "--src-path / --tgt-path")
        raise TrainError(f"the training data differ from those of checkpoint {step}: {e}. Was "
                         f"{corpus} changed? Restore it, or use a new --workdir") from None


def check_unknown(split: str, src_ids, tgt_ids, tokenizer, unit: str = "pairs") -> None:
    """Log how many examples of a split have many unknown pieces (UNKNOWN_SHARE of a
    side or more); a TrainError when they are most of it: the text is not in the
    tokenizer's languages or script."""
    count = count_many_unknown([src_ids, tgt_ids], [unknown_id(tokenizer, side)
                                                     for side in ("source", "target")])
    if not count:
        return
    line = (f"{split}: {count} of {len(tgt_ids)} {unit} ({count / len(tgt_ids):.1%}) are "
            f"{UNKNOWN_SHARE:.0%} or more unknown pieces (<unk>) to the tokenizer")
    if count > MOSTLY_UNKNOWN * len(tgt_ids):
        raise TrainError(f"{line}: is the text in the languages (and script) it was made "
                         "for? Fix the corpus, or use another checkpoint's tokenizer")
    log(line)


def unknown_id(tokenizer, side: str) -> int:
    """The <unk> id of a side: a Marian or FSMT tokenizer's vocabulary of that side, an
    M2M100/NLLB tokenizer's, or ours."""
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, dict) and isinstance(vocab.get(side), dict):  # one per side
        return vocab[side]["<unk>"]
    return getattr(tokenizer, "unk_id", UNK_ID)


def rows_alone_differ(data_state: dict, batches: PackedBatches) -> bool:
    """The same data and row lengths, other rows per batch."""
    saved, shapes = data_state.get("shapes") or [], [list(s) for s in batches.shapes()]
    return (data_state.get("fingerprint") == batches.fingerprint and len(saved) == len(shapes)
            and [s[1:] for s in saved] == [s[1:] for s in shapes]
            and [s[0] for s in saved] != [s[0] for s in shapes])


def other_device_count(data_state: dict, batches, step: int, saved_devices: int | None) -> str:
    """Why checkpoint `step`'s data position does not fit this run: its batches' rows
    were rounded down to a multiple of another device count."""
    then = f"{saved_devices} devices" if saved_devices else "another number of devices"
    again = f"{saved_devices} devices" if saved_devices else "the device count it was saved on"
    if saved_devices and jax.default_backend() == "cpu":
        again += f" (--cpu-devices {saved_devices})"
    saved_rows = "/".join(str(shape[0]) for shape in data_state["shapes"])
    rows = "/".join(str(shape[0]) for shape in batches.batches.shapes())
    return (f"checkpoint {step} was saved by a run on {then}: batch rows are rounded down to "
            f"a multiple of the device count, so its batches of {saved_rows} rows are not this "
            f"run's {rows} rows on {jax.device_count()} device(s), and its data position does "
            f"not carry over; resume on {again}, or use a new --workdir")
