"""A training run's inputs: the corpus prepared (data/prepared/pipeline.py), the tokenizer, the
packed batches, the data position of a resumed run, the batches on the devices.

    prepared_corpus   --data DIR; or WORKDIR/data, prepared the first time a run sees
                      its corpus and reused after: by resumes, and by new runs of the
                      same corpus, tokenizer and encoding settings (a changed file, or
                      other settings, prepare it again)
    run_tokenizer     the prepared corpus's tokenizer, WORKDIR/tokenizer.model
    make_batches      every split packed into rows of one shape
    Prefetcher        the next updates' batches, built and put on the devices on a
                      background thread

While the devices run step k, the Prefetcher packs the batches of steps k+1 and k+2
and transfers them, so batch building and the transfer overlap with compute
(what flax.jax_utils.prefetch_to_device does for pmap-style batches, and
grain's device prefetch for grain pipelines; ours are sharded jax.Arrays from a
resumable iterator, so a small thread of its own serves them). Each prefetched
update carries the iterator's position after its batches, so a checkpoint saves
the position of the batches the saved model consumed, not of those in flight.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import sys
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import numpy as np
from tqdm import tqdm

from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.tokenizing import unknown_id
from jax_transformer.data.batches.packed import BatchMultipleChanged, PackedBatches
from jax_transformer.data.prepared.pipeline import (Encoding, NoneFits, Share, key, prepare,
                                                    stopped_preparing)
from jax_transformer.data.prepared.directory import Prepared, file_sha256, link_or_copy
from jax_transformer.data.batches.rows import fitting_row_shape, positions_needed
from jax_transformer.train import corpus as train_corpus
from jax_transformer.train.runtime import peers, signals
from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.data import DataSettings
from transformer_core.checkpoint_dir import TOKENIZER_FILE
from transformer_core.errors import TrainError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, TokenizerError

DATA_DIR = "data"  # WORKDIR/data: the run's prepared corpus, unless --data names one
AHEAD = 2  # the Prefetcher's updates in flight


def log(message: str) -> None:
    """One line on stderr from process 0, between progress bar updates."""
    if jax.process_index() == 0:
        tqdm.write(message, file=sys.stderr)


def prepared_corpus(workdir: Path, settings: RunSettings, resumed_step: int | None,
                    primary: bool, checkpoint_tokenizer=None, checkpoint_id: str | None = None
                    ) -> Prepared:
    """The run's prepared corpus: --data DIR (refused when a corpus file it was prepared
    from is here and changed), or WORKDIR/data, prepared unless it is the preparation of
    this corpus with this tokenizer and these settings already (process 0 reads the
    corpus; every process encodes its share). A resumed run (from checkpoint
    `resumed_step`) whose corpus changed since it prepared it is refused before anything
    is prepared again. A fine-tuning run encodes with its `checkpoint_tokenizer`, language
    codes set, which `checkpoint_id` identifies."""
    data = settings.data
    if data.data:
        prepared = Prepared(data.data)
        changed = prepared.changed_files
        if changed:
            raise TrainError(f"--data {data.data} was prepared from {', '.join(changed)}, "
                             "which changed since; prepare it again (jaxformer-prepare) or "
                             "restore the file")
        _log_prepared(prepared)
        return prepared
    directory = workdir / DATA_DIR
    corpus = train_corpus.corpus(data, settings.train.seed)
    encoding = _encoding(workdir, settings, resumed_step is not None, checkpoint_tokenizer,
                         checkpoint_id)
    decision = "prepare"
    if primary:
        existing = _whole_or_none(directory)
        changed = existing.changed_files if existing is not None else []
        if changed and resumed_step is not None:
            raise TrainError(f"the training data differ from those of checkpoint "
                             f"{resumed_step}: {', '.join(changed)} changed since the run "
                             f"prepared {directory}. Was {corpus_flags(data)} changed? "
                             "Restore it, or use a new --workdir")
        stale = existing.staleness(key(corpus, encoding)) if existing is not None else None
        if existing is not None and stale is None:
            _log_prepared(existing)
            decision = "prepared"
        else:
            log(f"data: preparing {directory}" + (f" again: {stale}" if stale else ""))
    # Process 0 decides; every process of a --distributed run encodes its share.
    if peers.gather("corpus prepared?", decision)[0] != "prepared":
        share = Share(jax.process_index(), jax.process_count(), peers.barrier)
        try:
            with signals.signal_handlers(signals.exit_at_once(stopped_preparing(directory))):
                prepare(directory, corpus, encoding, log=log, share=share,
                        progress=primary and not settings.train.quiet)
        except NoneFits as e:  # the split is named, and the flag
            raise TrainError(f"{e}; raise --max-len") from None
        except TokenizerError as e:
            raise TrainError(f"--vocab-size {data.vocab_size}: {e}") from None
    peers.barrier("corpus prepared")
    return Prepared(directory)


def _log_prepared(prepared: Prepared) -> None:
    log(f"data: {prepared.directory}, prepared earlier:")
    for line in prepared.manifest["log"]:
        log(f"  {line}")


def _whole_or_none(directory: Path) -> Prepared | None:
    try:
        return Prepared(directory)
    except CorpusError:
        return None


def _encoding(workdir: Path, settings: RunSettings, resuming: bool, checkpoint_tokenizer,
              checkpoint_id: str | None) -> Encoding:
    """How the run encodes: with a fine-tuned checkpoint's tokenizer, a resumed run's own,
    or one trained on the corpus."""
    data = settings.data
    encoding = Encoding(max_len=data.max_len, seed=settings.train.seed,
                        vocab_size=data.vocab_size, tokenizer_type=data.tokenizer_type)
    if checkpoint_tokenizer is not None:
        return dataclasses.replace(
            encoding, tokenizer=checkpoint_tokenizer, tokenizer_id=checkpoint_id,
            unknown_ids=tuple(unknown_id(checkpoint_tokenizer, side)
                              for side in ("source", "target")))
    path = workdir / TOKENIZER_FILE
    if resuming and path.exists():
        return dataclasses.replace(encoding, tokenizer=Tokenizer(path))
    return encoding


def run_tokenizer(workdir: Path, prepared: Prepared, resuming: bool, primary: bool) -> Tokenizer:
    """WORKDIR/tokenizer.model, the run's (and its export's): a new run's copy of the
    prepared corpus's; a resumed run's, which must be the same."""
    path = workdir / TOKENIZER_FILE
    if resuming and path.exists():
        if file_sha256(path) != file_sha256(prepared.tokenizer_path):
            raise TrainError(f"{prepared.directory} was prepared with another tokenizer than "
                             f"{path}, which the run in {workdir} was trained with: resume "
                             "with the corpus prepared for it, or use a new --workdir")
    elif primary:
        link_or_copy(prepared.tokenizer_path, path)
    tokenizer = Tokenizer(path if primary else prepared.tokenizer_path)
    log(f"tokenizer: {tokenizer.vocab_size} pieces -> {path}")
    return tokenizer


def make_batches(sides: dict[str, tuple], data: DataSettings, seed: int,
                 special_ids: tuple[int, int, int] = (PAD_ID, BOS_ID, EOS_ID),
                 fingerprints: dict[str, str] | None = None,
                 batch_multiple: int | None = None) -> dict[str, PackedBatches]:
    """Every split's (source, target) ids (stores, or lists of arrays; source None for a
    language model's lines) packed into rows of one shape, which holds the longest
    sentences of every split: one batch shape for training and evaluation.
    `special_ids`: the model's (pad, bos, eos); `fingerprints`: each split's, when known;
    `batch_multiple`: what the rows are rounded down to (default: the device count)."""
    def needed(side: int):  # positions every example of every split needs on that side
        if sides["train"][side] is None:
            return None
        return np.concatenate([positions_needed(ids[side]) for ids in sides.values()])

    row_shape = fitting_row_shape(needed(0), needed(1), data.max_len)
    batches = {split: PackedBatches(src_ids, tgt_ids, data.max_tokens, [row_shape],
                                    batch_multiple=batch_multiple or jax.device_count(),
                                    shuffle=split == "train", seed=seed, special_ids=special_ids,
                                    fingerprint=(fingerprints or {}).get(split))
               for split, (src_ids, tgt_ids) in sides.items()}
    fill = batches["train"].fill()
    log(f"train batches: shapes (rows, source length, target length) "
        f"{', '.join(map(str, batches['train'].shapes()))}; {fill['batches']} per epoch; "
        f"{fill['real_fraction']:.1%} of token slots hold real tokens; "
        f"{fill['tgt_tokens_per_batch']:,.0f} real target tokens per batch "
        f"({fill['tgt_tokens_per_batch'] / data.max_tokens:.0%} of --max-tokens)")
    return batches


def batch_multiple(saved_state: dict | None) -> int:
    """What a batch's rows are rounded down to: the device count, or the multiple of the
    resumed checkpoint's batches (`saved_state`, its data position) when the devices
    divide it, so that its data position carries over exactly onto fewer devices (8 to
    4, 2 to 1): the batches hold the same rows."""
    devices, saved = jax.device_count(), (saved_state or {}).get("batch_multiple")
    if saved and saved != devices and saved % devices == 0:
        log(f"data: batch rows a multiple of {saved}, as the checkpoint's (saved on {saved} "
            f"devices; here {devices}), so its data position carries over")
        return saved
    return devices


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
        raise TrainError(f"the training data differ from those of checkpoint {step}: {e}. Was "
                         f"{corpus_flags(data_settings)} changed? Restore it, or use a new "
                         "--workdir") from None


def corpus_flags(data: DataSettings) -> str:
    """The flags that name a run's corpus."""
    return ("the built-in corpus (its flags)" if data.builtin else
            "--columns-path" if data.columns_path else
            "--text-path" if data.text_path else "--src-path / --tgt-path")


