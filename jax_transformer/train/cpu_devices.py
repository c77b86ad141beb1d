"""How many JAX devices train.py splits a CPU into (--cpu-devices).

XLA:CPU runs one program on one device, and shares each op's work among the
cores; between the large matmuls a 2-core machine runs transposes, soft-maxes
and masks at a fraction of both cores. Split into two devices, each core runs its
half of the batch's rows through the whole step, and the gradients are summed
across them (data parallel, the same maths), which is faster on 2 cores
(docs/performance.md, "Two devices on a CPU").

    split_cpu(settings)   before JAX starts its backends: the split (none on other
                          backends, whose devices are their chips)

The user's choice wins: --cpu-devices, else JAX_NUM_CPU_DEVICES or XLA_FLAGS'
--xla_force_host_platform_device_count, else DEFAULT_CPU_DEVICES where the cores
and the batch's rows allow it.
"""

from __future__ import annotations

import os
from typing import Mapping

import jax

from jax_transformer.train.settings import RunSettings
from transformer_core.errors import TrainError

DEFAULT_CPU_DEVICES = 2  # measured on 2 cores; more devices than cores ran slower
FORCED_COUNT_FLAG = "--xla_force_host_platform_device_count"


def chosen_count(settings: RunSettings, environ: Mapping[str, str] = os.environ,
                 cores: int | None = None) -> int | None:
    """The device count to set, or None to leave JAX's own (the user set it another
    way, or one device is all the machine or the batch holds)."""
    given = settings.train.cpu_devices
    if given is not None:
        return given
    if environ.get("JAX_NUM_CPU_DEVICES") or FORCED_COUNT_FLAG in environ.get("XLA_FLAGS", ""):
        return None
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    fewest_rows = settings.data.max_tokens // settings.data.max_len  # rows of a full batch
    count = min(DEFAULT_CPU_DEVICES, cores, fewest_rows)
    return count if count > 1 else None


def split_cpu(settings: RunSettings) -> None:
    """Give the CPU backend `chosen_count` devices. It must come before JAX starts its
    backends: an in-process caller that already started them keeps its devices, unless
    --cpu-devices asked for another count (a TrainError)."""
    count = chosen_count(settings)
    if count is None or jax.config.jax_num_cpu_devices == count:
        return
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX's backends are running
        running = jax.local_device_count("cpu")
        if settings.train.cpu_devices is not None and running != count:
            raise TrainError(f"--cpu-devices {count}: JAX already started this process's "
                             f"backends with {running} CPU device(s); run train.py in a "
                             "new process") from None
