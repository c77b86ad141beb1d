"""train.py keeps the host memory XLA frees between steps (train/runtime/host_memory.py): a
block freed by a thread is reused by the next allocation, not faulted in again."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

import pytest

from jax_transformer.train.runtime import host_memory
from jax_transformer.train.runtime.host_memory import ENVIRONMENT_VARIABLE, wanted
from tests.train.runs import REPO_ROOT

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")

# Page faults of a 100 MB block written by a new thread (as XLA's threads write a
# step's buffers), after the same block was allocated and freed once before.
FRESH_BLOCK_FAULTS = """
import ctypes, resource, threading
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
libc.free.argtypes = (ctypes.c_void_p,)

def fresh_block_faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(100 * 2**20)  # 100 MB, written, freed
    libc.memset(block, 1, 100 * 2**20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

faults = []
for _ in range(2):
    thread = threading.Thread(target=fresh_block_faults)
    thread.start()
    thread.join()
print(faults[-1])
"""
BLOCK_PAGES = 100 * 2 ** 20 // 4096  # 25,600


def faults_after(setup: str, environ: dict) -> int:
    """In a new process on the CPU: `setup`, then FRESH_BLOCK_FAULTS, with malloc's
    settings from `environ` only (none the test's own environment may carry)."""
    inherited = {k: v for k, v in os.environ.items()
                 if k not in (ENVIRONMENT_VARIABLE, "GLIBC_TUNABLES")} | {"JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", setup + FRESH_BLOCK_FAULTS], cwd=REPO_ROOT,
                            env={**inherited, **environ}, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return int(result.stdout.split()[-1])


@pytest.mark.parametrize("environ, expected", [
    ({}, True),
    ({ENVIRONMENT_VARIABLE: "0"}, False),                            # turned off
    ({ENVIRONMENT_VARIABLE: "1"}, True),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"}, False),         # the user's malloc
    ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512"}, True),  # not malloc's
    ({"JAX_PLATFORMS": "cuda"}, False),                              # device memory
    ({"JAX_PLATFORMS": "tpu,cpu"}, False),
    ({"JAX_PLATFORMS": "cpu"}, True),
])
@glibc_only
def test_glibc_is_set_unless_the_environment_says_otherwise(environ, expected):
    assert wanted({"JAX_PLATFORMS": "cpu", **environ}) is expected


@glibc_only
def test_an_installed_accelerator_plugin_leaves_malloc_alone(monkeypatch):
    """Without JAX_PLATFORMS, an installed plugin (jax-cuda13-plugin's entry point)
    means a GPU run; none, a CPU run."""
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    assert not host_memory.accelerator_expected({})
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: ["xla_cuda13"] if group == "jax_plugins" else [])
    assert host_memory.accelerator_expected({})
    assert not wanted({})


@glibc_only
def test_a_plugin_in_the_jax_plugins_namespace_leaves_malloc_alone(monkeypatch, tmp_path):
    """JAX's other way of finding a plugin: a module under the jax_plugins namespace
    package, without an entry point."""
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    (tmp_path / "jax_plugins" / "xla_some_gpu").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "xla_some_gpu" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert host_memory.accelerator_expected({})
    assert not host_memory.accelerator_expected({"JAX_PLATFORMS": "cpu"})


KEEP = """
from jax_transformer.train.runtime.host_memory import keep_freed_memory
assert keep_freed_memory()
"""


@glibc_only
def test_a_freed_block_is_reused_without_page_faults():
    kept, returned = faults_after(KEEP, {}), faults_after("", {})
    assert returned > BLOCK_PAGES // 2  # glibc's default: mapped and unmapped each time
    assert kept < BLOCK_PAGES // 20


TRAIN = """
from tests.train.runs import tiny_run
tiny_run({workdir!r}, "--steps", "2", "--checkpoint-every", "2", "--eval-every", "2")
"""


@pytest.mark.slow
@glibc_only
def test_train_py_keeps_freed_memory_unless_turned_off(tmp_path):
    kept = faults_after(TRAIN.format(workdir=str(tmp_path / "kept")), {})
    returned = faults_after(TRAIN.format(workdir=str(tmp_path / "returned")),
                            {ENVIRONMENT_VARIABLE: "0"})
    assert returned > BLOCK_PAGES // 2
    assert kept < BLOCK_PAGES // 20
