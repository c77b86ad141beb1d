"""Test-session setup shared by parity_tests/ and tests/: one OpenMP thread per worker,
one CPU device, the compilation cache, the release of compiled programs, and the
jax_pinned marker.

JAX's persistent compilation cache lets the many tests that compile the same
program (train.py runs, decoding searches, the hundreds of small eager ops a
float64 parity test dispatches) reuse the executable instead of recompiling it.
It reuses identical compiled programs only (the key covers the program, the JAX
and XLA versions and the flags), so results are unchanged. It is kept between
sessions, in $JAX_COMPILATION_CACHE_DIR or ~/.cache/jax_transformer/pytest-xla
(about 20 MB for the fast tier; delete it at will), so a repeated test run compiles
little; subprocesses started by tests inherit it through JAX_COMPILATION_CACHE_DIR.
"""

import gc
import os
import tomllib
from pathlib import Path

import jax
import pytest

# The two xdist workers share the machine's cores: torch's OpenMP threads spin between
# the small ops of the parity tests and starve the other worker (a training step of
# test_mixed_precision's copy model took 330-440 ms with 2 threads and 18-25 ms with 1,
# beside a running suite). Read when torch is first imported, and by subprocesses.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# One CPU device, in this process and the train.py processes tests start, unless a test
# asks for more: train.py's own default (2 on a CPU, train/runtime/cpu_devices.py) would
# otherwise hold for whichever in-process run first starts JAX in a worker, and for
# every later test of that worker. tests/train/test_cpu_devices.py runs the default.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "1")

_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "jax_transformer",
                  "pytest-xla")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(_CACHE_DIR))
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _memory_map_limit() -> int | None:
    """The kernel's limit on one process's memory mappings (vm.max_map_count), or None
    where the platform has no /proc."""
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except OSError:
        return None


_MAP_LIMIT = _memory_map_limit()


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Frees JAX's compiled programs once this process holds half of the kernel's
    memory-mapping limit. Every XLA:CPU executable keeps its code mapped until it is
    dropped from JAX's caches, and a test worker that runs hundreds of tests
    accumulates tens of thousands of mappings (a float32 forward-parity test adds ~400);
    at vm.max_map_count (65,530 by default) the next program XLA loads cannot be
    mapped and the process dies with a segfault or an abort inside the compile. The
    programs come back from the persistent cache when a later test needs them."""
    yield
    if _MAP_LIMIT is None:
        return
    with open("/proc/self/maps", "rb") as maps:
        mappings = maps.read().count(b"\n")
    if mappings > _MAP_LIMIT // 2:
        jax.clear_caches()
        gc.collect()


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
