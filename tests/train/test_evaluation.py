"""The held-out loss reads each batch's sums late (train/tasks/metrics.py): the host builds
the next batches while the devices run the ones dispatched."""

from __future__ import annotations

import math

from jax_transformer.train.tasks.metrics import EVAL_BATCHES_IN_FLIGHT, heldout_loss, lagging


def test_lagging_yields_each_item_once_lag_more_were_taken():
    taken = []

    def items():
        for item in range(5):
            taken.append(item)
            yield item

    assert [(item, len(taken)) for item in lagging(items(), 2)] == [
        (0, 3), (1, 4), (2, 5), (3, 5), (4, 5)]
    assert list(lagging(iter([]), 2)) == []


class RecordingTrainer:
    """eval_step's sums say, when read, how many batches had been dispatched."""

    def __init__(self):
        self.dispatched, self.reads = 0, []

    def local_rows(self, rows):
        return slice(0, rows)

    def shard_batch(self, batch):
        return batch

    def eval_step(self, state, batch):
        self.dispatched += 1
        return {"loss_sum": Sum(self, batch, 2.0), "nll_sum": Sum(self, batch, 1.0),
                "tokens": Sum(self, batch, 1.0)}


class Sum:
    def __init__(self, trainer, batch, per_token):
        self.trainer, self.batch, self.value = trainer, batch, per_token * batch["tokens"]

    def __float__(self):
        self.trainer.reads.append((self.batch["index"], self.trainer.dispatched))
        return self.value

    def __int__(self):
        return int(float(self))


class Batches:
    def epoch(self, epoch, rows):
        return ({"index": index, "tokens": 10 * (index + 1)} for index in range(5))


def test_the_held_out_loss_reads_each_batch_late_and_sums_every_one():
    trainer = RecordingTrainer()
    result = heldout_loss(trainer, None, Batches())
    assert result["tokens"] == 150 and result["loss"] == 2.0 and result["nll"] == 1.0
    assert math.isclose(result["perplexity"], math.e)
    first_reads = {index: dispatched for index, dispatched in reversed(trainer.reads)}
    assert first_reads == {index: min(index + 1 + EVAL_BATCHES_IN_FLIGHT, 5)
                           for index in range(5)}
