"""Seconds since this process started, counting the interpreter's start and the imports.

    process_seconds()   Linux: from /proc/self/stat's start time (10 ms ticks);
                        elsewhere: from this module's import

train.py reports its first step from there (eval.json's
training.first_step_done_seconds), so a comparison with another program that does the
same counts both from their starts.
"""

from __future__ import annotations

import os
import time

_IMPORTED = time.monotonic()


def process_seconds() -> float:
    """Seconds since the process started (see the module's docstring)."""
    try:
        with open("/proc/self/stat") as stat:
            # the fields after the command's ")"; the start time is field 22 of the line
            fields = stat.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, IndexError, ValueError, AttributeError):
        return time.monotonic() - _IMPORTED
