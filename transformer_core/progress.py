"""Progress bars on stderr: tqdm's, redrawn in place on a terminal; elsewhere (a log
file, a pipe, a scheduler's capture) a plain line of its own at most every LINE_SECONDS,
so that a log reads as lines rather than as thousands of carriage-return updates.
"""

from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm

LINE_SECONDS = 30.0  # off a terminal: at most one progress line this often


def progress_bar(**options) -> tqdm:
    """A tqdm bar on stderr with tqdm's `options` (total, desc, unit, disable, ...): on a
    terminal, redrawn in place as wide as the terminal; elsewhere in ASCII, a line at
    most every LINE_SECONDS: the first LINE_SECONDS after it starts, the last when it
    closes, if any was written. (A bar's refresh() draws at once, so its postfix is
    set with set_postfix(..., refresh=False) and drawn by the next update.)"""
    if sys.stderr.isatty():
        return tqdm(file=sys.stderr, dynamic_ncols=True, **options)
    return tqdm(file=StatusLines(sys.stderr), ascii=True, **{
        **options, "mininterval": LINE_SECONDS, "maxinterval": LINE_SECONDS,
        "delay": LINE_SECONDS})


class StatusLines:
    """A stream for tqdm off a terminal: each status tqdm draws ("\\r", the bar, spaces
    over the longer one before) becomes a line of its own; what only redraws (a clear,
    the cursor back) writes nothing."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        status = text.strip()
        if status:
            self.stream.write(status + "\n")

    def flush(self) -> None:
        self.stream.flush()
