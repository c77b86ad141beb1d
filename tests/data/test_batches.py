"""Batches (data/batches/): packing, shapes and budget, row shapes, a process's rows, exact
resume, epochs planned in blocks."""

import collections
import json

import numpy as np
import pytest

from jax_transformer.data.batches import packed, rows
from jax_transformer.data.batches.packed import BatchMultipleChanged, PackedBatches
from jax_transformer.data.corpora import CorpusError
from transformer_core.tokenizer import BOS_ID, EOS_ID, PAD_ID


# --- Packing ------------------------------------------------------------------------------

def synthetic_examples(n=500, seed=0):
    """Example i: source starts with piece 4 + i (so a segment names its example)."""
    rng = np.random.default_rng(seed)
    src = [np.concatenate([[4 + i], rng.integers(4, 50, rng.integers(0, 40))]).astype(np.int32)
           for i in range(n)]
    tgt = [rng.integers(4, 50, rng.integers(1, 60)).astype(np.int32) for _ in range(n)]
    return src, tgt


def unpack(batch):
    """The (example index, source, target input, labels) of every pair in a packed batch,
    checking segment ids and positions on the way."""
    pairs = []
    for row in range(batch["src"].shape[0]):
        sides = {}
        for side, keys in (("src", ("src",)), ("tgt", ("tgt_in", "tgt_out"))):
            segments = batch[f"{side}_segments"][row]
            real = segments > 0
            count = segments.max()
            # Segments 1..count in order, then padding only.
            assert np.array_equal(segments[real], np.repeat(np.arange(1, count + 1),
                                                            np.bincount(segments)[1:]))
            assert not real[real.argmin():].any() or real.all()
            for key in keys:
                assert (batch[key][row][~real] == PAD_ID).all()
            assert (batch[f"{side}_positions"][row][~real] == 0).all()
            sides[side] = [{key: batch[key][row][segments == k] for key in keys}
                           | {"positions": batch[f"{side}_positions"][row][segments == k]}
                           for k in range(1, count + 1)]
        assert len(sides["src"]) == len(sides["tgt"])
        for s, t in zip(sides["src"], sides["tgt"]):
            for piece in (s, t):
                n = len(piece["positions"])
                assert np.array_equal(piece["positions"], np.arange(n))
            pairs.append((s["src"][0] - 4, s["src"], t["tgt_in"], t["tgt_out"]))
    return pairs


@pytest.mark.parametrize("row_shapes", [[(64, 64)], [(32, 48), (64, 64)]])
def test_packed_batches_shapes_budget_and_every_pair_once(row_shapes):
    src, tgt = synthetic_examples()
    data = PackedBatches(src, tgt, max_tokens=500, row_shapes=row_shapes, batch_multiple=2,
                         seed=0)
    shapes = data.shapes()
    assert len(shapes) == len(row_shapes)
    assert all(R * max(S, T) <= 500 and R % 2 == 0 and R > 0 for R, S, T in shapes)
    seen, slots, batches = collections.Counter(), 0, list(data.epoch(3))
    for batch in batches:
        R, S = batch["src"].shape
        T = batch["tgt_in"].shape[1]
        assert (R, S, T) in shapes
        slots += R * T
        for key, value in batch.items():
            assert value.shape == (R, S if key.startswith("src") else T)
            assert value.dtype == np.int32
        for i, s, t_in, t_out in unpack(batch):
            seen[i] += 1
            np.testing.assert_array_equal(s, np.r_[src[i], EOS_ID])
            np.testing.assert_array_equal(t_in, np.r_[BOS_ID, tgt[i]])
            np.testing.assert_array_equal(t_out, np.r_[tgt[i], EOS_ID])
    assert seen == {i: 1 for i in range(len(src))}
    fill = data.fill(3)
    assert fill["batches"] == len(batches)
    assert fill["tgt_real_fraction"] == pytest.approx(sum(len(t) + 1 for t in tgt) / slots)


