"""From encoded sentences to packed, fixed-shape, token-budget batches that resume exactly.

    src_ids, tgt_ids (lists of arrays, or stores: data/prepared/store.py) --PackedBatches-->
        {"src", "src_segments", "src_positions", "tgt_in", "tgt_out", "tgt_segments",
        "tgt_positions"}  (R, L) each
    ids of lines (tokenizing.encode_lines) --PackedBatches(None, ids)--> the target side
        alone, TEXT_KEYS

Packing (as in the Flax WMT example). Several pairs share a row: the source row
holds their sources one after another (pieces + eos each), the target rows their
targets (decoder input bos + pieces, labels pieces + eos) in the same order.
Segment ids number the pairs of a row 1, 2, ... (0 = padding) and positions
restart at 0 for each pair, so the model (jax_transformer.masks.segment_masks)
never attends across pairs, and the loss ignores padding. A pair needs
len(src) + 1 source and len(tgt) + 1 target positions. A language model's line
is packed as a target without a source: decoder input bos + pieces, labels
pieces + eos, and rows of source length 0.

Shapes. Rows have one of a few fixed (source length S, target length T) shapes,
`row_shapes`; train.py uses one (rows.fitting_row_shape). A batch has R = max_tokens
// max(S, T) rows (rounded down to a multiple of `batch_multiple`), so each side
holds at most max_tokens token slots, and an epoch yields one batch shape per
row shape: jit compiles once per entry of `shapes()`, and never again. Pairs fill
rows best-fit decreasing (rows.pack_rows). A row shape's last, partial batch gets
all-pad rows.

Blocks. An epoch's pairs are shuffled, then packed PLAN_BLOCK at a time (each block's
rows shuffled and cut into batches, its batches shuffled): planning a block costs the
same however large the corpus, and the sentences are gathered batch by batch from
their stores (in memory, or memory-mapped from a prepared corpus).

Resume. The plan of block b of epoch e is a pure function of (seed, e, b): ties
in length keep the shuffled order. A `BatchIterator`'s position is {"epoch": e,
"block": b, "index": i, ...}, so a run restored from a checkpoint sees exactly
the batches an uninterrupted run would have seen. Needs numpy, not JAX.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np

from jax_transformer.data.batches.rows import pack_rows, positions_needed
from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.prepared import store
from jax_transformer.data.prepared.store import TokenStore
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID

PLAN_BLOCK = 500_000  # examples packed together; an epoch of more is planned block by block
TEXT_KEYS = ("tgt_in", "tgt_out", "tgt_segments", "tgt_positions")  # a language model's batch
BATCH_KEYS = ("src", "src_segments", "src_positions") + TEXT_KEYS  # a translation batch


class BatchMultipleChanged(CorpusError):
    """A saved position's batches had their rows rounded to another multiple (train.py:
    another device count), so its batch plan is not this one."""

    def __init__(self, message: str, saved_multiple: int):
        super().__init__(message)
        self.saved_multiple = saved_multiple


class PackedBatches:
    """One split's encoded pairs (or a language model's lines), served as packed
    fixed-shape batches."""

    def __init__(self, src_ids: Sequence[np.ndarray] | TokenStore | None,
                 tgt_ids: Sequence[np.ndarray] | TokenStore,
                 max_tokens: int, row_shapes: Sequence[tuple[int, int]],
                 batch_multiple: int = 1, shuffle: bool = True, seed: int = 0,
                 special_ids: tuple[int, int, int] = (PAD_ID, BOS_ID, EOS_ID),
                 fingerprint: str | None = None):
        """`src_ids`, `tgt_ids`: the sentences' piece ids (lists of arrays, or stores);
        `max_tokens` bounds the token slots of each side of a batch (padding
        included, as fairseq's --max-tokens); `row_shapes` are the (source length,
        target length) of the rows (see `fitting_row_shape`); `batch_multiple` is
        usually the device count; `shuffle=False` gives one fixed plan, for evaluation.
        `src_ids` None: a language model's lines, `tgt_ids`, without a source side:
        row shapes (0, T), batches of TEXT_KEYS. `special_ids` (pad, bos, eos) are the
        model's: bos starts the decoder input (a Marian model's is its pad id).
        `fingerprint`: the data's (store.fingerprint), when known (a prepared corpus)."""
        if not len(tgt_ids) or (src_ids is not None and len(src_ids) != len(tgt_ids)):
            raise CorpusError(f"need equally many source and target examples, at least one; "
                              f"got {'no' if src_ids is None else len(src_ids)} and "
                              f"{len(tgt_ids)}")
        if batch_multiple < 1:
            raise CorpusError(f"batch_multiple must be positive, got {batch_multiple}")
        as_store = lambda ids: ids if isinstance(ids, TokenStore) else TokenStore.in_memory(ids)
        self.tgt_ids = as_store(tgt_ids)
        self.src_ids = None if src_ids is None else as_store(src_ids)
        self.batch_multiple = batch_multiple
        self.keys = TEXT_KEYS if src_ids is None else BATCH_KEYS
        self.shuffle, self.seed, self.max_tokens = shuffle, seed, max_tokens
        self.pad_id, self.bos_id, self.eos_id = special_ids
        # A text row's source side is empty: every line needs 0 source positions.
        self.src_needed = (np.zeros(len(tgt_ids), np.uint16) if src_ids is None
                           else positions_needed(self.src_ids))
        self.tgt_needed = positions_needed(self.tgt_ids)
        self.row_shapes = sorted({(int(S), int(T)) for S, T in row_shapes}, key=max)
        for side, needed in (("source", self.src_needed), ("target", self.tgt_needed)):
            room = max(shape[side == "target"] for shape in self.row_shapes)
            if needed.max() > room:
                raise CorpusError(f"a {side} sentence needs {needed.max()} positions, more than "
                                  f"the longest {side} row {room}; encode with max_len <= it")
        self.rows_per_batch = []
        for S, T in self.row_shapes:
            rows = max_tokens // max(S, T) // batch_multiple * batch_multiple
            if rows == 0:
                raise CorpusError(f"max_tokens {max_tokens} cannot hold {batch_multiple} rows of "
                                  f"length {max(S, T)}; need max_tokens >= "
                                  f"{batch_multiple * max(S, T)}")
            self.rows_per_batch.append(rows)
        self.blocks = -(-len(self.tgt_needed) // PLAN_BLOCK)  # per epoch
        self._fingerprint = fingerprint
        self._orders: dict[int, tuple] = {}
        self._plans: dict[tuple[int, int], list] = {}

    def __len__(self) -> int:
        """How many examples (pairs, or lines)."""
        return len(self.tgt_needed)

    @property
    def bytes_read(self) -> int:
        """What this process read of the sentences' stores: their lengths, and what its
        batches gathered (store.TokenStore.bytes_read)."""
        return sum(ids.bytes_read + ids.lengths.nbytes for ids in (self.src_ids, self.tgt_ids)
                   if ids is not None)

    @property
    def fingerprint(self) -> str:
        """A digest of the encoded examples, in order (store.fingerprint): saved
        positions are only valid for the same data."""
        if self._fingerprint is None:
            self._fingerprint = store.fingerprint([self.src_ids, self.tgt_ids])
        return self._fingerprint

    def shapes(self) -> list[tuple[int, int, int]]:
        """Every (R, S, T) an epoch yields: source arrays are (R, S), target arrays (R, T)."""
        return [(R, S, T) for R, (S, T) in zip(self.rows_per_batch, self.row_shapes)]

    def epoch_plan(self, epoch: int) -> list[tuple[int, list[list[int]]]]:
        """The batches of `epoch` as (row shape index, rows of example indices): its blocks'
        plans one after another."""
        return [batch for block in range(self.blocks) for batch in self.block_plan(epoch, block)]

    def block_plan(self, epoch: int, block: int) -> list[tuple[int, list[list[int]]]]:
        """The batches of block `block` of `epoch`, a function of (seed, epoch, block). The
        latest two plans are kept."""
        if (epoch, block) not in self._plans:
            self._plans = {k: p for k, p in self._plans.items() if k == max(self._plans)}
            self._plans[epoch, block] = self._plan(epoch, block)
        return self._plans[epoch, block]

    def _order(self, epoch: int) -> tuple[np.ndarray, dict | None]:
        """The examples of `epoch` in shuffled order (int32), and the state of the random
        generator after the shuffle, which plans the first block. Kept for the latest epoch."""
        if epoch not in self._orders:
            order = np.arange(len(self), dtype=np.int32)
            state = None
            if self.shuffle:  # as rng.permutation(count), without its int64 copy
                rng = np.random.default_rng([self.seed, epoch])
                rng.shuffle(order)
                state = rng.bit_generator.state
            self._orders = {epoch: (order, state)}
        return self._orders[epoch]

    def _plan(self, epoch: int, block: int) -> list[tuple[int, list[list[int]]]]:
        order, state = self._order(epoch)
        rng = None
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, block])
            if block == 0:  # the generator that shuffled the epoch goes on
                rng.bit_generator.state = state
        members_order = order[block * PLAN_BLOCK:(block + 1) * PLAN_BLOCK]
        rows = pack_rows(self.src_needed, self.tgt_needed, members_order, self.row_shapes)
        plan = []
        for c, R in enumerate(self.rows_per_batch):
            members = [row for shape, row in rows if shape == c]
            if rng is not None:
                members = [members[i] for i in rng.permutation(len(members))]
            plan += [(c, members[start:start + R]) for start in range(0, len(members), R)]
        if rng is not None:
            plan = [plan[i] for i in rng.permutation(len(plan))]
        return plan

    def fill(self, epoch: int = 0) -> dict[str, float]:
        """How full epoch `epoch`'s batches are: the fraction of token slots holding
        real tokens (each side, and both), and real target tokens per batch; measured on
        its first block, and "batches" in the epoch estimated from it."""
        plan = self.block_plan(epoch, 0)
        src_slots = sum(self.rows_per_batch[c] * self.row_shapes[c][0] for c, _ in plan)
        tgt_slots = sum(self.rows_per_batch[c] * self.row_shapes[c][1] for c, _ in plan)
        examples = self._order(epoch)[0][:PLAN_BLOCK]
        src, tgt = (int(needed[examples].sum()) for needed in (self.src_needed, self.tgt_needed))
        fill = {"real_fraction": (src + tgt) / (src_slots + tgt_slots),
                "tgt_real_fraction": tgt / tgt_slots,
                "tgt_tokens_per_batch": tgt / len(plan),
                "batches": round(len(plan) * len(self) / len(examples))}
        if src_slots:
            fill["src_real_fraction"] = src / src_slots
        return fill

    def make_batch(self, shape: int, rows: list[list[int]],
                   local_rows: Callable[[int], slice] | None = None) -> dict[str, np.ndarray]:
        """Lay the given rows of examples out as one batch of row shape `shape`; with
        `local_rows` (a batch's row count -> the rows this process feeds) only those rows
        of it, as a process of a several-host run builds its part of a global batch.

        Worked example, the target side: rows [[a, b], [c]], T = 6, targets of 2, 1 and
        3 pieces (a1 a2, b1, c1 c2 c3), so 3, 2 and 4 token slots with BOS (or EOS):
            row_of [0 0 1], first_in_row [0 2], segment [1 2 1]
            offset [0 3 5] (starts in the flat stream), column [0 3 0] (in the row)
            within [0 1 2 | 0 1 | 0 1 2 3], index [0 1 2 | 3 4 | 6 7 8 9] (slot = row*T + col)
            tgt_in         [BOS a1 a2 BOS b1 PAD]   [BOS c1 c2 c3 PAD PAD]
            tgt_out        [a1 a2 EOS b1 EOS PAD]   [c1 c2 c3 EOS PAD PAD]
            tgt_segments   [1 1 1 2 2 0]            [1 1 1 1 0 0]
            tgt_positions  [0 1 2 0 1 0]            [0 1 2 3 0 0]
        """
        R, (S, T) = self.rows_per_batch[shape], self.row_shapes[shape]
        if local_rows is not None:
            start, stop, _ = local_rows(R).indices(R)
            R, rows = stop - start, rows[start:stop]
        if not rows:  # a part past the end of a short last batch: padding alone
            return {key: np.full((R, S if key.startswith("src") else T),
                                 self.pad_id if key in ("src", "tgt_in", "tgt_out") else 0,
                                 np.int32) for key in self.keys}
        examples = np.array([i for row in rows for i in row], np.int64)  # (n,) in row order
        sizes = [len(row) for row in rows]
        row_of = np.repeat(np.arange(len(rows)), sizes)  # (n,) each example's row
        first_in_row = np.cumsum([0] + sizes[:-1])  # (rows,) index of each row's first example
        segment = np.arange(len(examples)) - np.repeat(first_in_row, sizes) + 1  # 1, 2, ... per row
        batch = {}
        sides = [("src", self.src_ids, self.src_needed, S)] if self.src_ids is not None else []
        for side, ids, needed, L in sides + [("tgt", self.tgt_ids, self.tgt_needed, T)]:
            lengths = needed[examples].astype(np.int64)  # (n,)
            offset = np.cumsum(lengths) - lengths  # each example's start in the flat stream
            column = offset - offset[first_in_row][row_of]  # ... and in its row
            within = np.arange(lengths.sum()) - np.repeat(offset, lengths)  # position in example
            index = np.repeat(row_of * L + column, lengths) + within  # flat slot of each token
            pieces = ids.gather(examples)

            def lay_out(stream, fill=0):  # one value per token, in stream order -> (R, L)
                out = np.full(R * L, fill, np.int32)
                out[index] = stream
                return out.reshape(R, L)

            for name, special, special_at in (
                    [("src", self.eos_id, offset + lengths - 1)] if side == "src" else
                    [("tgt_in", self.bos_id, offset),
                     ("tgt_out", self.eos_id, offset + lengths - 1)]):
                stream = np.full(len(within), special, np.int32)
                is_piece = np.ones(len(within), bool)
                is_piece[special_at] = False
                stream[is_piece] = pieces
                batch[name] = lay_out(stream, self.pad_id)
            batch[f"{side}_segments"] = lay_out(np.repeat(segment, lengths))
            batch[f"{side}_positions"] = lay_out(within)
        return {key: batch[key] for key in self.keys}

    def epoch(self, epoch: int = 0, local_rows: Callable[[int], slice] | None = None
              ) -> Iterator[dict[str, np.ndarray]]:
        """One pass over the split (e.g. for evaluation); `local_rows` as in make_batch."""
        for shape, rows in self.epoch_plan(epoch):
            yield self.make_batch(shape, rows, local_rows)

    def target_tokens(self, rows: list[list[int]]) -> int:
        """The real target tokens (labels that are not padding) of a batch of `rows`."""
        return int(sum(int(self.tgt_needed[row].sum()) for row in rows))

    def iterator(self, state: dict | None = None,
                 local_rows: Callable[[int], slice] | None = None) -> "BatchIterator":
        """An endless iterator over epochs 0, 1, 2, ..., or from a saved `state`;
        `local_rows` as in make_batch."""
        iterator = BatchIterator(self, local_rows)
        if state is not None:
            iterator.set_state(state)
        return iterator


