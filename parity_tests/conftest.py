"""Fixtures of the parity suite; shared code lives in helpers.py.

The suite's numerics are pinned here, for every test: float32 is IEEE float32
on every device (no TF32 or bf16 matmul passes in JAX or torch), and torch uses
its deterministic algorithms (jax_transformer.numerics.pinned_numerics).
"""

import os

import filelock
import jax
import pytest
import torch

from jax_transformer.numerics import pinned_numerics
from parity_tests.helpers import DIRECTIONS, skip_unless_float64

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def pinned():
    with pinned_numerics():
        yield


@pytest.fixture(params=DIRECTIONS)
def direction(request):
    return request.param


@pytest.fixture(scope="module")
def x64():
    """JAX's float64 (x64 mode) for the module that asks for it, from its first test
    that does to its end."""
    skip_unless_float64()
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


# Enough steps for outputs that are not just </s>; the translations are still poor.
# train.py's default sinusoids (interleaved) and draw; silu, as with relu 150 steps still
# give every sentence the same translation.
TRAINED_RUN = ("--activation", "silu", "--steps", "150", "--lr-scale", "2", "--warmup", "20",
               "--max-tokens", "2048", "--eval-every", "50", "--checkpoint-every", "50")


@pytest.fixture(scope="session")
def trained_translator(tmp_path_factory):
    """Our checkpoint directory of a tiny train.py run, converted from its orbax
    checkpoint. Trained once per test session: the first pytest-xdist worker to need
    it trains it under a lock, in the session's directory the workers share (the parent
    of each worker's), the others read it."""
    from jax_transformer.commands import port as port_command
    from tests.train.runs import tiny_run
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    workdir, checkpoint = shared / "trained_run", shared / "trained_translator"
    with filelock.FileLock(str(shared / "trained_translator.lock")):
        if not checkpoint.is_dir():
            tiny_run(workdir, *TRAINED_RUN)
            assert port_command.main(["--from", "jax-orbax", str(workdir / "checkpoints"),
                                      str(checkpoint)]) == 0
    return checkpoint
