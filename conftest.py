"""Test-session setup shared by parity_tests/ and tests/.

JAX's persistent compilation cache lets the many tests that compile the same
program (train.py runs, decoding searches) reuse the executable instead of
recompiling it. It reuses identical compiled programs only, so results are
unchanged. The cache lives in a temporary directory for this session, and
subprocesses started by tests inherit it through JAX_COMPILATION_CACHE_DIR.
"""

import os
import tempfile

import jax

_CACHE_DIR = tempfile.mkdtemp(prefix="jax-compilation-cache-")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE_DIR)
jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)
