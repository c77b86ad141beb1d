"""Fixtures of the parity suite; shared code lives in helpers.py."""

import pytest
import torch

from parity_tests.helpers import DIRECTIONS

torch.set_num_threads(2)


@pytest.fixture(params=DIRECTIONS)
def direction(request):
    return request.param
