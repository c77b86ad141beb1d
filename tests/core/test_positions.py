"""The sinusoid tables: each layout's formula, and the position offset."""

import math

import numpy as np
import pytest

from transformer_core.config import TransformerConfig
from transformer_core.positions import half_split_order, position_rows, sinusoidal_positions


@pytest.mark.parametrize("d_model", [16, 15])
def test_fairseq_layout_is_fairseqs_formula(d_model):
    """fairseq's get_embedding, written out: frequencies exp(-i log(1e4) / (D//2 - 1)),
    sines then cosines, a zero last column for odd D."""
    table = sinusoidal_positions(40, d_model, "fairseq")
    half = d_model // 2
    for pos in (0, 1, 7, 39):
        for i in range(half):
            angle = pos * math.exp(-i * math.log(10000.0) / (half - 1))
            assert table[pos, i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert table[pos, half + i] == pytest.approx(math.cos(angle), abs=1e-15)
    if d_model % 2:
        assert not table[:, -1].any()
    assert not np.allclose(table, sinusoidal_positions(40, d_model, "half_split"), atol=1e-2)


@pytest.mark.parametrize("layout", ["interleaved", "half_split", "fairseq"])
def test_position_p_reads_row_p_plus_offset(layout):
    config = TransformerConfig(d_model=16, num_heads=2, max_len=10, position_layout=layout)
    rows = position_rows(config)
    assert rows.shape == (10, 16) and not rows.flags.writeable
    np.testing.assert_array_equal(rows, sinusoidal_positions(10, 16, layout))  # default: as before
    shifted = position_rows(config.replace(position_offset=3))
    assert shifted.shape == (10, 16)
    np.testing.assert_array_equal(shifted, sinusoidal_positions(13, 16, layout)[3:])
    np.testing.assert_array_equal(shifted[:7], rows[3:])


@pytest.mark.parametrize("d_model", [16, 15])
def test_half_split_is_interleaved_with_its_columns_reordered(d_model):
    interleaved = sinusoidal_positions(40, d_model, "interleaved")
    np.testing.assert_array_equal(interleaved[:, half_split_order(d_model)],
                                  sinusoidal_positions(40, d_model, "half_split"))
