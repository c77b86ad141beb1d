"""The benchmarks run end to end on tiny models and report consistent rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import bench_train, report

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_train_smoke(tmp_path):
    out = tmp_path / "train.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"),
                    "--d-model", "32", "--heads", "2", "--d-ff", "64", "--layers", "1",
                    "--vocab", "64", "--batch-size", "4", "--src-len", "8", "--tgt-len", "8",
                    "--steps", "2", "--warmup", "0", "--pause", "0", "--matmul-size", "64",
                    "--no-memory", "--reference-peak-tflops", "0.5", "--frameworks", "jax",
                    "jax_autodiff_grads", "jax_rbg_dropout", "torch_eager",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    rows = {row["framework"]: row for row in result["rows"]}
    assert set(rows) == {"jax", "jax_autodiff_grads", "jax_rbg_dropout", "torch_eager"}
    for row in rows.values():
        assert row["step_seconds"] > 0 and 0 < row["mfu"] and len(row["step_times"]) == 2
        assert row["step_cpu_seconds"] > 0 and len(row["step_cpu_times"]) == 2
        assert row["mfu_vs_reference_peak"] == pytest.approx(
            row["achieved_flops_per_s"] / 0.5e12)
        assert row["device"].startswith("cpu: ") and row["compute_dtype"] == "float32"
    for name in ("jax", "jax_autodiff_grads", "jax_rbg_dropout"):
        assert rows[name]["matmul_precision"] == \
            "float32 (jax_default_matmul_precision=default)"
    assert rows["torch_eager"]["matmul_precision"] == \
        "float32 (allow_tf32=False, float32_matmul_precision=highest)"
    assert result["matmul_peak"]["matmul_precision"] == rows["jax"]["matmul_precision"]
    # Same weights, batches and dropout stream: the two JAX backward passes differ
    # only in how the weight gradients are laid out, so they train identically.
    np.testing.assert_allclose(rows["jax"]["losses"], rows["jax_autodiff_grads"]["losses"],
                               rtol=1e-5)
    # The rbg row draws its own masks: another run of the same model.
    assert rows["jax_rbg_dropout"]["losses"] != rows["jax"]["losses"]
    np.testing.assert_allclose(rows["jax_rbg_dropout"]["losses"], rows["jax"]["losses"],
                               rtol=0.1)
    assert rows["torch_eager"]["speedup_vs_torch_eager"] == 1.0
    assert "| peak RSS (MiB) |" in result["markdown"]
    assert result["markdown"] in out.with_suffix(".md").read_text()


def test_results_go_to_train_gpu_json_on_a_gpu():
    assert bench_train.default_results_path("gpu").name == "train_gpu.json"
    assert bench_train.default_results_path("cpu").name == "train.json"


# ----------------------------------------------------------------------------- pages

def assert_cells(page: str, *cells) -> None:
    """Each of `cells` is a whole cell of one of the page's tables."""
    missing = [cell for cell in cells if f"| {cell} |" not in page]
    assert not missing, f"cells missing from the page: {missing}\n{page}"


def train_result() -> dict:
    row = {"framework": "jax", "dtype": "bfloat16", "device": "gpu: NVIDIA H100 80GB HBM3",
           "compute_dtype": "bfloat16", "matmul_precision": "bf16 operands",
           "tokens_per_s": 1234.4, "step_seconds": 0.5678, "step_cpu_seconds": 0.9123,
           "speedup_vs_torch_eager": 2.0, "achieved_flops_per_s": 3.21e11, "mfu": 0.4321,
           "mfu_vs_reference_peak": 0.0771, "first_step_seconds": 12.34,
           "peak_rss_mib": 2345.6, "peak_device_mib": None}
    return {"matmul_peak": {"n": 8, "dtype": "bfloat16", "matmul_precision": "bf16 operands",
                            "median_flops_per_s": 7.654e11, "runs": [7.654e11]},
            "flops": {"train_step": 2.9937e11}, "rows": [row],
            "errors": {"torch_compile": "RuntimeError: no compiler"},
            "args": {"reference_peak_tflops": 4.0, "dtype": "bfloat16", "batch_size": 48},
            "machine": {"devices": ["gpu: NVIDIA H100 80GB HBM3"], "cpus": 16,
                        "processor": "AMD EPYC 9454", "platform": "Linux-test",
                        "torch_threads": 16, "load_average": [1.5, 1.25, 1.0],
                        "python": "3.11.7", "jax": "0.10.2", "torch": "2.13.0",
                        "XLA_FLAGS": "--xla_test_flag", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}}


