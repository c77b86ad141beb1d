"""Decoder-only decoding: cache vs full recompute, JAX vs torch, batched vs alone.

As in test_decoding.py, the searches run in float64 (x64 switched on for this
module), where the same tokens and scores within 1e-9 are a fair demand;
sampling is repeated in float32 with the same seed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jax_transformer import lm_decoding as jax_lm
from parity_tests.helpers import (SINGLE_STACK_CONFIGS, build_pair, fast_tier, precision,
                                  to_numpy, to_torch)
from torch_reference import lm_decoding as torch_lm
from transformer_core.generation import Sampling

DECODER_ONLY = [name for name in SINGLE_STACK_CONFIGS if name.startswith("decoder_only")]
CONFIG = SINGLE_STACK_CONFIGS["decoder_only_pre_ln_untied"]
NEW, BEAM = 10, 3
SAMPLINGS = {"plain": Sampling(seed=0), "top_k": Sampling(temperature=0.8, top_k=5, seed=1),
             "top_p": Sampling(temperature=1.5, top_p=0.8, seed=2),
             "all": Sampling(temperature=0.7, top_k=8, top_p=0.9, seed=3)}


def prompts():
    """(5, 6) right-padded prompts of lengths 6, 1, 3, 6, 2 (pad after each); an eos
    inside a prompt ends nothing."""
    ids = np.random.RandomState(0).randint(4, CONFIG.vocab_size, (5, 6))
    lengths = np.array([6, 1, 3, 6, 2])
    ids[np.arange(6) >= lengths[:, None]] = CONFIG.pad_id
    ids[3, 2] = CONFIG.eos_id
    return ids, lengths


# ------------------------------------------------------- cache vs recompute

@pytest.mark.parametrize("name", fast_tier(DECODER_ONLY, fast={"decoder_only"}))
def test_cached_step_logits_equal_full_recompute(name, direction):
    """Feeding positions 0, 1, ... one at a time (into a cache longer than the
    sequence) gives the full forward's logits at every position, in both
    frameworks, in float64."""
    config = SINGLE_STACK_CONFIGS[name]
    with precision("float64") as dtypes:
        model, torch_model = build_pair(config, direction, dtypes)
        ids = np.random.RandomState(1).randint(4, config.vocab_size, (3, 9))
        full = np.asarray(jax.jit(model)(jnp.asarray(ids)))  # (B, L, V)
        cache = model.init_cache(3, 12, jnp.float64)
        decode_step = jax.jit(model.decode_step)  # one compilation; position is traced
        steps = []
        for t in range(ids.shape[1]):
            logits, cache = decode_step(jnp.asarray(ids[:, t:t + 1]), cache, t)
            steps.append(np.asarray(logits))
        np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=1e-12, rtol=0)

        with torch.no_grad():
            full_t = to_numpy(torch_model(to_torch(ids)))
            cache = torch_model.init_cache(3, 12)
            steps = []
            for t in range(ids.shape[1]):
                logits, cache = torch_model.decode_step(to_torch(ids[:, t:t + 1]), cache, t)
                steps.append(to_numpy(logits))
        np.testing.assert_allclose(np.stack(steps, axis=1), full_t, atol=1e-12, rtol=0)
        np.testing.assert_allclose(full_t, full, atol=1e-12, rtol=0)


# ---------------------------------------------------------- searches, float64

@pytest.fixture(scope="module")
def models(x64):
    """A float64 model pair (weights copied torch -> Flax) whose continuations
    vary and end at different steps: greedy ends after 9, 8 and 2 new tokens, or
    not at all (checked in test_greedy_jax_equals_torch); Xavier-drawn weights (the
    paper's init, larger than N(0, 0.02)) make them vary."""
    model, torch_model = build_pair(CONFIG.replace(weight_init="xavier"), "torch_to_flax",
                                    (jnp.float64, torch.float64))
    rng = np.random.RandomState(1)
    kernel = to_numpy(torch_model.output_projection.weight).T * 3  # (D, V)
    kernel[:, CONFIG.eos_id] = rng.randn(CONFIG.d_model) * 1.5
    bias = rng.randn(CONFIG.vocab_size)
    bias[[CONFIG.pad_id, 1, CONFIG.bos_id]] = -10.0
    bias[CONFIG.eos_id] = 2.0
    with torch.no_grad():
        torch_model.output_projection.weight.copy_(to_torch(kernel.T))
        torch_model.output_projection.bias.copy_(to_torch(bias))
    model.output_projection.kernel[...] = jnp.asarray(kernel)
    model.output_projection.bias[...] = jnp.asarray(bias)
    return model, torch_model


def lengths_to_eos(tokens):
    """Tokens up to and including eos; -1 where there is none."""
    ended = to_numpy(tokens) == CONFIG.eos_id
    return np.where(ended.any(-1), ended.argmax(-1) + 1, -1)


def assert_same(jax_result, torch_result):
    np.testing.assert_array_equal(np.asarray(jax_result[0]), to_numpy(torch_result[0]))
    np.testing.assert_allclose(np.asarray(jax_result[1]), to_numpy(torch_result[1]), atol=1e-9,
                               rtol=0)


def test_greedy_jax_equals_torch(models):
    model, torch_model = models
    ids, lengths = prompts()
    tokens, scores = jax_lm.greedy_search(model, ids, lengths, max_new_tokens=NEW)
    assert_same((tokens, scores), torch_lm.greedy_search(torch_model, ids, lengths,
                                                         max_new_tokens=NEW))
    ends = lengths_to_eos(tokens)
    assert len(set(ends.tolist())) >= 3 and (ends == -1).any()
    for row, n in zip(np.asarray(tokens), ends):  # after eos: pad only
        assert n == -1 or (row[n:] == CONFIG.pad_id).all()
    # the scores are the continuations' log-probabilities under a full forward pass
    full = np.concatenate([ids, np.zeros((5, NEW), int)], axis=1)
    for row, (n, end) in enumerate(zip(lengths, ends)):
        full[row, n:n + NEW] = tokens[row]
    with torch.no_grad():
        log_probs = to_numpy(torch.log_softmax(torch_model(to_torch(full)), dim=-1))
    for row, (n, end) in enumerate(zip(lengths, ends)):
        count = NEW if end == -1 else end
        picked = log_probs[row, np.arange(n - 1, n - 1 + count), full[row, n:n + count]]
        assert abs(picked.sum() - float(scores[row])) < 1e-9


@pytest.mark.parametrize("name", fast_tier(list(SAMPLINGS), fast={"all"}))
def test_sample_jax_equals_torch(models, name):
    model, torch_model = models
    ids, lengths = prompts()
    tokens, scores = jax_lm.sample(model, ids, lengths, max_new_tokens=NEW,
                                   sampling=SAMPLINGS[name])
    assert_same((tokens, scores), torch_lm.sample(torch_model, ids, lengths, max_new_tokens=NEW,
                                                  sampling=SAMPLINGS[name]))
    greedy, _ = jax_lm.greedy_search(model, ids, lengths, max_new_tokens=NEW)
    assert (np.asarray(tokens) != np.asarray(greedy)).any()


def test_beam_jax_equals_torch(models):
    model, torch_model = models
    ids, lengths = prompts()
    tokens, scores = jax_lm.beam_search(model, ids, lengths, max_new_tokens=NEW,
                                        beam_size=BEAM, alpha=0.6)
    assert_same((tokens, scores), torch_lm.beam_search(torch_model, ids, lengths,
                                                       max_new_tokens=NEW, beam_size=BEAM,
                                                       alpha=0.6))
    assert (np.diff(np.asarray(scores), axis=1) <= 0).all()  # best beam first
    ends = lengths_to_eos(tokens[:, 0])
    assert len(set(ends.tolist())) >= 3 and (ends > 0).all()
    # best beams rescored by a full forward pass: log-probability / lp(new tokens)
    full = np.concatenate([ids, np.zeros((5, NEW), int)], axis=1)
    for row, n in enumerate(lengths):
        full[row, n:n + NEW] = tokens[row, 0]
    with torch.no_grad():
        log_probs = to_numpy(torch.log_softmax(torch_model(to_torch(full)), dim=-1))
    for row, (n, end) in enumerate(zip(lengths, ends)):
        picked = log_probs[row, np.arange(n - 1, n - 1 + end), full[row, n:n + end]]
        assert abs(picked.sum() / ((5.0 + end) / 6.0) ** 0.6 - float(scores[row, 0])) < 1e-9


@pytest.mark.slow
def test_float32_sampling_jax_equals_torch(models):
    """float32 models (the float64 weights rounded), the same seeds: the same tokens."""
    model64, torch_model64 = models
    with precision("float32") as dtypes:
        model, torch_model = build_pair(CONFIG, "torch_to_flax", dtypes)
        state = {k: v.float() for k, v in torch_model64.state_dict().items()}
        torch_model.load_state_dict(state)
        from jax_transformer.pretrained import load_torch_state_dict
        load_torch_state_dict(model, state)
        ids, lengths = prompts()
        for settings in SAMPLINGS.values():
            tokens, scores = jax_lm.sample(model, ids, lengths, max_new_tokens=NEW,
                                           sampling=settings)
            torch_tokens, torch_scores = torch_lm.sample(torch_model, ids, lengths,
                                                         max_new_tokens=NEW, sampling=settings)
            assert np.asarray(scores).dtype == np.float32
            np.testing.assert_array_equal(np.asarray(tokens), to_numpy(torch_tokens))
            np.testing.assert_allclose(np.asarray(scores), to_numpy(torch_scores), atol=1e-5,
                                       rtol=0)


@pytest.mark.slow  # every prompt searched alone; test_*_jax_equals_torch stay fast
@pytest.mark.parametrize("case", [("torch", "greedy beam_short"), ("torch", "sample beam"),
                                  ("jax", "greedy sample beam beam_short")],
                         ids=["torch_short", "torch", "jax"])
def test_prompts_of_different_lengths_equal_each_alone(models, case):
    """Each prompt continued alone gets the batch's tokens and scores (sampling
    with its row of the batch's uniforms). Alone means unpadded in torch; in JAX
    the prompt keeps the batch's width (one compilation per search)."""
    framework, searched = case
    model = models[0] if framework == "jax" else models[1]
    lm = jax_lm if framework == "jax" else torch_lm
    ids, lengths = prompts()
    settings = SAMPLINGS["all"]
    uniforms = settings.uniforms(len(ids), NEW)
    searches = {"greedy": (lm.greedy_search, NEW, {}),
                "sample": (lm.sample, NEW, dict(sampling=settings)),
                "beam": (lm.beam_search, NEW, dict(beam_size=BEAM)),
                # stopped before any beam finishes: rows done stay as they are
                "beam_short": (lm.beam_search, 2, dict(beam_size=BEAM))}
    for name in searched.split():
        search, new, kwargs = searches[name]
        tokens, scores = search(model, ids, lengths, max_new_tokens=new, **kwargs)
        for row, n in enumerate(lengths):
            alone = ids[row:row + 1] if framework == "jax" else ids[row:row + 1, :n]
            extra = dict(uniforms=uniforms[row:row + 1]) if name == "sample" else {}
            one_tokens, one_scores = search(model, alone, [n], max_new_tokens=new, **kwargs,
                                            **extra)
            np.testing.assert_array_equal(to_numpy(one_tokens)[0], to_numpy(tokens)[row], name)
            np.testing.assert_allclose(to_numpy(one_scores)[0], to_numpy(scores)[row],
                                       atol=1e-9, rtol=0, err_msg=name)


@pytest.mark.slow
def test_searches_compile_once_per_shape(models):
    """Other prompts, prompt lengths, seeds, temperatures, top_p values and alphas
    reuse the compiled searches; only top_k (a shape) and the kind of cut do not."""
    model, _ = models
    ids, lengths = prompts()
    jax_lm.sample(model, ids, lengths, max_new_tokens=NEW, sampling=SAMPLINGS["all"])
    before = jax_lm._pick_jit._cache_size()
    jax_lm.sample(model, ids[::-1].copy(), lengths[::-1].copy(), max_new_tokens=NEW,
                  sampling=Sampling(temperature=1.9, top_k=8, top_p=0.3, seed=7))
    assert jax_lm._pick_jit._cache_size() == before
    jax_lm.beam_search(model, ids, lengths, max_new_tokens=NEW, beam_size=BEAM, alpha=0.6)
    before = jax_lm._beam_jit._cache_size()
    jax_lm.beam_search(model, ids, np.full(5, 6), max_new_tokens=NEW, beam_size=BEAM, alpha=1.2)
    assert jax_lm._beam_jit._cache_size() == before


def test_arguments_are_checked(models):
    model, torch_model = models
    ids, lengths = prompts()
    with pytest.raises(ValueError, match="max_new_tokens must be in"):
        jax_lm.greedy_search(model, ids, lengths, max_new_tokens=CONFIG.max_len)
    with pytest.raises(ValueError, match="prompt_lengths"):
        torch_lm.sample(torch_model, ids, [0, 1, 2, 3, 4], max_new_tokens=2,
                        sampling=Sampling())
    with pytest.raises(ValueError, match="uniforms must have shape"):
        torch_lm.sample(torch_model, ids, lengths, max_new_tokens=2, sampling=Sampling(),
                        uniforms=np.zeros((5, 3)))
