"""The training benchmark runs end to end on a tiny model and reports consistent rows."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # subprocesses; see pyproject.toml

ROOT = Path(__file__).resolve().parents[1]


def test_bench_train_smoke(tmp_path):
    out = tmp_path / "train.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"),
                    "--d-model", "32", "--heads", "2", "--d-ff", "64", "--layers", "1",
                    "--vocab", "64", "--batch-size", "4", "--src-len", "8", "--tgt-len", "8",
                    "--steps", "2", "--warmup", "0", "--pause", "0", "--matmul-size", "64",
                    "--no-memory", "--frameworks", "jax", "jax_autodiff_grads", "torch_eager",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    rows = {row["framework"]: row for row in result["rows"]}
    assert set(rows) == {"jax", "jax_autodiff_grads", "torch_eager"}
    for row in rows.values():
        assert row["step_seconds"] > 0 and 0 < row["mfu"] and len(row["step_times"]) == 2
    # Same weights, batches and dropout stream: the two JAX backward passes differ
    # only in how the weight gradients are laid out, so they train identically.
    np.testing.assert_allclose(rows["jax"]["losses"], rows["jax_autodiff_grads"]["losses"],
                               rtol=1e-5)
    assert rows["torch_eager"]["speedup_vs_torch_eager"] == 1.0


def test_bench_corpus_smoke(tmp_path):
    out = tmp_path / "corpus.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_corpus.py"),
                    "--pairs", "2000", "--vocab-size", "500", "--d-model", "32", "--heads", "2",
                    "--d-ff", "64", "--layers", "1", "--max-tokens", "1024", "--steps", "4",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert len(result["batch_shapes"]) == 1 and result["real_token_fraction"] > 0.85
    rows = {row["framework"]: row for row in result["rows"]}
    assert set(rows) == {"jax", "torch_eager"}
    assert rows["jax"]["compiled"]["programs"] >= 2
    for row in rows.values():
        assert row["steady_tgt_tokens_per_s"] > 0 and len(row["losses"]) == 4
    # Same weights, same batches: the two frameworks' first losses agree (dropout
    # differs, so only roughly).
    np.testing.assert_allclose(rows["jax"]["losses"][0], rows["torch_eager"]["losses"][0],
                               rtol=0.05)
