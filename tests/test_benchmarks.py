"""The benchmarks run end to end on tiny models and report consistent rows; their
markdown pages show every figure of their results."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benchmarks import (bench_compile, bench_corpus, bench_data, bench_decode, bench_fsdp,
                        bench_init_from, bench_interactive, bench_serve, bench_train, bench_train_compile,
                        finishing, learning, race, race_report, report, step_variants)
from benchmarks.report import Report, Table

ROOT = Path(__file__).resolve().parents[1]
# The smoke test checks the CPU's figures (its matmul precisions, float32), on any machine.
CPU_ONLY = {"JAX_PLATFORMS": "cpu", "CUDA_VISIBLE_DEVICES": ""}


@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_train_smoke(tmp_path):
    out = tmp_path / "train.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train.py"),
                    "--d-model", "32", "--heads", "2", "--d-ff", "64", "--layers", "1",
                    "--vocab", "64", "--batch-size", "4", "--src-len", "8", "--tgt-len", "8",
                    "--steps", "2", "--warmup", "0", "--pause", "0", "--matmul-size", "64",
                    "--no-memory", "--reference-peak-tflops", "0.5", "--frameworks", "jax",
                    "jax_autodiff_grads", "jax_threefry_dropout", "torch_eager",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600,
                   env={**os.environ, **CPU_ONLY})
    result = json.loads(out.read_text())
    assert result["errors"] == {}
    rows = {row["framework"]: row for row in result["rows"]}
    assert set(rows) == {"jax", "jax_autodiff_grads", "jax_threefry_dropout", "torch_eager"}
    for row in rows.values():
        assert row["step_seconds"] > 0 and 0 < row["mfu"] and len(row["step_times"]) == 2
        assert row["step_cpu_seconds"] > 0 and len(row["step_cpu_times"]) == 2
        assert row["mfu_vs_reference_peak"] == pytest.approx(
            row["achieved_flops_per_s"] / 0.5e12)
        assert row["device"].startswith("cpu: ") and row["compute_dtype"] == "float32"
    for name in ("jax", "jax_autodiff_grads", "jax_threefry_dropout"):
        assert rows[name]["matmul_precision"] == \
            "float32 (jax_default_matmul_precision=default)"
    assert rows["torch_eager"]["matmul_precision"] == \
        "float32 (allow_tf32=False, float32_matmul_precision=highest)"
    assert result["matmul_peak"]["matmul_precision"] == rows["jax"]["matmul_precision"]
    # Same weights, batches and dropout stream: the two JAX backward passes differ
    # only in how the weight gradients are laid out, so they train identically.
    np.testing.assert_allclose(rows["jax"]["losses"], rows["jax_autodiff_grads"]["losses"],
                               rtol=1e-5)
    # On the CPU, jax's masks come from the counter hash and the threefry row draws
    # nnx's own: another run of the same model.
    assert rows["jax_threefry_dropout"]["losses"] != rows["jax"]["losses"]
    np.testing.assert_allclose(rows["jax_threefry_dropout"]["losses"], rows["jax"]["losses"],
                               rtol=0.1)
    assert rows["torch_eager"]["speedup_vs_torch_eager"] == 1.0
    assert "| peak RSS (MiB) |" in result["markdown"]
    assert result["markdown"] in out.with_suffix(".md").read_text()


@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_compile_smoke(tmp_path):
    out = tmp_path / "compile.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_compile.py"),
                    "--d-model", "32", "--heads", "2", "--d-ff", "64", "--vocab", "64",
                    "--depths", "1", "--layers", "1", "--unrolls", "1", "2",
                    "--batch-size", "4", "--src-len", "8", "--tgt-len", "8",
                    "--compile-rounds", "1", "--warmup", "1", "--steps", "2",
                    "--out", str(out)], check=True, capture_output=True, text=True, timeout=600)
    result = json.loads(out.read_text())
    assert [(r["layers"], r["variant"]) for r in result["compile"]] == [
        (1, "loop"), (1, "scan (unroll 1)")]
    for row in result["compile"]:
        assert row["total_seconds"] == pytest.approx(row["lower_seconds"]
                                                     + row["compile_seconds"])
    steps = {row["variant"]: row for row in result["step"]}
    assert list(steps) == ["loop", "scan (unroll 1)", "scan (unroll 2)"]
    assert steps["loop"]["over_loop"] == 1.0
    for row in steps.values():
        assert row["step_seconds"] > 0 and len(row["runs"]) == 2
    assert_cells(out.with_suffix(".md").read_text(), "scan (unroll 2)",
                 f"{steps['scan (unroll 2)']['over_loop']:.3f}x")


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


def decode_row(framework, method, tokens_per_s, warmup_seconds) -> dict:
    return {"framework": framework, "method": method, "length": 16, "batch_size": 8,
            "seconds": 0.5, "tokens_per_s": tokens_per_s, "warmup_seconds": warmup_seconds,
            "runs": [0.5, 0.5, 0.5], "same_tokens_as_other_framework": True}


def decode_result() -> dict:
    return {"config": {"d_model": 64, "num_heads": 2, "d_ff": 128, "layers": [1, 1],
                       "vocab": 100},
            "batch_size": 8, "src_len": 32, "beam": 4, "uncached_lengths": [16], "repeats": 3,
            "uncached_repeats": 1, "torch_threads": 1,
            "versions": {"jax": "0.10.2", "flax": "0.12.8", "torch": "2.13.0",
                         "python": "3.11.7"},
            "machine": {"platform": "Linux-test", "cpus": 2, "jax_devices": ["cpu:0"]},
            "results": [decode_row("jax", "cached", 227.88, 5.739),
                        decode_row("torch", "cached", 194.09, 0.778),
                        decode_row("jax", "uncached", 106.31, 37.549),
                        decode_row("torch", "uncached", 54.45, 2.474)],
            "summary": {"jax_cached_over_uncached_L16": 2.1434,
                        "jax_cached_over_torch_cached_L16": 1.1741}}


def corpus_result() -> dict:
    return {"backend": "cpu", "device": "TFRT_CPU_0", "machine": "x86_64",
            "args": {"steps": 4, "max_tokens": 1024, "pairs": 2000},
            "batch_shapes": [[8, 128]], "batches_per_epoch": 37, "real_token_fraction": 0.912,
            "tgt_real_fraction": 0.934, "tgt_tokens_per_batch": 955.4,
            "tgt_tokens_per_batch_of_max_tokens": 0.933,
            "rows": [{"framework": "jax", "compiled": {"programs": 3, "compile_seconds": 4.56},
                      "seconds_to_first_step": 6.78, "first_steps_tgt_tokens_per_s": 1234.4,
                      "steady_tgt_tokens_per_s": 5678.9, "median_step_seconds": 0.1234,
                      "losses": [6.5432, 6.1234], "peak_device_mib": None},
                     {"framework": "torch_eager", "seconds_to_first_step": 0.42,
                      "first_steps_tgt_tokens_per_s": 2345.6, "steady_tgt_tokens_per_s": 3456.7,
                      "median_step_seconds": 0.2345, "losses": [6.54, 6.2],
                      "peak_device_mib": 789.0}],
            "host": {"platform": "Linux-test", "processor": "AMD EPYC", "cpus": 2},
            "versions": {"jax": "0.10.2", "flax": "0.12.8", "torch": "2.13.0"}}


def race_side(what, steps, bleu, programs) -> dict:
    return {"what": what, "steps": steps, "stopped_by": "time_budget",
            "tgt_tokens_per_s": 3813.6, "tgt_tokens_per_step": 4047.6,
            "first_step_seconds": 20.03, "training_seconds": 60.77, "compile_seconds": 13.94,
            "programs_compiled": programs, "compile_cache_hits": 2, "bleu": bleu, "chrf": 51.26,
            "dev_loss": 2.3456, "dev_curve": [{"step": 5, "seconds": 1.0, "dev_loss": 3.0}],
            "peak_memory_bytes": 3 * 2 ** 30, "wall_seconds": 94.12,
            "steady_tgt_tokens_per_s": 4321.0}


def race_result() -> dict:
    """A race of 2 rounds: ours and two peer variants, the second collapsed in round 1."""
    def run(row, round_, position, tokens_per_s, collapsed=False):
        return {**row, "round": round_, "position": position,
                "tgt_tokens_per_s": tokens_per_s, "matmul_peak_flops_per_s": 301.2e9,
                "length_ratio": 0.9876, "collapsed": collapsed, "translations": f"t/{position}.txt",
                "bleu_signature": "nrefs:1|tok:13a|v:2.5.1", "chrf_signature": "nrefs:1|c:6"}
    ours = {**race_side("train.py (jax_transformer)", 1234, 31.84, 7), "side": "ours",
            "host_seconds_per_step": 0.0123,
            "bare_step": {"tgt_tokens_per_s": 4400.0, "mfu": 0.4567,
                          "matmul_peak_flops_per_s": 191.4e9},
            "environment": {"threads": 2, "devices": "2 cpu", "allocator": "kept heap",
                            "versions": {"jax": "0.10.2"}}}
    peers = {variant: {**race_side(f"Marian ({variant})", 4838, 32.61, 0), "side": "peer",
                       "variant": variant,
                       "environment": {"threads": 2, "devices": "1 cpu",
                                       "allocator": "kept heap",
                                       "versions": {"torch": "2.13.0"}}}
             for variant in ("plain", "fused+buckets")}
    runs = [run(ours, 0, 0, 3800.0), run(peers["plain"], 0, 1, 2000.0),
            run(peers["fused+buckets"], 0, 2, 2600.0),
            run(peers["fused+buckets"], 1, 3, 2800.0, collapsed=True),
            run(peers["plain"], 1, 4, 2100.0), run(ours, 1, 5, 4000.0)]
    contenders = {"ours": race_report.summarize(runs[0::5])}
    variants = {v: race_report.summarize([r for r in runs if r.get("variant") == v]) for v in peers}
    return {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "time_budget": 600.0,
            "rounds": 2,
            "versions": {"jax": "0.10.2", "torch": "2.13.0", "transformers": "5.23.0"},
            "settings": {"d_model": 512, "sides": ["ours", "peer"], "compile_cache": None},
            "same_tokenizer": True, "memory": "allocator peak bytes in use during training",
            "best_peer_variant": "fused+buckets",
            "sides": {**contenders, "peer": variants["fused+buckets"]},
            "peer_variants": variants, "runs": runs}


def compile_result() -> dict:
    rounds = {"loop": [(1.5, 20.25)], "scan (unroll 1)": [(0.5, 5.75)]}
    return {"settings": {"d_model": 512, "heads": 8, "d_ff": 2048, "vocab": 8000,
                         "dropout": 0.1, "dtype": "float32", "batch_size": 32, "src_len": 32,
                         "tgt_len": 32, "depths": [6, 12], "layers": 6, "unrolls": [1, 2],
                         "compile_rounds": 1, "warmup": 3, "steps": 10},
            "note": "Load average at the start: 1.50 1.25 1.00.",
            "compile": [dict(layers=layers, variant=variant, lower_seconds=lower * layers / 6,
                             compile_seconds=xla * layers / 6,
                             total_seconds=(lower + xla) * layers / 6, rounds=rounds[variant])
                        for layers in (6, 12) for variant, [(lower, xla)] in rounds.items()],
            "step": [dict(variant="loop", step_seconds=0.5123, step_cpu_seconds=0.9876,
                          over_loop=1.0, runs=[]),
                     dict(variant="scan (unroll 1)", step_seconds=0.5432,
                          step_cpu_seconds=1.0123, over_loop=1.0603, runs=[])],
            "device": "cpu: AMD EPYC 9454; 2 CPUs", "versions": {"jax": "0.10.2"}}


def serve_row(system, beam, sentences_per_s, bleu) -> dict:
    ours = system == "jax"
    return {"system": system, "beam": beam, "seconds": 300 / sentences_per_s,
            "sentences_per_s": sentences_per_s, "warmup_seconds": 12.345, "runs": [1.0] * 3,
            "bleu": bleu, "same_as_jax": 0.97,
            "compiled": {"programs": 3, "compile_seconds": 7.125 + beam,
                         "trace_lower_seconds": 0.625} if ours else None,
            "warm_cache": {"seconds": 2.5 * beam, "cache_hits": 3,
                           "cache_load_seconds": 0.375} if ours else None}


def step_variants_result() -> dict:
    def variant(label, devices, seconds, ratio):
        return {"label": label, "environment": {"JAX_NUM_CPU_DEVICES": str(devices)},
                "devices": devices, "round_seconds": [seconds], "step_seconds": seconds,
                "vs_first": ratio}
    return {"variants": [variant("one device", 1, 1.3441, 1.0),
                         variant("two devices", 2, 1.1802, 0.878)],
            "settings": {"rounds": 5, "steps": 5, "train_flags": ["--max-tokens", "4096"]},
            "machine": {"platform": "Linux-test", "processor": "Intel Xeon", "cpus": 2},
            "versions": {"jax": "0.10.2"}}


def data_result() -> dict:
    def size(pairs, rss, tokenizer_seconds):
        return {"pairs": pairs, "prepare": {
                    "seconds": {"read": 1.25, "tokenizer": tokenizer_seconds, "encode": 7.5,
                                "total": 21.0}, "workers": 2, "pairs": pairs,
                    "pairs_per_s": 4321, "encode_pairs_per_s_per_worker": 45678,
                    "peak_rss_mib": 1555, "peak_worker_rss_mib": 234, "directory_mib": 987},
                "sentencepiece_pairs_per_s": 55123,
                "cold": {"to_loop_seconds": 19.5, "to_step_1_seconds": 22.25, "rss_mib": 823,
                         "peak_rss_mib": 823},
                "warm": {"to_loop_seconds": 5.75, "to_step_1_seconds": 7.75, "rss_mib": rss,
                         "peak_rss_mib": rss + 11}}
    return {"args": {"sizes": [28800, 10_000_000], "distributed_size": 10_000_000, "steps": 5},
            "sizes": [size(28800, 802, 4.5), size(10_000_000, 901, 19.25)],
            "distributed": {"steps": 5, "max_relative_loss_difference": 3.2e-8,
                            "train_data_bytes": 1_000_000, "lengths_bytes": 40_000,
                            "read_bytes_one_process": [140_000],
                            "read_bytes_two_processes": [90_000, 91_000]},
            "host": {"platform": "Linux-test", "processor": "AMD EPYC", "cpus": 2},
            "versions": {"jax": "0.10.2", "sentencepiece": "0.2.3"}}


def serve_result() -> dict:
    return {"checkpoint": "runs/bible/export", "src_path": "test.en", "ref_path": "test.fr",
            "sentences": 300, "batch_size": 32, "beam": 4, "max_len": 128, "rounds": 3,
            "threads": 2, "config": {"d_model": 256, "num_heads": 4, "d_ff": 1024,
                                     "num_encoder_layers": 3, "num_decoder_layers": 3,
                                     "tgt_vocab_size": 8000},
            "load_average": {"start": 5.25, "end": 6.75},
            "versions": {"jax": "0.10.2", "ctranslate2": "4.8.5"},
            "machine": {"platform": "Linux-test", "cpus": 2, "jax_devices": ["cpu:0"]},
            "results": [serve_row("jax", 1, 12.5, 10.11),
                        serve_row("ct2_float32", 1, 50.0, 10.11),
                        serve_row("ct2_int8", 1, 75.0, 9.87), serve_row("jax", 4, 5.0, 11.5),
                        serve_row("ct2_float32", 4, 20.0, 11.5),
                        serve_row("ct2_int8", 4, 30.0, 11.75)]}


def interactive_result() -> dict:
    def latencies(first, further, slowest):
        return dict(first_line_s=first, further_lines_s=further, slowest_further_line_s=slowest)
    rows = [dict(name="interactive jax", runs=[], **latencies(3.25, 0.075, 1.125)),
            dict(name="interactive torch", runs=[], **latencies(4.5, 1.75, 4.625)),
            dict(name="file jax", runs=[], first_sentence_s=4.25),
            dict(name="file torch", runs=[], first_sentence_s=10.5)]
    return {"checkpoint": "runs/numbers/export", "src_path": "lines.txt", "lines": 20,
            "beam": 4, "rounds": 3, "config": {"d_model": 128, "num_encoder_layers": 3,
                                               "num_decoder_layers": 3, "tgt_vocab_size": 668},
            "load_average": {"start": 7.25, "end": 8.75},
            "versions": {"jax": "0.10.2", "torch": "2.13.0"},
            "machine": {"platform": "Linux-test", "processor": "AMD EPYC", "cpus": 2},
            "cold_cache": latencies(10.0, 0.0625, 6.375), "results": rows}


# (script, results dict, cells of its tables, other text on its page)
PAGES = {
    "bench_compile": (bench_compile, compile_result, (
        "6", "12", "loop", "scan (unroll 1)", "1.50", "20.25", "21.75", "6.25", "43.50",
        "2.00x", "0.29x", "512.3", "987.6", "543.2", "1.060x", "depths", "6 12", "jax",
        "0.10.2"), ("Load average at the start: 1.50 1.25 1.00", "d_model 512",
                    "cpu: AMD EPYC 9454")),
    "bench_train": (bench_train, train_result, (
        "jax", "bfloat16", "bf16 operands", "1234", "568", "912", "2.00x", "321.0", "43.2%",
        "7.7%", "12.3", "2346", "peak RSS (MiB)", "MFU vs 4 TFLOP/s", "torch_compile",
        "failed: RuntimeError: no compiler", "batch_size", "48", "torch", "2.13.0"), (
        "765.4 GFLOP/s", "299.4 G", "gpu: NVIDIA H100 80GB HBM3", "AMD EPYC 9454",
        "1.50 1.25 1.00", "XLA_FLAGS=--xla_test_flag")),
    "bench_decode": (bench_decode, decode_result, (
        "cached", "uncached", "16", "227.9", "194.1", "5.74", "0.78", "106.3", "54.5", "37.55",
        "2.47", "yes", "jax_cached_over_uncached_L16", "2.14x", "1.17x", "torch_threads",
        "flax", "0.12.8"), ("cpu:0", "d_model 64")),
    "bench_corpus": (bench_corpus, corpus_result, (
        "jax", "torch_eager", "6.8", "1,234", "5,679", "123", "3", "4.6", "6.543 -> 6.123",
        "0.4", "2,346", "3,457", "234", "789", "real target tokens/s, first 4 steps",
        "max_tokens", "1024"), (
        "[[8, 128]], 37 batches", "91.2%", "93.4%", "955 real target tokens", "93% of",
        "cpu: TFRT_CPU_0")),
    "bench_serve": (bench_serve, serve_result, (
        "ours, JAX (jit, KV cache)", "CTranslate2 float32", "CTranslate2 int8", "greedy",
        "beam 4", "12.5", "75.0", "6.00x", "24.00", "12.35", "3", "10.11", "9.87", "97%",
        "-0.24", "+0.25", "runs/bible/export", "test.fr", "300", "ctranslate2", "4.8.5",
        "programs compiled", "8.12", "11.12", "0.62", "0.38", "2.50", "10.00"), (
        "load average 5.2 at the start, 6.8 at the end", "d_model 256", "3+3 layers",
        "vocabulary 8000")),
    "bench_interactive": (bench_interactive, interactive_result, (
        "jax", "torch", "3.25", "0.075", "1.125", "4.25", "4.50", "1.750", "4.625", "10.50",
        "jax, cold cache (one run)", "10.00", "0.062", "6.375", "runs/numbers/export",
        "lines.txt", "20", "0.10.2"), (
        "Load average 7.2 at the start, 8.8 at the end, on 2 CPUs: other jobs ran",
        "d_model 128",
        "3+3 layers", "beam 4", "median of 3 rounds", "AMD EPYC")),
    "bench_data": (bench_data, data_result, (
        "28,800", "10,000,000", "2", "1", "4", "19", "8", "21", "4,321", "45,678", "55,123",
        "1,555", "234", "987", "22.25", "5.75", "7.75", "802", "813", "901", "99",
        "1 process x 4 devices", "2 processes x 2 devices", "140,000", "14.00%", "100,000",
        "100%", "91,000", "51,000", "51%", "sentencepiece", "0.2.3"), (
        "largest relative difference of the two topologies' losses is 3.2e-08",
        "AMD EPYC", "10,000,000 pairs")),
    "step_variants": (step_variants, step_variants_result, (
        "one device", "two devices", "JAX_NUM_CPU_DEVICES=2", "1.344", "1.180", "0.88x",
        "rounds", "5", "train_flags", "--max-tokens 4096", "jax", "0.10.2"), ("Intel Xeon",)),
    "race": (race, race_result, (
        "train.py (jax_transformer)", "Marian (plain)", "1,234", "4,838", "3,900",
        "20.0", "13.9", "31.8", "32.6", "51.3", "2.346", "3.00", "peak device memory (GiB)",
        "time_budget", "4,048", "60.8", "94.1", "7", "2", "1", "sides", "ours peer",
        "compile_cache", "-", "transformers", "5.23.0", "4,321", "4,400", "98.2%", "0.0123",
        "45.7%", "191", "3,900 (3,800-4,000)", "2,050 (2,000-2,100)", "2,700 (2,600-2,800)",
        "Marian (fused+buckets) **(the race's peer)**", "0.99 (0.99-0.99)", "**collapsed**",
        "t/3.txt", "301", "2 cpu", "1 cpu", "kept heap", "jax 0.10.2", "torch 2.13.0"), (
        "600 s of wall time", "byte-identical", "allocator peak bytes",
        "NVIDIA H100 80GB HBM3 (--device cuda)", "2 round(s)", "lowest median final dev "
        "loss: fused+buckets.", "BLEU `nrefs:1|tok:13a|v:2.5.1`, chrF `nrefs:1|c:6`",
        "**Collapsed output** (its BLEU says nothing of the model): round 1, Marian "
        "(fused+buckets).")),
}


@pytest.mark.parametrize("script", PAGES)
def test_every_figure_reaches_the_page(script):
    """Each script's renderer shows its results' figures, settings, device and versions:
    a figure dropped from a table, or a setting, fails here."""
    module, make_result, cells, texts = PAGES[script]
    page = report.render_markdown(module.describe(make_result()), "results/x.json")
    assert_cells(page, *cells)
    missing = [text for text in texts if text not in page]
    assert not missing, f"text missing from the page: {missing}\n{page}"
    assert f"python benchmarks/{script}.py --render-only results/x.json" in page


def test_render_markdown_lays_out_tables_settings_device_and_versions():
    page = report.render_markdown(Report(
        title="A title", script="benchmarks/x.py", notes=["A note."],
        tables=[Table(("name", "figure"), [("a", 1.5), ("b", 2)], align="lr")],
        settings={"lengths": [16, 64], "clip_norm": None, "empty": []},
        device="cpu: a test CPU.", versions={"jax": "0.10.2"}), "benchmarks/results/x.json")
    assert page.startswith("# A title\n\nA note.\n\n| name | figure |\n| --- | ---: |\n"
                           "| a | 1.5 |\n| b | 2 |\n")
    assert_cells(page, "lengths", "16 64", "clip_norm", "-", "empty", "jax", "0.10.2")
    assert "## Device\n\ncpu: a test CPU.\n" in page
    assert page.endswith("`python benchmarks/x.py --render-only "
                         "benchmarks/results/x.json`).\n")


def test_train_page_labels_memory_by_what_was_measured():
    result = train_result()
    assert_cells(report.render_markdown(bench_train.describe(result), "x.json"),
                 "peak RSS (MiB)", "2346")
    result["rows"][0]["peak_device_mib"] = 4321.0
    page = report.render_markdown(bench_train.describe(result), "x.json")
    assert_cells(page, "peak device memory (MiB)", "4321")
    assert "peak RSS" not in page


@pytest.mark.parametrize("script", PAGES)
def test_render_only_writes_the_page_beside_the_results(script, tmp_path):
    module, make_result, _, _ = PAGES[script]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(make_result()))
    module.main(["--render-only", str(path)])  # race's corpus flags are not needed
    assert path.with_suffix(".md").read_text() == report.render_markdown(
        module.describe(make_result()), str(path))


@pytest.mark.parametrize("results", sorted((ROOT / "benchmarks" / "results").glob("*.json")),
                         ids=lambda path: path.name)
def test_committed_pages_are_rendered_from_their_results(results):
    """benchmarks/results/*.md come from their JSON by the script that wrote it, not by
    hand: after a change to a renderer, render them again with --render-only."""
    script = {"train": bench_train, "decode": bench_decode, "corpus": bench_corpus,
              "data": bench_data,
              "race": race, "compile": bench_compile, "serve": bench_serve,
              "step": step_variants, "finishing": finishing,
              "fsdp": bench_fsdp, "init": bench_init_from,
              "startup": bench_train_compile, "learning": learning,
              "interactive": bench_interactive}[results.stem.split("_")[0]]
    page = report.render_markdown(script.describe(json.loads(results.read_text())),
                                  f"benchmarks/results/{results.name}")
    assert results.with_suffix(".md").read_text() == page

@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_fsdp_smoke(tmp_path):
    out = tmp_path / "fsdp.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_fsdp.py"),
                    "--devices", "4", "--fsdp", "1", "4", "--d-model", "32", "--heads", "2",
                    "--d-ff", "64", "--layers", "1", "--vocab", "64", "--batch-size", "8",
                    "--src-len", "8", "--tgt-len", "8", "--warmup", "1", "--steps", "1",
                    "--rounds", "2", "--out", str(out)], check=True, capture_output=True,
                   text=True, timeout=600, env={**os.environ, **CPU_ONLY})
    rows = {row["fsdp"]: row for row in json.loads(out.read_text())["results"]}
    assert set(rows) == {1, 4} and rows[1]["data"] == 4 and rows[4]["data"] == 1
    assert rows[1]["share"] == 1.0 and rows[4]["share"] <= 0.25 * 1.05
    assert rows[1]["total_bytes"] == rows[4]["total_bytes"] and rows[4]["step_ms"] > 0
    assert_cells(out.with_suffix(".md").read_text(), f"{rows[4]['share']:.3f}")


@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_init_from_smoke(tmp_path):
    out = tmp_path / "init_from.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_init_from.py"),
                    "--layers", "1", "--d-model", "64", "--out", str(out), "--runs",
                    "8 devices, --fsdp 8", "8 devices, whole"], check=True,
                   capture_output=True, text=True, timeout=600, env={**os.environ, **CPU_ONLY})
    split, whole = json.loads(out.read_text())["runs"].values()
    assert split["device_state_bytes"] <= whole["device_state_bytes"] / 8 * 1.05
    assert split["scanned"] and not whole["scanned"] and whole["peak_host_bytes"] > 2**20
    assert split["first_loss"] == whole["first_loss"]  # on as many devices: exact
    assert_cells(out.with_suffix(".md").read_text(), repr(split["first_loss"]))


@pytest.mark.slow  # a subprocess; see pyproject.toml
def test_bench_train_compile_smoke(tmp_path):
    out = tmp_path / "startup.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_train_compile.py"),
                    "--layers", "1", "--devices", "1", "--scan", "on", "--rounds", "1",
                    "--out", str(out)], check=True, capture_output=True, text=True,
                   timeout=600, env={**os.environ, **CPU_ONLY})
    result = json.loads(out.read_text())
    [row] = result["results"]
    assert (row["layers"], row["devices"], row["scan"]) == (1, 1, "on")
    assert 0 < row["train_step_compile_seconds"] < row["compile_ahead_seconds"]
    assert row["compile_ahead_seconds"] < row["seconds_before_training"]
    assert row["first_step_seconds"] > 0 and result["import_seconds"][0] > 0
    assert_cells(out.with_suffix(".md").read_text(), f"{row['train_step_compile_seconds']:.1f}")


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



@pytest.mark.slow  # a subprocess: JAX compiles four searches
def test_bench_serve_smoke(tmp_path):
    """A random tiny model with its tokenizer, six sentences, one round: every system and
    search gives a row; CTranslate2 float32 translates exactly as ours does."""
    pytest.importorskip("ctranslate2")  # the serve extra (absent from the GPU image)
    import torch

    import torch_reference
    from transformer_core.config import TransformerConfig
    from transformer_core.tokenizer import Tokenizer
    text = ["the quick brown fox jumps over the lazy dog", "a stitch in time saves nine",
            "hello world how are you today"] * 20
    Tokenizer.train(text, tmp_path / "spm.model", vocab_size=40)
    torch.manual_seed(0)
    torch_reference.Transformer(TransformerConfig(
        src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4, d_ff=64,
        num_encoder_layers=1, num_decoder_layers=1, max_len=16)).save_pretrained(
        tmp_path / "ckpt", tokenizer=tmp_path / "spm.model")
    (tmp_path / "src.txt").write_text("\n".join(text[:6]) + "\n")
    (tmp_path / "ref.txt").write_text("\n".join(text[1:7]) + "\n")
    out = tmp_path / "serve.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_serve.py"),
                           "--checkpoint", str(tmp_path / "ckpt"),
                           "--src-path", str(tmp_path / "src.txt"),
                           "--ref-path", str(tmp_path / "ref.txt"), "--sentences", "6",
                           "--batch-size", "4", "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {(row["system"], row["beam"]): row for row in result["results"]}
    assert set(rows) == {(system, beam) for system in bench_serve.SYSTEMS for beam in (1, 4)}
    for row in rows.values():
        assert row["sentences_per_s"] > 0 and len(row["runs"]) == 1 and 0 <= row["bleu"] <= 100
    assert rows["ct2_float32", 1]["same_as_jax"] == rows["ct2_float32", 4]["same_as_jax"] == 1
    for beam in (1, 4):  # compiled into the empty cache, then every program loaded from it
        compiled, warm = rows["jax", beam]["compiled"], rows["jax", beam]["warm_cache"]
        assert compiled["programs"] > 0 and compiled["cache_hits"] == 0
        assert warm["programs"] == 0 and warm["cache_hits"] >= compiled["programs"]
    assert_cells(out.with_suffix(".md").read_text(), "CTranslate2 int8",
                 f"{rows['ct2_int8', 4]['sentences_per_s']:.1f}")


@pytest.mark.slow  # jaxformer-translate processes
def test_bench_interactive_smoke(torch_checkpoint, tmp_path):
    """A tiny checkpoint, three lines, one round: every figure of both frameworks."""
    (tmp_path / "src.txt").write_text("the cat\na dog sat\nthe red house\n")
    out = tmp_path / "interactive.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_interactive.py"),
                           "--checkpoint", str(torch_checkpoint), "--src-path",
                           str(tmp_path / "src.txt"), "--lines", "3", "--beam", "2",
                           "--rounds", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, **CPU_ONLY})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["name"] for row in result["results"]] == [
        "interactive jax", "interactive torch", "file jax", "file torch"]
    for row in [*result["results"], result["cold_cache"]]:
        figures = {k: v for k, v in row.items() if k.endswith("_s")}
        assert figures and all(0 < v < 600 for v in figures.values()), row
    assert out.with_suffix(".md").exists()


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


def test_race_alternates_its_contenders_abba():
    assert race.run_order(3, ["plain", "fused"], ["ours", "peer"]) == [
        (0, "ours"), (0, "plain"), (0, "fused"), (1, "fused"), (1, "plain"), (1, "ours"),
        (2, "ours"), (2, "plain"), (2, "fused")]
    assert race.run_order(2, ["plain"], ["peer"]) == [(0, "plain"), (1, "plain")]


def test_race_writes_the_output_and_flags_a_collapsed_one(tmp_path):
    references = [f"the {word} house is small" for word in
                  ("red", "blue", "old", "new", "big", "tall", "long", "dark", "warm", "cold")]
    varied = race.check_output(references[::-1], references, tmp_path / "varied.txt")
    assert (tmp_path / "varied.txt").read_text().splitlines() == references[::-1]
    assert not varied["collapsed"] and varied["length_ratio"] == 1.0
    assert varied["bleu_signature"].startswith("nrefs:1") and "chrf_signature" in varied
    # 4 empty lines and 3 copies of one line: 7 of 10
    collapsed = race.check_output(["", "", "", "", "the the", "the the", "the the",
                                   *references[:3]], references, tmp_path / "collapsed.txt")
    assert collapsed["collapsed"] and collapsed["empty_lines"] == 4
    assert collapsed["most_repeated_line"] == 3 and collapsed["length_ratio"] < 0.5
    assert collapsed["bleu"] < varied["bleu"]


def test_race_peer_variants():
    from benchmarks import race_peer
    assert race_peer.variant_features("plain") == frozenset()
    assert race_peer.variant_features("fused+init") == {"fused", "init"}
    for bad in ("fast", "fused+fused", ""):
        with pytest.raises(ValueError):
            race_peer.variant_features(bad)
    lengths = [3, 5, 9, 12, 17, 17, 30, 31]  # buckets: widths padded to multiples of 8
    src = [[7] * n for n in lengths]
    tgt = [[7] * (n + 1) for n in lengths]
    batches = race_peer.token_budget_batches(src, tgt, 64, race_peer.WIDTH_MULTIPLE)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        inputs, labels = race_peer.peer_batch(batch, src, tgt, race_peer.WIDTH_MULTIPLE)
        assert inputs["input_ids"].shape[1] % 8 == 0 and labels.shape[1] % 8 == 0
        assert labels.numel() <= 64
    shapes = [race_peer.peer_batch(b, src, tgt, 8)[1].shape for b in batches]
    assert sorted(map(tuple, shapes)) == [(2, 8), (2, 16), (2, 24), (2, 32)]  # one width each


@pytest.mark.slow  # imports transformers' Marian
def test_race_peer_init_variant_draws_embeddings_at_d_model_to_the_minus_half():
    from argparse import Namespace
    from benchmarks import race_peer
    args = Namespace(d_model=64, layers=1, heads=2, d_ff=64, dropout=0.0, max_len=16)
    plain = race_peer.marian(args, 500).get_input_embeddings().weight.detach()
    paper = race_peer.marian(args, 500, paper_init=True).get_input_embeddings().weight.detach()
    assert float(plain.std()) == pytest.approx(0.02, rel=0.1)
    assert float(paper.std()) == pytest.approx(64 ** -0.5, rel=0.1)
    assert not paper[race_peer.PAD_ID].any()


def test_race_summarizes_rounds_as_medians_with_their_spread():
    result = race_result()
    ours = result["sides"]["ours"]
    assert ours["runs"] == 2 and ours["tgt_tokens_per_s"] == 3900.0
    assert ours["spread"]["tgt_tokens_per_s"] == [3800.0, 4000.0]
    assert result["peer_variants"]["fused+buckets"]["collapsed_runs"] == 1


def test_race_reads_when_ours_reached_the_peers_final_dev_loss():
    run = {"dev_curve": [{"step": 100, "seconds": 100.0, "dev_loss": 6.0},
                         {"step": 200, "seconds": 200.0, "dev_loss": 5.0},
                         {"step": 300, "seconds": 300.0, "dev_loss": 4.5}],
           "training_seconds": 350.0, "dev_loss": 4.4}
    assert race_report.seconds_to_reach(run, 5.2) == pytest.approx(180.0)  # 20% of the way 6 -> 5
    assert race_report.seconds_to_reach(run, 7.0) == 100.0  # at the first evaluation already
    assert race_report.seconds_to_reach(run, 4.42) == pytest.approx(340.0)  # toward the final one
    assert race_report.seconds_to_reach(run, 4.3) is None
    result = race_result()
    for row in result["runs"]:
        if row["side"] == "ours":
            row.update(run)
    result["peer_variants"]["fused+buckets"].update(dev_loss=5.2, training_seconds=600.0)
    page = report.render_markdown(race.describe(result), "race.json")
    assert ("final dev loss, 5.200 (median), reached by train.py at: 180 s (30%), 180 s "
            "(30%), by round, against the peer's 600 s of training") in page


def test_race_ours_training_loss_is_the_mean_since_the_previous_evaluation():
    """train.py's metrics.jsonl records, evaluated every 2 steps and at the last (--steps
    5): each evaluation's training loss is the mean of the step losses since the last."""
    records = [{"step": 1, "compile_seconds": 9.0},
               *({"step": step, "loss": loss, "elapsed": float(step)}
                 for step, loss in zip(range(1, 6), (9.0, 7.0, 6.0, 4.0, 3.5))),
               {"step": 2, "dev_loss": 7.5}, {"step": 4, "dev_loss": 5.5},
               {"step": 5, "dev_loss": 5.0}]
    records.sort(key=lambda r: r["step"])  # as metrics.jsonl has them
    step_starts = {r["step"]: 10.0 + r["elapsed"] for r in records if "loss" in r}
    assert race.dev_curve(records, step_starts) == [
        {"step": 2, "seconds": 13.0, "dev_loss": 7.5, "train_loss": 8.0},
        {"step": 4, "seconds": 15.0, "dev_loss": 5.5, "train_loss": 5.0},
        {"step": 5, "seconds": 15.0, "dev_loss": 5.0, "train_loss": 3.5}]


@pytest.mark.slow  # trains a Marian for 1.5 s, importing transformers
def test_race_peer_training_loss_is_the_mean_since_the_previous_evaluation(monkeypatch):
    """train_until, a tiny Marian for 1.5 s on the CPU: each evaluation's training
    loss is the mean of the losses (per real target token) of the steps since the last."""
    import contextlib
    from argparse import Namespace
    import torch
    from benchmarks import race_peer
    args = Namespace(d_model=16, layers=1, heads=2, d_ff=32, dropout=0.0, max_len=16,
                     warmup=10, eval_every=3)
    src = [[5 + (i * j) % 40 for j in range(3 + i % 5)] + [race_peer.EOS_ID] for i in range(24)]
    tgt = [[6 + (i + j) % 40 for j in range(2 + i % 6)] + [race_peer.EOS_ID] for i in range(24)]
    batches = [race_peer.peer_batch(b, src, tgt)
               for b in race_peer.token_budget_batches(src, tgt, 32)]
    step_losses = []  # the training steps' losses, in order (the dev loss has no gradients)
    loss_sum_of = race_peer.smoothed_loss_sum

    def recorded(logits, labels):
        loss_sum = loss_sum_of(logits, labels)
        if torch.is_grad_enabled():
            step_losses.append(loss_sum.item() / race_peer.real_tokens(labels))
        return loss_sum
    monkeypatch.setattr(race_peer, "smoothed_loss_sum", recorded)
    model = race_peer.marian(args, 50)
    started = time.monotonic()
    trained = race_peer.train_until(started + 1.5, started, model, batches, batches[:2], args,
                                    torch.device("cpu"), contextlib.nullcontext, frozenset())
    assert len(trained["dev_curve"]) >= 2 and len(step_losses) == trained["steps"]
    for point in trained["dev_curve"]:
        since_last = step_losses[point["step"] - 3:point["step"]]
        assert point["train_loss"] == pytest.approx(sum(since_last) / 3)


def test_race_page_shows_each_runs_training_loss_beside_its_dev_loss():
    """Both sides' dev and training losses at each evaluation step, run by run; no such
    table for results without training losses (written before they were recorded)."""
    result = race_result()
    assert "| step 2 |" not in report.render_markdown(race.describe(result), "race.json")
    ours = [{"step": 2, "seconds": 13.0, "dev_loss": 7.5, "train_loss": 8.0},
            {"step": 4, "seconds": 15.0, "dev_loss": 5.5, "train_loss": 5.0},
            {"step": 5, "seconds": 15.0, "dev_loss": 5.0, "train_loss": 3.5}]
    peer = [{"step": 2, "seconds": 3.0, "dev_loss": 7.25, "train_loss": 7.75},
            {"step": 4, "seconds": 6.0, "dev_loss": 6.25, "train_loss": 6.5},
            {"step": 6, "seconds": 9.0, "dev_loss": 5.25, "train_loss": 5.75}]
    for row in result["runs"]:
        row["dev_curve"] = ours if row["side"] == "ours" else peer
    page = report.render_markdown(race.describe(result), "race.json")
    assert "| run | round | contender | step 2 | step 4 | step 5 | step 6 |" in page
    assert ("| 1 | 0 | train.py (jax_transformer) | dev 7.500 / train 8.000 | "
            "dev 5.500 / train 5.000 | dev 5.000 / train 3.500 | - |") in page
    assert ("| 2 | 0 | Marian (plain) | dev 7.250 / train 7.750 | dev 6.250 / train 6.500 | "
            "- | dev 5.250 / train 5.750 |") in page
    assert "the mean of the steps' losses since the previous evaluation" in page


@pytest.mark.slow  # two training subprocesses, 30 s each
def test_race_smoke(tmp_path):
    """The race, end to end on a CPU: a tiny model, 30 s a side, the time to the first
    step included, ours and one peer variant (the rounds' order: run_order's test). Ours compiles its steps in that
    time unless the pytest compilation cache (conftest.py) has them: up to ~20 s cold on
    a loaded 2-core machine, so even a cold run trains some steps."""
    out = tmp_path / "race.json"
    race = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "race.py"), *write_natural_corpus(tmp_path),
         "--time-budget", "30", "--device", "cpu", "--d-model", "32", "--heads", "2",
         "--d-ff", "64", "--layers", "1", "--dropout", "0", "--vocab-size", "300",
         "--max-len", "96", "--max-tokens", "1536", "--warmup", "20", "--eval-every", "5",
         "--rounds", "1", "--peer-variants", "fused+buckets+init",
         "--compile-cache", os.environ["JAX_COMPILATION_CACHE_DIR"], "--out", str(out)],
        capture_output=True, text=True, timeout=600)
    assert race.returncode == 0, race.stdout[-3000:] + race.stderr[-3000:]
    result = json.loads(out.read_text())
    assert set(result["sides"]) == {"ours", "peer"} and result["same_tokenizer"]
    assert result["best_peer_variant"] == "fused+buckets+init"
    assert [(run["round"], run["side"]) for run in result["runs"]] == [(0, "ours"), (0, "peer")]
    for run in result["runs"]:  # each run's footing and output, recorded
        environment = run["environment"]
        assert environment["threads"] == len(os.sched_getaffinity(0))
        assert "keeping freed memory" in environment["allocator"]
        assert environment["devices"] and environment["versions"]
        assert run["matmul_peak_flops_per_s"] > 0
        # 30 s of a tiny model may translate every line as nothing: flagged as collapsed
        assert run["length_ratio"] > 0 or (run["collapsed"] and run["empty_lines"] == 20)
        assert len((ROOT / run["translations"]).read_text().splitlines()) == 20
    assert all(run["environment"]["devices"].endswith(" cpu") for run in result["runs"])
    for side in result["sides"].values():
        assert all(side.get(field) is not None for field in RACE_FIELDS), side
        assert side["steps"] > 0 and side["stopped_by"] == "time_budget"
        assert side["tgt_tokens_per_s"] > 0 and side["peak_memory_bytes"] > 0
        assert 0 <= side["bleu"] <= 100 and 0 <= side["chrf"] <= 100
        assert [point["step"] for point in side["dev_curve"]] == list(
            range(5, side["steps"] + 1, 5))
        assert all(point["train_loss"] > 0 for point in side["dev_curve"])
    ours = result["sides"]["ours"]
    assert ours["steady_tgt_tokens_per_s"] > 0 and ours["host_seconds_per_step"] > 0
    assert ours["bare_step"]["tgt_tokens_per_s"] > 0 and 0 < ours["bare_step"]["mfu"] < 1
    assert out.with_suffix(".png").stat().st_size > 0
    page = out.with_suffix(".md").read_text()
    for side in result["sides"].values():
        assert_cells(page, side["what"], f"{side['steps']:,}", f"{side['dev_loss']:.3f}")


@pytest.mark.slow  # train.py and two workers in subprocesses
def test_step_variants_smoke(tmp_path):
    """Two workers on a tiny run's step, one device each and two: each reports its
    devices and a step time per round."""
    run_flags = ["--workdir", str(tmp_path / "run"), "--num-train", "300", "--num-dev", "20",
                 "--num-test", "20", "--vocab-size", "100", "--d-model", "16", "--heads", "2",
                 "--d-ff", "32", "--layers", "1", "--max-tokens", "512", "--quiet"]
    trained = subprocess.run([sys.executable, "train.py", *run_flags, "--steps", "1"],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    out = tmp_path / "variants.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_variants.py"), "--rounds", "2",
         "--steps", "2", "--variant", "one: JAX_NUM_CPU_DEVICES=1",
         "--variant", "two: JAX_NUM_CPU_DEVICES=2", "--out", str(out), "--", *run_flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    variants = json.loads(out.read_text())["variants"]
    assert [(v["label"], v["devices"]) for v in variants] == [("one", 1), ("two", 2)]
    assert all(len(v["round_seconds"]) == 2 and v["step_seconds"] > 0 for v in variants)
    assert variants[0]["vs_first"] == 1.0


def test_a_written_page_is_what_render_only_gives(tmp_path):
    """A run's page is rendered from its JSON as written, so --render-only reproduces it
    (a tuple in the results, as in batch_shapes, becomes a list in JSON)."""
    result = corpus_result()
    result["batch_shapes"] = [(8, 128)]
    path = tmp_path / "corpus_cpu.json"
    written = report.write_results(result, path, bench_corpus.describe)
    bench_corpus.main(["--render-only", str(path)])
    assert path.with_suffix(".md").read_text() == written


def test_device_idle_counts_the_union_of_gpu_events_only(tmp_path):
    """Overlapping GPU events count once; host events are not device time."""
    from benchmarks import device_idle
    events = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
              {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
              *({"ph": "X", "pid": 1, "ts": ts, "dur": dur} for ts, dur in
                ((0, 10), (5, 10), (20, 10), (22, 3))),
              {"ph": "X", "pid": 2, "ts": 0, "dur": 100}]
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    with gzip.open(run / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert device_idle.busy_and_span(str(tmp_path)) == (25, 30)


@pytest.mark.slow  # train.py and six test translations
def test_finishing_smoke(tmp_path):
    """A tiny run on a small natural-length corpus: the three models (last, best by dev
    BLEU, the average of the newest) each translate with both searches, and the page
    shows every row."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_natural_corpus(corpus)
    out = tmp_path / "finishing.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "finishing.py"),
                    "--corpus", str(corpus), "--src", "src", "--tgt", "tgt",
                    "--workdir", str(tmp_path / "run"), "--steps", "12", "--every", "4",
                    "--dev-bleu-sentences", "10", "--test-sentences", "5", "--model-flags",
                    "--d-model 32 --heads 4 --d-ff 64 --layers 1 --vocab-size 120 "
                    "--max-len 64 --max-tokens 1024 --warmup 4", "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=900)
    result = json.loads(out.read_text())
    rows = {(r["model"], r["search"]): r for r in result["results"]}
    assert set(rows) == {(model, search) for model in (
        "last", "best by dev BLEU", "average of the newest 3") for search in finishing.SEARCHES}
    assert rows["average of the newest 3", "greedy"]["steps"] == [4, 8, 12]
    assert [r["step"] for r in result["dev_bleu_curve"]] == [4, 8, 12]
    assert_cells(out.with_suffix(".md").read_text(), "average of the newest 3", "4 8 12",
                 "beam 4, alpha 0.6", f"{rows['last', 'greedy']['bleu']:.2f}")


def learning_result(ours_losses, peer_losses) -> dict:
    """A learning.py results dict: the peer, and train.py's defaults ("defaults"), each
    with two seeds of the given dev losses (a list per seed) at steps 50 and 100."""
    def rows(name, losses):
        return [{"name": name, "seed": seed, "seconds": 1.0, "train_tokens_per_step": 100.0,
                 "dev_curve": [{"step": step, "dev_loss": loss, "train_loss": loss + 0.5}
                               for step, loss in zip((50, 100), seed_losses)]}
                for seed, seed_losses in enumerate(losses)]
    return {"settings": {"d_model": 16, "layers": 6, "warmup": 40, "eval_every": 50},
            "runs": rows("peer", peer_losses) + rows("defaults", ours_losses),
            "machine": {"jax_devices": ["cpu:0"], "cpus": 2, "platform": "linux"},
            "versions": {"jax": "0"}}


def test_learning_check_fails_where_ours_trails_the_peer_by_over_the_tolerance():
    """--check reads the seeds' mean dev loss at each evaluation: ours may be at most
    CHECK_TOLERANCE over the peer's."""
    peer = [[6.0, 5.0], [6.2, 5.2]]  # means 6.1, 5.1
    within = learning_result([[6.12, 4.9], [6.14, 5.0]], peer)  # 6.13, 4.95
    assert learning.check(within, "defaults") == []
    behind = learning_result([[6.12, 5.2], [6.14, 5.1]], peer)  # 6.13, 5.15
    assert learning.check(behind, "defaults") == ["step 100: 5.150 against the peer's 5.100"]
    with pytest.raises(SystemExit, match="needs the runs peer and old_recipe"):
        learning.check(within, "old_recipe")


def test_learning_page_reads_each_run_against_the_run_it_changes():
    result = learning_result([[6.0, 5.0]], [[6.5, 5.5], [6.7, 5.7]])
    page = report.render_markdown(learning.describe(result), "learning.json")
    assert "| run | side | seed | what it changes | step 50 | step 100 | train loss |" in page
    assert "| peer | peer | 1 |" in page and "6.700 | 5.700 | 6.200 | - | 100 |" in page
    # defaults against the peer's mean final dev loss, 5.6
    assert "| defaults | ours | 0 |" in page and "6.000 | 5.000 | 5.500 | -0.600 (peer) |" in page
