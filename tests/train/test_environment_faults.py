"""train.py where its surroundings fail it, met as a user meets them (a real train.py
process each): no coordinator for --distributed, another device count on resume, a
damaged or read-only compilation cache, a full disk. Each ends in one clear line (or
runs on with at most one warning line), never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.train.runs import REPO_ROOT, TINY

pytestmark = pytest.mark.slow  # train.py subprocesses
ENV = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
# What jax.distributed.initialize() reads to find its coordinator and peers.
CLUSTER_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri",
                     "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID")


def train(workdir, *flags, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY, *flags],
                          cwd=REPO_ROOT, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_error_line(result, code: int, *parts: str) -> str:
    """Exit `code`, no traceback, and the last line of stderr the one `error:` line."""
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
    for part in parts:
        assert part in lines[-1], lines[-1]
    return lines[-1]


@pytest.mark.parametrize("address, missing", [
    (None, "found no coordinator address: JAX_COORDINATOR_ADDRESS is not set"),
    ("127.0.0.1:1", "found no number of processes"),
])
def test_distributed_without_a_coordinator_names_what_is_missing(tmp_path, address, missing):
    """Before: `ValueError: coordinator_address should be defined.` (a traceback, exit 1)."""
    env = {k: v for k, v in ENV.items() if k not in CLUSTER_VARIABLES}
    if address:
        env["JAX_COORDINATOR_ADDRESS"] = address
    result = train(tmp_path / "run", "--distributed", "--steps", "1", env=env)
    assert_one_error_line(result, 2, "error: --distributed: jax.distributed.initialize() "
                          + missing, "run without --distributed")