def rows_alone_differ(data_state: dict, batches: PackedBatches) -> bool:
    """The same data and row lengths, other rows per batch."""
    saved, shapes = data_state.get("shapes") or [], [list(s) for s in batches.shapes()]
    return (data_state.get("fingerprint") == batches.fingerprint and len(saved) == len(shapes)
            and [s[1:] for s in saved] == [s[1:] for s in shapes]
            and [s[0] for s in saved] != [s[0] for s in shapes])


def other_device_count(data_state: dict, batches, step: int, saved_devices: int | None) -> str:
    """Why checkpoint `step`'s data position does not fit this run: its batches' rows
    were rounded down to a multiple of another device count."""
    then = f"{saved_devices} device(s)" if saved_devices else "another number of devices"
    again = (f"{saved_devices} device(s){' or a number dividing it' if saved_devices > 1 else ''}"
             if saved_devices else "the device count it was saved on")
    if saved_devices and jax.default_backend() == "cpu":
        again += f" (--cpu-devices {saved_devices})"
    saved_rows = "/".join(str(shape[0]) for shape in data_state["shapes"])
    rows = "/".join(str(shape[0]) for shape in batches.batches.shapes())
    return (f"checkpoint {step} was saved by a run on {then}: batch rows are rounded down to "
            f"a multiple of the device count, so its batches of {saved_rows} rows are not this "
            f"run's {rows} rows on {jax.device_count()} device(s), and its data position does "
            f"not carry over; resume on {again}, or use a new --workdir")