class BatchIterator:
    """Endless, resumable iteration over the epochs of a `PackedBatches`.

    get_state() -> {"epoch": e, "block": b, "index": i, "shapes": [...], "fingerprint": f,
    "batch_multiple": m}: JSON-able; `index` is the next batch within block b of epoch
    e; the batch `shapes`, the data's `fingerprint` and the `batch_multiple` the rows
    were rounded to let set_state refuse a state saved for different data or batch
    settings, and say which (BatchMultipleChanged: another device count).
    """

    def __init__(self, batches: PackedBatches, local_rows: Callable[[int], slice] | None = None):
        self.batches, self.local_rows = batches, local_rows
        self.epoch, self.block, self.index = 0, 0, 0
        self.target_tokens = 0  # real target tokens of the (whole) batches served so far

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        plan = self.batches.block_plan(self.epoch, self.block)
        shape, rows = plan[self.index]
        batch = self.batches.make_batch(shape, rows, self.local_rows)
        self.target_tokens += self.batches.target_tokens(rows)
        self.index += 1
        if self.index == len(plan):
            self.block, self.index = self.block + 1, 0
            if self.block == self.batches.blocks:
                self.epoch, self.block = self.epoch + 1, 0
        return batch

    def get_state(self) -> dict:
        return {"epoch": self.epoch, "block": self.block, "index": self.index,
                "shapes": [list(shape) for shape in self.batches.shapes()],
                "fingerprint": self.batches.fingerprint,
                "batch_multiple": self.batches.batch_multiple}

    def set_state(self, state: dict) -> None:
        if state.get("fingerprint") != self.batches.fingerprint:
            raise CorpusError(f"iterator state {state} was saved for other data (fingerprint "
                              f"{state.get('fingerprint')}; these data give "
                              f"{self.batches.fingerprint})")
        shapes = [list(shape) for shape in self.batches.shapes()]
        saved_multiple = state.get("batch_multiple")  # absent in the oldest states
        if state.get("shapes") != shapes and saved_multiple not in (None,
                                                                     self.batches.batch_multiple):
            raise BatchMultipleChanged(
                f"iterator state {state} was saved for batches of {state.get('shapes')} "
                f"(rows a multiple of {saved_multiple}), these settings give {shapes} (rows a "
                f"multiple of {self.batches.batch_multiple})", saved_multiple)
        if state.get("shapes") != shapes:
            raise CorpusError(f"iterator state {state} was saved for batch shapes "
                              f"{state.get('shapes')}, these settings give {shapes}; resume "
                              "with the same corpus, max_tokens, row lengths and max_len")
        if "block" not in state and self.batches.blocks > 1:
            raise CorpusError(f"iterator state {state} was saved by a version that planned "
                              f"epochs whole, not in blocks of {PLAN_BLOCK:,} examples as "
                              f"these {len(self.batches):,} are; its position does not "
                              "carry over")
        epoch, block = int(state["epoch"]), int(state.get("block", 0))
        if epoch < 0 or not 0 <= block < self.batches.blocks or not 0 <= state["index"] < len(
                self.batches.block_plan(epoch, block)):
            raise CorpusError(f"iterator state {state} is out of range")
        self.epoch, self.block, self.index = epoch, block, int(state["index"])
