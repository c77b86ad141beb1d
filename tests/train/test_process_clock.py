"""process_seconds counts from the process's start, not from its own import."""

from __future__ import annotations

import subprocess
import sys

from tests.train.runs import REPO_ROOT


def test_process_seconds_counts_the_time_before_its_import():
    code = ("import time; time.sleep(1.0); "
            "from jax_transformer.train.runtime.process_clock import process_seconds; "
            "print(process_seconds())")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, check=True)
    # the second slept before the import, and the interpreter's start (well under 5 s)
    assert 1.0 <= float(result.stdout) < 6.0
