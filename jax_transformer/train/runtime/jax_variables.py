"""The variables JAX reads from the environment, as bad input: a value JAX cannot parse,
or JAX_PLATFORMS naming no platform this machine has, is one TrainError naming the
variable, not JAX's traceback.

    import_jax()       import JAX, which parses its variables (JAX_ENABLE_X64,
                       JAX_NUM_CPU_DEVICES, ...) as it loads
    start_backends()   start JAX's backends, which reads JAX_PLATFORMS
"""

from __future__ import annotations

import os
import re
from typing import Mapping

from transformer_core.errors import TrainError

# JAX's errors for a variable it cannot parse, and the variable each names.
UNPARSED = ((re.compile(r'Invalid value "(?P<value>.*)" for JAX flag (?P<flag>jax_\w+)'),
             lambda m: m["flag"].upper()),
            (re.compile(r"invalid truth value '(?P<value>.*)' for environment '(?P<flag>\w+)'"),
             lambda m: m["flag"]))


def import_jax() -> None:
    """Import JAX; a variable it cannot parse is a TrainError naming it."""
    try:
        import jax  # noqa: F401
    except ValueError as e:
        for pattern, variable in UNPARSED:
            found = pattern.search(str(e))
            if found:
                raise TrainError(f"{variable(found)}={found['value']} is not a value JAX "
                                 f"takes ({e}): correct it or unset it") from None
        raise


def start_backends(environ: Mapping[str, str] = os.environ) -> None:
    """Start JAX's backends (after jax.distributed.initialize(), which must come first);
    a JAX_PLATFORMS this machine cannot serve is a TrainError naming it."""
    import jax
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as e:  # JAX skips cuda without a GPU, then asserts
        platforms = environ.get("JAX_PLATFORMS")
        if not platforms:
            raise
        detail = str(e).split(" (set JAX_PLATFORMS")[0].rstrip(".") or "none is on this machine"
        raise TrainError(f"JAX_PLATFORMS={platforms} names platforms JAX cannot start here "
                         f"({detail}); name ones this machine has (cpu, cuda, tpu), or unset it "
                         "to let JAX choose") from None
