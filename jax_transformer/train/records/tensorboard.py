"""TensorBoard event files in WORKDIR/tensorboard/: metrics.jsonl's numbers as scalars.

    tensorboard --logdir WORKDIR

Written with tensorboardX's event file writer by the process that writes
metrics.jsonl, at the records' global steps, in the calling thread and flushed
with each record, as metrics.jsonl is: a killed run loses nothing it wrote, and a
write that fails (a full disk) fails there, in the training loop, not in a
background thread that dies (and leaves the loop blocked on its full queue) or
in an exit handler. Each run writes a new event file that opens with a
SessionLog.START at the first step it will train (as tensorboardX's `purge_step`):
TensorBoard then drops what an earlier run wrote from that step on, the steps a
resume repeats, so the curves read as if the run had never stopped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _import_tensorboardx():
    """tensorboardX's event writer and protos, without the torch import (seconds, on
    every train.py start) that tensorboardX's package makes only to accept torch
    tensors, which we never pass: a None in sys.modules makes `import torch` fail,
    for that moment."""
    hidden = "torch" not in sys.modules
    if hidden:
        sys.modules["torch"] = None
    try:
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary
    finally:
        if hidden:
            del sys.modules["torch"]
    return EventsWriter, Event, SessionLog, Summary


EventsWriter, Event, SessionLog, Summary = _import_tensorboardx()

TENSORBOARD_DIR = "tensorboard"
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_s": "train/tgt_tokens_per_s", "dev_loss": "dev/loss", "dev_nll": "dev/nll",
        "dev_perplexity": "dev/perplexity", "dev_bleu": "dev/bleu", "dev_chrf": "dev/chrf",
        "dev_decode_seconds": "dev/decode_seconds", "compile_seconds": "compile/seconds"}


class TensorBoardLog:
    """Scalars of metrics.jsonl's records (TAGS: record key -> tag) at their "step"."""

    def __init__(self, directory: Path, first_step: int):
        directory.mkdir(parents=True, exist_ok=True)
        # The file name holds the time in seconds; the suffix keeps two runs started
        # within one second apart (and in start order).
        self.writer = EventsWriter(str(directory / "events"), f".{time.time_ns()}")
        self.writer.write_event(Event(wall_time=time.time(), step=first_step,
                                      session_log=SessionLog(status=SessionLog.START)))
        self.writer.flush()

    def write(self, record: dict) -> None:
        values = [Summary.Value(tag=tag, simple_value=float(record[key]))
                  for key, tag in TAGS.items() if key in record]
        if values:
            self.writer.write_event(Event(wall_time=time.time(), step=record["step"],
                                          summary=Summary(value=values)))
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()
