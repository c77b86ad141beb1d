"""Fixtures of the parity suite; shared code lives in helpers.py.

The suite's numerics are pinned here, for every test: float32 is IEEE float32
on every device (no TF32 or bf16 matmul passes in JAX or torch), and torch uses
its deterministic algorithms (jax_transformer.numerics.pinned_numerics).
"""

import pytest
import torch

from jax_transformer.numerics import pinned_numerics
from parity_tests.helpers import DIRECTIONS

torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def pinned():
    with pinned_numerics():
        yield


@pytest.fixture(params=DIRECTIONS)
def direction(request):
    return request.param
