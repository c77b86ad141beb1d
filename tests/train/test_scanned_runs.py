"""train.py with its layer stacks scanned (--scan-layers on): it trains as the loop
does (same weights, same dropout masks), resumes exactly, and resumes with the other
setting (checkpoints hold the per-layer layout either way)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.train.runs import dev_losses, losses, tiny_run

SCAN = ("--layers", "2", "--scan-layers", "on")
LOOP = ("--layers", "2", "--scan-layers", "off")


@pytest.fixture(scope="module")
def scanned_run(tmp_path_factory):
    """An uninterrupted 8-step scanned run."""
    workdir = tmp_path_factory.mktemp("scanned")
    tiny_run(workdir, *SCAN, "--steps", "8")
    return workdir


@pytest.mark.slow
def test_a_scanned_run_resumes_exactly(scanned_run, tmp_path):
    tiny_run(tmp_path, *SCAN, "--steps", "4")
    tiny_run(tmp_path, *SCAN, "--steps", "8")  # resumes from the step-4 checkpoint
    assert losses(tmp_path) == losses(scanned_run)
    assert dev_losses(tmp_path)[-1] == dev_losses(scanned_run)[-1]  # the final model's


@pytest.mark.slow
def test_the_loop_trains_alike_and_a_scanned_run_resumes_looped(scanned_run, tmp_path):
    """The loop's losses are the scan's to float32 rounding (other dropout masks would
    move them by ~1e-2); a run saved scanned resumes looped and goes on alike."""
    loop, switched = tmp_path / "loop", tmp_path / "switched"
    tiny_run(loop, *LOOP, "--steps", "8")
    tiny_run(switched, *SCAN, "--steps", "4")
    tiny_run(switched, *LOOP, "--steps", "8")
    reference = losses(scanned_run)
    assert losses(switched)[:4] == reference[:4]
    for run in (loop, switched):
        assert [step for step, _ in losses(run)] == list(range(1, 9))
        np.testing.assert_allclose([loss for _, loss in losses(run)],
                                   [loss for _, loss in reference], rtol=1e-5, atol=0)
