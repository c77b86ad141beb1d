"""The sampling scheme (transformer_core.generation) on made-up logits: the settings'
checks, what top-k and top-p keep, frequencies, and JAX == torch token for token."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_transformer import search as jax_search
from parity_tests.helpers import fast_tier, precision, to_numpy, to_torch
from torch_reference import search as torch_search
from transformer_core.generation import Sampling, SamplingError

jax_sample_ids = jax.jit(jax_search.sample_ids, static_argnames=("k", "nucleus"))


def sample_both(logits, u, settings: Sampling):
    """(JAX ids, torch ids) for logits (B, V) and uniforms u (B,)."""
    V = logits.shape[-1]
    args = (1.0 / settings.temperature, settings.top_p)
    static = dict(k=settings.kept(V), nucleus=settings.top_p < 1)
    jax_ids = jax_sample_ids(jnp.asarray(logits), jnp.asarray(u), *args, **static)
    torch_ids = torch_search.sample_ids(to_torch(logits), to_torch(u), *args, **static)
    return np.asarray(jax_ids), to_numpy(torch_ids)


def filtered(logits, settings: Sampling):
    """The distribution sampled from, in float64 numpy: {token id: probability}."""
    x = np.asarray(logits, np.float64) / settings.temperature
    order = np.argsort(-x, kind="stable")[: settings.kept(len(x))]
    p = np.exp(x[order] - x[order].max())
    p /= p.sum()
    before = np.cumsum(p) - p
    keep = before < settings.top_p if settings.top_p < 1 else np.ones(len(p), bool)
    return dict(zip(order[keep].tolist(), (p[keep] / p[keep].sum()).tolist()))


def test_bad_settings_are_rejected():
    for kwargs, message in ((dict(temperature=-0.5), "temperature must be >= 0"),
                            (dict(temperature=float("nan")), "temperature"),
                            (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
                            (dict(top_p=1.01), "top_p"), (dict(top_p=float("nan")), "top_p"),
                            (dict(top_k=-1), "top_k must be an integer >= 0"),
                            (dict(top_k=2.5), "top_k"), (dict(seed=-1), "seed")):
        with pytest.raises(SamplingError, match=message):
            Sampling(**kwargs)
    assert Sampling(temperature=0).greedy and Sampling(top_k=0).kept(7) == 7
    assert Sampling(top_k=9).kept(7) == 7


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    logits = np.log(np.array([[0.125, 0.5, 0.0625, 0.25, 0.0625]], np.float32))
    u = np.linspace(0, 1, 101, endpoint=False, dtype=np.float32)
    for top_p, allowed in ((0.3, {1}), (0.7, {1, 3}), (0.8, {1, 3, 0}), (1.0, {0, 1, 2, 3, 4})):
        settings = Sampling(top_p=top_p)
        assert set(filtered(logits[0], settings)) == allowed
        jax_ids, torch_ids = sample_both(np.repeat(logits, len(u), 0), u, settings)
        assert set(jax_ids.tolist()) == allowed, top_p  # each allowed token drawn, no other
        np.testing.assert_array_equal(jax_ids, torch_ids)


@pytest.mark.parametrize("dtype", fast_tier(["float32", "float64"], fast={"float32"}))
def test_tiny_temperature_and_top_k_1_are_greedy(dtype):
    """top_k 1 and a tiny top_p break ties as argmax does (the lowest id); a tiny
    temperature splits a tie's mass, so it is greedy on the untied rows, however tiny."""
    with precision(dtype) as (jax_dtype, _):
        rng = np.random.default_rng(0)
        logits = rng.normal(size=(64, 30)).astype(jax_dtype)
        logits[:8, 5] = logits[:8, 17] = logits[:8].max(axis=1) + 1  # tied best
        u = rng.random(64)
        greedy = np.argmax(logits, axis=-1)
        for settings, rows in ((Sampling(temperature=1e-4), slice(8, None)),
                               # 1 / temperature overflows float32 (and logits / temperature
                               # before it): greedy all the same, no NaN
                               (Sampling(temperature=1e-38), slice(8, None)),
                               (Sampling(temperature=1e-45), slice(8, None)),
                               (Sampling(top_k=1, temperature=2.0), slice(None)),
                               (Sampling(top_p=1e-6), slice(None))):
            jax_ids, torch_ids = sample_both(logits[rows], u[rows], settings)
            np.testing.assert_array_equal(jax_ids, greedy[rows], str(settings))
            np.testing.assert_array_equal(torch_ids, greedy[rows], str(settings))


ALL_CUTS = Sampling(temperature=0.7, top_k=5, top_p=0.9)


@pytest.mark.parametrize("settings", fast_tier(
    [Sampling(), Sampling(temperature=0.7, top_k=4), Sampling(temperature=1.5, top_p=0.8),
     ALL_CUTS], fast={ALL_CUTS}), ids=["plain", "top_k", "top_p", "all"])
def test_frequencies_follow_the_filtered_distribution(settings):
    """100k draws from one row of logits: every token outside top-k/top-p is never
    drawn, the others as often as the filtered distribution says (within 5 sigma).
    The last uniforms sit at 1 - 2**-60, which float32 rounds up to 1.0."""
    logits = np.array([2.0, 1.0, 0.5, 0.5, -1.0, 0.0, 1.2, -3.0], np.float32)
    n = 100_000
    u = np.random.default_rng(1).random(n)
    u[-100:] = 1 - 2.0 ** -60
    expected = filtered(logits, settings)
    jax_ids, torch_ids = sample_both(np.tile(logits, (n, 1)), u, settings)
    np.testing.assert_array_equal(jax_ids, torch_ids)
    counts = np.bincount(jax_ids, minlength=len(logits))
    assert set(np.flatnonzero(counts).tolist()) == set(expected)
    for token, p in expected.items():
        assert abs(counts[token] / n - p) <= 5 * np.sqrt(p * (1 - p) / n), (token, p)


@pytest.mark.parametrize("dtype", fast_tier(["float32", "float64"], fast={"float32"}))
def test_jax_and_torch_draw_the_same_tokens(dtype):
    """Random logits with near ties and a large vocabulary, every kind of cut."""
    with precision(dtype) as (jax_dtype, _):
        rng = np.random.default_rng(2)
        logits = (rng.normal(size=(256, 500)) * 3).astype(jax_dtype)
        logits[:, 100:110] = logits[:, 100:101]  # ties
        u = rng.random(256)
        for settings in (Sampling(temperature=0.8), Sampling(top_k=50),
                         Sampling(temperature=1.3, top_p=0.95), Sampling(top_k=3, top_p=0.5)):
            jax_ids, torch_ids = sample_both(logits, u, settings)
            np.testing.assert_array_equal(jax_ids, torch_ids, str(settings))
            assert len(set(jax_ids.tolist())) > 1