class Update(NamedTuple):
    """One optimizer update's input, on the devices."""
    micro_batches: list  # --accumulate sharded batches
    tokens: int  # real target tokens (labels that are not padding) of the whole batches
    data_state: dict  # the iterator's position after these batches


class Prefetcher:
    """Iterates Updates of `accumulate` micro-batches each from `batches` (a
    batches.packed.BatchIterator, which builds this process's rows of each batch), `ahead` of
    use; `put` places them on this process's devices as parts of global arrays."""

    def __init__(self, batches, put: Callable[[dict], dict], accumulate: int,
                 ahead: int = AHEAD):
        self.batches, self.put, self.accumulate = batches, put, accumulate
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                          thread_name_prefix="prefetch")
        self.in_flight = collections.deque(self.pool.submit(self.build) for _ in range(ahead))

    def build(self) -> Update:
        before = self.batches.target_tokens
        host = [next(self.batches) for _ in range(self.accumulate)]
        return Update([self.put(batch) for batch in host], self.batches.target_tokens - before,
                      self.batches.get_state())

    def __iter__(self):
        return self

    def __next__(self) -> Update:
        update = self.in_flight.popleft().result()
        self.in_flight.append(self.pool.submit(self.build))
        return update

    def close(self) -> None:
        """Stop building: the updates in flight are dropped (the iterator's position
        to save is the last consumed Update's data_state)."""
        for future in self.in_flight:
            future.cancel()
        self.pool.shutdown(wait=True)
