"""How many JAX devices train.py splits a CPU into (--cpu-devices).

XLA:CPU runs one program on one device, and shares each op's work among the
cores; between the large matmuls a 2-core machine runs transposes, soft-maxes
and masks at a fraction of both cores. Split into two devices, each core runs its
half of the batch's rows through the whole step, and the gradients are summed
across them (data parallel, the same maths), which is faster on 2 cores
(docs/performance.md, "Two devices on a CPU").

    split_cpu(requested, fewest_rows)   before JAX starts its backends: the split (none
                                        on other backends, whose devices are their chips)

The user's choice wins: --cpu-devices, else JAX_NUM_CPU_DEVICES or XLA_FLAGS'
--xla_force_host_platform_device_count, else DEFAULT_CPU_DEVICES where the cores
and the batch's rows allow it.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax

from transformer_core.errors import TrainError

DEFAULT_CPU_DEVICES = 2  # measured on 2 cores; more devices than cores ran slower
FORCED_COUNT_FLAG = "--xla_force_host_platform_device_count"


def chosen_count(requested: int | None, fewest_rows: int,
                 environ: Mapping[str, str] = os.environ, cores: int | None = None) -> int | None:
    """The device count to set: `requested` (--cpu-devices), else None to leave JAX's own
    (the user set it another way, or one device is all the machine or a batch of
    `fewest_rows` rows holds)."""
    if requested is not None:
        return requested
    if environ.get("JAX_NUM_CPU_DEVICES") or FORCED_COUNT_FLAG in environ.get("XLA_FLAGS", ""):
        return None
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    count = min(DEFAULT_CPU_DEVICES, cores, fewest_rows)
    return count if count > 1 else None


def split_cpu(requested: int | None, fewest_rows: int) -> None:
    """Give the CPU backend `chosen_count` devices. It must come before JAX starts its
    backends: an in-process caller that already started them keeps its devices, unless
    --cpu-devices `requested` another count (a TrainError)."""
    count = chosen_count(requested, fewest_rows)
    if count is None or jax.config.jax_num_cpu_devices == count:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX's backends are running
        running = jax.local_device_count("cpu")
        if requested is not None and running != count:
            raise TrainError(f"--cpu-devices {count}: JAX already started this process's "
                             f"backends with {running} CPU device(s); run train.py in a "
                             "new process") from None
