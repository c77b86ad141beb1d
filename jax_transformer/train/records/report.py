"""eval.json's "training": batches, compiling, speed, what stopped the run, and the
processes' copies of the trained state (which must be bit for bit the same)."""

from __future__ import annotations

import hashlib

import jax
import numpy as np

from jax_transformer.train.runtime import compiling, peers, sharding


def training_report(train_batches, *, steps: int, compiled_before, ahead_seconds: float,
                    seconds: float, real_tokens: int, seconds_before_training: float,
                    first_step_done: float | None, stopped_by: str, host_seconds: list[float],
                    data_bytes: int) -> dict:
    """host_seconds_per_step: the loop's own work per step (median CPU time of its
    thread), taking the prefetched batch and dispatching the step while the devices
    run the steps before it; its waits for the devices (a batch still being
    transferred, a full dispatch queue) are not counted. first_step_done_seconds: from
    the process's start (its imports included) to the first step's end, as the loop
    saw it (LateMetrics.first_step_done). train_data_read_bytes: what
    each process read of the prepared training split (of train_data_bytes): the
    lengths, and the sentences of its own rows of each batch (a gathering: every
    process calls this)."""
    fill = train_batches.fill()
    return {"batch_shapes": train_batches.shapes(),
            "real_token_fraction": round(fill["real_fraction"], 4),
            "tgt_tokens_per_batch": round(fill["tgt_tokens_per_batch"], 1),
            "compile_ahead_seconds": round(ahead_seconds, 2),
            "compiled": compiling.CompileCounter.since(compiled_before),
            "steps": steps,
            "tgt_tokens_per_s": round(real_tokens / max(seconds, 1e-9), 1),
            "host_seconds_per_step": (round(float(np.median(host_seconds)), 4)
                                      if host_seconds else None),
            "seconds_before_training": round(seconds_before_training, 3),
            "first_step_done_seconds": (round(first_step_done, 3)
                                        if first_step_done is not None else None),
            "stopped_by": stopped_by,
            "peak_device_memory_bytes": (jax.local_devices()[0].memory_stats()
                                         or {}).get("peak_bytes_in_use"),
            "train_data_bytes": data_bytes,
            "train_data_read_bytes": [int(n) for n in peers.gather(
                "data read", str(train_batches.bytes_read))]}


def state_digest(state) -> str:
    """SHA-256 (16 hex digits) of the parameters and optimizer state as this process
    sees them whole (a split array is gathered: every process calls it), leaf by leaf
    in tree order."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves((state.params, state.opt_state)):
        digest.update(np.asarray(sharding.local_copy(leaf)).tobytes())
    return digest.hexdigest()[:16]


def state_bytes(state) -> dict:
    """{"state_bytes", "device_state_bytes"}: the parameters' and optimizer state's bytes
    in all, and the most that any one of this process's devices holds (1/N of them
    with --fsdp N)."""
    leaves = jax.tree.leaves((state.params, state.opt_state))
    per_device: dict = {}
    for leaf in leaves:
        for shard in leaf.addressable_shards:
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    return {"state_bytes": sum(leaf.nbytes for leaf in leaves),
            "device_state_bytes": max(per_device.values())}


def replicas(state) -> dict:
    """{"processes", "devices", "state_digests"}: every process's `state_digest` (a
    gathering: every process calls it), one per process, all equal when the replicated
    state stayed in step."""
    return {"processes": jax.process_count(), "devices": jax.device_count(),
            "state_digests": peers.gather("state digest", state_digest(state))}
