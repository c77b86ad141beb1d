"""The bare compiled training step on a finished train.py run's own batches.

    python benchmarks/bare_step.py --steps 20 -- TRAIN_PY_FLAGS...   # prints one JSON line

The same flags as the run (its --workdir holds the run: tokenizer, config.json,
checkpoints), so the data path rebuilds the run's batches and the step's
programs come from the run's compile cache. The step runs alone on the first
--steps batches of the run's epoch 0, each waited for before the next is
dispatched: no prefetch, no metrics, no evaluation. Its median rate is what
train.py's loop can at best reach on the same batches (race.py sets the two
side by side), and its MFU is counted against a matmul peak measured here, just
before and after the steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import runner  # noqa: E402


def train_step_flops(config, shape: tuple[int, int, int]) -> float:
    """Matmul FLOPs of one training step on (rows, source length, target length) batches:
    docs/performance.md's formula (bench_train.model_flops_per_step)."""
    from benchmarks.bench_train import model_flops_per_step
    rows, src_len, tgt_len = shape
    return model_flops_per_step(config, rows, src_len, tgt_len)["train_step"]


def prepared_step(train_flags: list[str], count: int):
    """(run, state, host batches, device batches): the run rebuilt from its flags (its
    devices, compile cache and files), the first `count` batches of its epoch 0, and the
    state after one step on the first, so that the step is compiled (or loaded)."""
    import jax

    from jax_transformer.commands.train import parse_args
    from jax_transformer.train.checkpoints import Checkpointer
    from jax_transformer.train.run import prepare
    from jax_transformer.train.runtime import compiling, cpu_devices, host_memory
    from jax_transformer.train.settings.training import default_compile_cache

    started_at = time.monotonic()
    settings = parse_args(train_flags)
    # the run's devices, unless the environment sets them
    cpu_devices.split_cpu(settings.train.cpu_devices, settings.data.fewest_rows)
    host_memory.keep_freed_memory()  # as train.py does
    compile_cache = compiling.use_compilation_cache(settings.train.compile_cache,
                                                    default=default_compile_cache())
    workdir = Path(settings.train.workdir)
    with Checkpointer(workdir) as checkpointer:  # a reader: as not primary, writes nothing
        run = prepare(settings, None, workdir, False, checkpointer, compile_cache=compile_cache,
                      started_at=started_at)
    iterator = run.batches["train"].iterator()
    host_batches = [next(iterator) for _ in range(count)]
    device_batches = [run.trainer.shard_batch(b) for b in host_batches]
    state, metrics = run.trainer.train_step(run.trainer.initial_state, device_batches[0])
    jax.block_until_ready(metrics)
    return run, state, host_batches, device_batches


def measure(train_flags: list[str], steps: int) -> dict:
    """The bare step's median seconds, real target tokens/s and MFU on the run's batches."""
    import jax

    run, state, host_batches, device_batches = prepared_step(train_flags, steps)
    trainer, batches, settings = run.trainer, run.batches["train"], run.settings
    tokens = [int((b["tgt_out"] != trainer.pad_id).sum()) for b in host_batches]
    peak = runner.MatmulPeak(runner.MatmulPeak.default_size(jax.default_backend()),
                             settings.train.dtype)
    peaks = [peak.measure()]
    seconds = []
    for batch in device_batches:
        started = time.perf_counter()
        state, metrics = trainer.train_step(state, batch)
        jax.block_until_ready(metrics)
        seconds.append(time.perf_counter() - started)
    peaks.append(peak.measure())
    step_seconds = statistics.median(seconds)
    (shape,) = batches.shapes()  # train.py packs one row shape
    flops = train_step_flops(trainer.model(state).config, shape)
    return {"steps": steps, "step_seconds": round(step_seconds, 4),
            "tgt_tokens_per_s": round(statistics.median(t / s for t, s in zip(tokens, seconds)), 1),
            "train_step_flops": flops, "matmul_peak_flops_per_s": max(peaks),
            "mfu": round(flops / step_seconds / max(peaks), 4)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="timed steps (default: %(default)s)")
    p.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then the run's flags")
    args = p.parse_args(argv)
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    result = measure(flags, args.steps)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
