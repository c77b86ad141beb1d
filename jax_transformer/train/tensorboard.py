"""TensorBoard event files in WORKDIR/tensorboard/: metrics.jsonl's numbers as scalars.

    tensorboard --logdir WORKDIR

Written with tensorboardX by the process that writes metrics.jsonl, at the
records' global steps. Each run writes a new event file that opens with a
SessionLog.START at the first step it will train (tensorboardX's `purge_step`):
TensorBoard then drops what an earlier run wrote from that step on, the steps a
resume repeats, so the curves read as if the run had never stopped.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def _import_summary_writer():
    """tensorboardX's SummaryWriter, without the torch import (1.5 to 3 s on every
    train.py start) that tensorboardX makes only to accept torch tensors, which we
    never pass: a None in sys.modules makes `import torch` fail, for that moment."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


SummaryWriter = _import_summary_writer()

TENSORBOARD_DIR = "tensorboard"
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "tokens_per_s": "train/tgt_tokens_per_s", "dev_loss": "dev/loss",
        "dev_perplexity": "dev/perplexity", "compile_seconds": "compile/seconds"}
FLUSH_SECONDS = 5  # TensorBoard reloads every 5 s; a SIGKILL loses the last 5 s at most


class TensorBoardLog:
    """Scalars of metrics.jsonl's records (TAGS: record key -> tag) at their "step"."""

    def __init__(self, directory: Path, first_step: int):
        # The file name holds the time in seconds; the suffix keeps two runs started
        # within one second apart (and in start order).
        self.writer = SummaryWriter(str(directory), purge_step=first_step,
                                    flush_secs=FLUSH_SECONDS,
                                    filename_suffix=f".{time.time_ns()}")

    def write(self, record: dict) -> None:
        for key, tag in TAGS.items():
            if key in record:
                self.writer.add_scalar(tag, record[key], record["step"])

    def close(self) -> None:
        """Write out what is queued and close the file."""
        self.writer.close()
