"""Test-session setup shared by parity_tests/ and tests/: the compilation cache and
the jax_pinned marker.

JAX's persistent compilation cache lets the many tests that compile the same
program (train.py runs, decoding searches, the hundreds of small eager ops a
float64 parity test dispatches) reuse the executable instead of recompiling it.
It reuses identical compiled programs only (the key covers the program, the JAX
and XLA versions and the flags), so results are unchanged. It is kept between
sessions, in $JAX_COMPILATION_CACHE_DIR or ~/.cache/jax_transformer/pytest-xla
(about 20 MB for the fast tier; delete it at will), so a repeated test run compiles
little; subprocesses started by tests inherit it through JAX_COMPILATION_CACHE_DIR.
"""

import os
import tomllib
from pathlib import Path

import jax
import pytest

_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "jax_transformer",
                  "pytest-xla")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE_DIR))
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _pinned_jax_version() -> str | None:
    """The jax version pyproject.toml pins (the one the jax_pinned tests were written for)."""
    with open(Path(__file__).with_name("pyproject.toml"), "rb") as f:
        dependencies = tomllib.load(f)["project"]["dependencies"]
    return next((d.split("==")[1] for d in dependencies if d.startswith("jax==")), None)


def pytest_collection_modifyitems(config, items):
    """jax_pinned tests read XLA's compiled programs (fusions, dot layouts), which
    change between JAX releases: they run on the pinned JAX only."""
    pinned = _pinned_jax_version()
    if jax.__version__ == pinned:
        return
    skip = pytest.mark.skip(reason=f"written for jax=={pinned} (this is {jax.__version__}): "
                                   "re-check the kernel's compiled program, then the pin")
    for item in items:
        if "jax_pinned" in item.keywords:
            item.add_marker(skip)