def test_packing_is_tight():
    """Best-fit decreasing leaves little room: on these uniform lengths (1-60 target
    positions) in rows of 128, over 95% of the target slots hold tokens; laying
    one pair per row would fill under 30%."""
    src, tgt = synthetic_examples(2000)
    data = PackedBatches(src, tgt, max_tokens=4096, row_shapes=[(128, 128)], seed=0)
    fill = data.fill()
    assert fill["tgt_real_fraction"] > 0.95 and fill["src_real_fraction"] > 0.6


def test_fitting_row_shape():
    src_needed, tgt_needed = np.array([3, 5, 9, 30]), np.array([2, 2, 3, 40])
    # The side with more tokens holds its longest sentence and ROW_SENTENCES average
    # ones; the other side its longest and a length in proportion to its tokens.
    assert rows.fitting_row_shape(src_needed, tgt_needed, max_len=256) == (48, 48)
    assert rows.fitting_row_shape(np.full(9, 10), np.full(9, 20), 256) == (48, 96)
    assert rows.fitting_row_shape(src_needed, np.array([2, 2, 3, 4]), 256) == (48, 16)
    assert rows.fitting_row_shape(src_needed, tgt_needed, max_len=40) == (40, 40)


def test_jit_compiles_once_per_announced_shape():
    import jax
    src, tgt = synthetic_examples(300)
    data = PackedBatches(src, tgt, max_tokens=512, row_shapes=[(32, 48), (64, 64)],
                         batch_multiple=2)

    @jax.jit
    def count_tokens(batch):
        return (batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum()

    iterator = data.iterator()
    for _ in range(2 * len(data.epoch_plan(0))):
        count_tokens(next(iterator))
    assert count_tokens._cache_size() == len(data.shapes())


def test_a_process_builds_only_its_rows_of_each_batch():
    """Each of several processes lays out the rows its devices hold (here the halves of
    4-row batches); together they are the whole batch, a short last batch's missing rows
    padding, and the iterator counts the whole batch's target tokens."""
    src, tgt = synthetic_examples(150)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                         seed=1)
    halves = [lambda rows: slice(0, rows // 2), lambda rows: slice(rows // 2, rows)]
    whole, parts = data.iterator(), [data.iterator(local_rows=half) for half in halves]
    plan, counted = data.epoch_plan(0), 0
    assert min(len(rows) for _, rows in plan) <= 2  # a batch whose second half is empty
    for _ in range(len(plan)):
        batch = next(whole)
        pieces = [next(part) for part in parts]
        for key in batch:
            np.testing.assert_array_equal(np.concatenate([p[key] for p in pieces]), batch[key])
        counted += int((batch["tgt_out"] != PAD_ID).sum())
        assert whole.target_tokens == counted
    assert all(part.target_tokens == whole.target_tokens for part in parts)


def test_bad_packing_settings():
    src, tgt = synthetic_examples(20)
    with pytest.raises(ValueError, match="need max_tokens >= 64"):
        PackedBatches(src, tgt, max_tokens=63, row_shapes=[(64, 64)])
    with pytest.raises(ValueError, match="more than the longest target row 16"):
        PackedBatches(src, tgt, max_tokens=1000, row_shapes=[(64, 16)])


# --- Exact resume ---------------------------------------------------------------------------

def assert_same_batches(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_resume_continues_exactly_across_an_epoch_boundary():
    src, tgt = synthetic_examples(200)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                         seed=5)
    n = len(data.epoch_plan(0))
    uninterrupted = data.iterator()
    reference = [next(uninterrupted) for _ in range(3 * n)]

    interrupted = data.iterator()
    for _ in range(n - 2):  # stop two batches before the end of epoch 0
        next(interrupted)
    state = json.loads(json.dumps(interrupted.get_state()))
    assert state == {"epoch": 0, "block": 0, "index": n - 2, "shapes": [[4, 64, 64]],
                     "fingerprint": data.fingerprint, "batch_multiple": 2}
    resumed = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], batch_multiple=2,
                            seed=5).iterator(state)
    following = [next(resumed) for _ in range(2 + len(data.epoch_plan(1)) + 2)]
    assert_same_batches(following, reference[n - 2:n + len(following) - 2])
    assert resumed.get_state()["epoch"] == 2 and resumed.get_state()["index"] == 2

    # Epochs are shuffled differently; an unshuffled split repeats itself.
    assert_same_batches(reference[:n], list(data.epoch(0)))
    assert not all(np.array_equal(a["src"], b["src"]) for a, b in zip(reference, reference[n:]))
    fixed = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)], shuffle=False)
    assert_same_batches(list(fixed.epoch(0)), list(fixed.epoch(1)))


