"""The next updates' batches, built and put on the devices on a background thread.

While the devices run step k, the host packs the batches of steps k+1 and k+2
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
from typing import Callable, NamedTuple

AHEAD = 2  # updates in flight


class Update(NamedTuple):
    """One optimizer update's input, on the devices."""
    micro_batches: list  # --accumulate sharded batches
    tokens: int  # real target tokens (labels that are not padding) of the whole batches
    data_state: dict  # the iterator's position after these batches


class Prefetcher:
    """Iterates Updates of `accumulate` micro-batches each from `batches` (a
    packing.BatchIterator, which builds this process's rows of each batch), `ahead` of
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
