"""Several hosts: joining JAX's multi-controller runtime (train.py --distributed)."""

from __future__ import annotations

import jax

from jax_transformer.train.settings import TrainError

# jax.distributed.initialize()'s ValueError when a setting is missing -> (the setting,
# where JAX looks for it). Outside a cluster JAX detects, it reads only the coordinator's
# address from the environment.
CLUSTERS = "a cluster it detects (Cloud TPU, SLURM, Open MPI)"
MISSING_DISTRIBUTED = {
    "coordinator_address should be defined": (
        "coordinator address", f"JAX_COORDINATOR_ADDRESS is not set and this is not {CLUSTERS}"),
    "Number of processes must be defined": (
        "number of processes", f"JAX takes it from {CLUSTERS}, and this is not one"),
    "process id of the current process must be defined": (
        "process id", f"JAX takes it from {CLUSTERS}, and this is not one"),
}


def initialize() -> None:
    """jax.distributed.initialize() with its settings from the environment; a setting it
    cannot find is a TrainError naming it (JAX's own message names an argument train.py
    does not have)."""
    try:
        jax.distributed.initialize()
    except ValueError as e:
        missing = next((found for text, found in MISSING_DISTRIBUTED.items() if text in str(e)),
                       None)
        if missing is None:
            raise
        what, why = missing
        raise TrainError(f"--distributed: jax.distributed.initialize() found no {what}: {why}; "
                         "on one host, run without --distributed") from None