def test_resume_refuses_a_state_from_other_data():
    src, tgt = synthetic_examples(200)
    data = PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)])
    state = data.iterator().get_state()
    with pytest.raises(ValueError, match="saved for batch shapes"):
        PackedBatches(src, tgt, max_tokens=512, row_shapes=[(64, 64)]).iterator(state)
    with pytest.raises(ValueError, match="out of range"):
        data.iterator({**state, "index": len(data.epoch_plan(0))})
    # Rows rounded to another multiple (train.py: another device count) say so.
    with pytest.raises(BatchMultipleChanged, match=r"rows a multiple of 1\), these settings "
                       r"give \[\[3, 64, 64\]\] \(rows a multiple of 3"):
        PackedBatches(src, tgt, max_tokens=256, row_shapes=[(64, 64)],
                      batch_multiple=3).iterator(state)
    # Same sizes, same shapes, one token changed: the fingerprint tells.
    changed = [ids.copy() for ids in src]
    changed[7][0] += 1
    other = PackedBatches(changed, tgt, max_tokens=256, row_shapes=[(64, 64)])
    with pytest.raises(ValueError, match="saved for other data"):
        other.iterator(state)


# --- Epochs planned in blocks ---------------------------------------------------------------

def test_an_epoch_of_several_blocks_serves_every_example_once_and_resumes(monkeypatch):
    monkeypatch.setattr(packed, "PLAN_BLOCK", 70)
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(200)]
    tgt = [rng.integers(4, 50, rng.integers(1, 12)) for _ in range(200)]
    data = PackedBatches(src, tgt, max_tokens=128, row_shapes=[(32, 32)], seed=3)
    assert data.blocks == 3
    served = sorted(i for _, rows in data.epoch_plan(0) for row in rows for i in row)
    assert served == list(range(200))
    uninterrupted = data.iterator()
    total = len(data.epoch_plan(0))
    reference = [next(uninterrupted) for _ in range(total + 5)]
    for stop in (len(data.block_plan(0, 0)), len(data.block_plan(0, 0)) + 1, total - 1):
        interrupted = data.iterator()
        for _ in range(stop):
            next(interrupted)
        state = json.loads(json.dumps(interrupted.get_state()))
        resumed = PackedBatches(src, tgt, max_tokens=128, row_shapes=[(32, 32)],
                                seed=3).iterator(state)
        for expected in reference[stop:stop + 4]:
            batch = next(resumed)
            for name in batch:
                np.testing.assert_array_equal(batch[name], expected[name])
    # A position saved before blocks (no "block") is one of a whole-epoch plan: refused
    # where blocks change the plan, kept where there is one block.
    old = {k: v for k, v in data.iterator().get_state().items() if k != "block"}
    with pytest.raises(CorpusError, match="planned epochs whole"):
        data.iterator(old)
    monkeypatch.setattr(packed, "PLAN_BLOCK", 500)
    single = PackedBatches(src, tgt, max_tokens=128, row_shapes=[(32, 32)], seed=3)
    assert single.iterator(old).get_state()["block"] == 0