def test_train_page_labels_memory_by_what_was_measured():
    result = train_result()
    assert_cells(report.render_markdown(bench_train.describe(result), "x.json"),
                 "peak RSS (MiB)", "2346")
    result["rows"][0]["peak_device_mib"] = 4321.0
    page = report.render_markdown(bench_train.describe(result), "x.json")
    assert_cells(page, "peak device memory (MiB)", "4321")
    assert "peak RSS" not in page


@pytest.mark.slow  # a subprocess; see pyproject.toml
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
    assert_cells(out.with_suffix(".md").read_text(), "jax", "torch_eager",
                 f"{rows['jax']['steady_tgt_tokens_per_s']:,.0f}")



RACE_FIELDS = ("steps", "stopped_by", "tgt_tokens_per_s", "tgt_tokens_per_step",
               "first_step_seconds", "training_seconds", "compile_seconds", "programs_compiled",
               "bleu", "chrf", "dev_loss", "dev_curve", "peak_memory_bytes", "wall_seconds")


def write_natural_corpus(directory: Path) -> list[str]:
    """Small train/dev/test files of jax_transformer.data.natural; race.py's corpus flags."""
    from jax_transformer.data.natural import natural_length_corpus
    flags = []
    for split, pairs, seed in (("train", 600, 0), ("dev", 20, 1), ("test", 20, 2)):
        corpus = natural_length_corpus(pairs, seed)
        for side, suffix in enumerate(("src", "tgt")):
            path = directory / f"{split}.{suffix}"
            path.write_text("".join(pair[side] + "\n" for pair in corpus))
            flags += [f"--{'' if split == 'train' else split + '-'}{suffix}-path", str(path)]
    return flags


@pytest.mark.slow  # two training subprocesses, 30 s each
def test_race_smoke(tmp_path):
    """The race, end to end on a CPU: a tiny model, 30 s a side, the time to the first
    step included. Ours compiles its steps in that time unless the pytest compilation
    cache (conftest.py) has them: up to ~20 s cold on a loaded 2-core machine, so even a
    cold run trains some steps."""
    out = tmp_path / "race.json"
    race = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "race.py"), *write_natural_corpus(tmp_path),
         "--time-budget", "30", "--device", "cpu", "--d-model", "32", "--heads", "2",
         "--d-ff", "64", "--layers", "1", "--dropout", "0", "--vocab-size", "300",
         "--max-len", "96", "--max-tokens", "1536", "--warmup", "20", "--eval-every", "5",
         "--compile-cache", os.environ["JAX_COMPILATION_CACHE_DIR"], "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert race.returncode == 0, race.stdout[-3000:] + race.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["sides"]) == {"ours", "peer"} and result["same_tokenizer"]
    for side in result["sides"].values():
        assert all(side.get(field) is not None for field in RACE_FIELDS), side
        assert side["steps"] > 0 and side["stopped_by"] == "time_budget"
        assert side["tgt_tokens_per_s"] > 0 and side["peak_memory_bytes"] > 0
        assert 0 <= side["bleu"] <= 100 and 0 <= side["chrf"] <= 100
        assert [point["step"] for point in side["dev_curve"]] == list(
            range(5, side["steps"] + 1, 5))
    assert out.with_suffix(".png").stat().st_size > 0
    page = out.with_suffix(".md").read_text()
    for side in result["sides"].values():
        assert_cells(page, side["what"], f"{side['steps']:,}", f"{side['dev_loss']:.3f}")
