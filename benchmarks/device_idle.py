"""How much of train.py's steady state the GPU sits idle: a profiler trace over steps
FIRST..LAST of a real run, and 1 - (time covered by GPU events) / (the trace's GPU span).

    python benchmarks/device_idle.py --first 50 --last 65 -- TRAIN_PY_FLAGS...   # one JSON line

train.py runs in this process with its own flags, its training step wrapped so that
the FIRST call starts `jax.profiler` and the LAST, once its results are ready,
stops it. The idle time counts every gap between kernels and copies on the GPU:
the loop's (host work, waiting for a batch) and the step's own (launch gaps, a
scan's loop). The profiler adds host time of its own, so this is an upper bound.
Needs a GPU: a CPU trace has no device events.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class ProfiledSteps:
    """A jitted step that traces its calls `first`..`last` into `trace_dir`."""

    def __init__(self, step, first: int, last: int, trace_dir: str):
        self.step, self.first, self.last, self.trace_dir = step, first, last, trace_dir
        self.calls = 0

    def __getattr__(self, name):  # .lower() etc.: compile_ahead compiles the step itself
        return getattr(self.step, name)

    def __call__(self, *args, **kwargs):
        import jax
        self.calls += 1
        if self.calls == self.first:
            jax.profiler.start_trace(self.trace_dir)
        out = self.step(*args, **kwargs)
        if self.calls == self.last:
            jax.block_until_ready(out)
            jax.profiler.stop_trace()
        return out


def busy_and_span(trace_dir: str) -> tuple[float, float]:
    """(microseconds covered by GPU events, microseconds from the first to the last)."""
    path = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
    events = json.load(gzip.open(path))["traceEvents"]
    gpus = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
            and "GPU" in e["args"]["name"]}
    intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("ph") == "X" and e.get("pid") in gpus and e.get("dur"))
    if not intervals:
        raise SystemExit(f"error: {path} holds no GPU events (device_idle.py needs a GPU)")
    busy, end = 0.0, None
    for start, stop in intervals:  # the union of the intervals
        if end is None or start > end:
            busy, end = busy + stop - start, stop
        elif stop > end:
            busy, end = busy + stop - end, stop
    return busy, end - intervals[0][0]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first", type=int, default=50, help="first traced step (default 50)")
    p.add_argument("--last", type=int, default=65, help="last traced step (default 65)")
    p.add_argument("--trace-dir", default="/tmp/device_idle_trace")
    p.add_argument("train_flags", nargs=argparse.REMAINDER, help="-- then train.py's flags")
    args = p.parse_args(argv)
    if not 1 <= args.first <= args.last:
        p.error("need 1 <= --first <= --last")
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags

    from jax_transformer.commands import train as train_command
    from jax_transformer.train import step as step_module
    build = step_module.Trainer.__init__

    def build_profiled(trainer, *a, **k):
        build(trainer, *a, **k)
        trainer.train_step = ProfiledSteps(trainer.train_step, args.first, args.last,
                                           args.trace_dir)

    step_module.Trainer.__init__ = build_profiled
    code = train_command.main(flags)
    if code:
        raise SystemExit(code)
    busy, span = busy_and_span(args.trace_dir)
    result = {"steps": [args.first, args.last], "span_ms": round(span / 1e3, 2),
              "busy_ms": round(busy / 1e3, 2), "device_idle_fraction": round(1 - busy / span, 4)}
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
