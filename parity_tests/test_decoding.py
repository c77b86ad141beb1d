"""Incremental decoding and search: cache vs full recompute, JAX vs torch, batched vs alone.

The search tests run in float64 (JAX's x64 mode is switched on by a fixture
and off again after this module), where JAX and torch agree to ~1e-15, so the
same tokens and scores within 1e-9 are a fair demand; one test repeats the
searches in float32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import torch_reference
from jax_transformer import TransformerConfig, pretrained
from jax_transformer import decoding as jax_decoding
from jax_transformer import search as jax_search
from jax_transformer.model import Transformer
from jax_transformer.scanned import scan_layers
from parity_tests.helpers import SCANNING, TORCH_DEVICE, fast_tier, to_numpy, to_torch
from torch_reference import decoding as torch_decoding
from torch_reference import search as torch_search
from transformer_core.generation import Sampling

CONFIG = TransformerConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, num_heads=4,
                           d_ff=64, num_encoder_layers=1, num_decoder_layers=2, max_len=32,
                           dropout=0.1)
MAX_LEN, BEAM = 10, 3


def source_batch():
    """(6, 9) source ids, right-padded: sentences of lengths 9, 5, 9, 3, 9, 9."""
    src = np.random.RandomState(0).randint(4, 40, (6, 9))
    src[1, 5:] = 0
    src[3, 3:] = 0
    return src


def torch_copy(model, dtype=torch.float32):
    torch_model = torch_reference.Transformer(model.config).to(TORCH_DEVICE, dtype)
    torch_model.load_state_dict({k: torch.from_numpy(v)
                                 for k, v in pretrained.to_torch_state_dict(model).items()})
    return torch_model.eval()


# ------------------------------------------------------- cache vs recompute

@pytest.mark.parametrize("variant", [dict(), dict(pre_norm=True, final_norm=True,
                                                  share_embeddings=False, tie_output=False),
                                     dict(position_layout="fairseq", position_offset=2)],
                         ids=["post_norm", "pre_norm_final_norm", "fairseq_offset"])
@pytest.mark.parametrize("scan", SCANNING)
def test_cached_step_logits_equal_full_recompute(variant, scan):
    config = CONFIG.replace(**variant)
    model = Transformer(config, rngs=nnx.Rngs(0))
    model = nnx.view(scan_layers(model) if scan else model, deterministic=True)
    torch_model = torch_copy(model)
    src = source_batch()
    tgt = np.random.RandomState(1).randint(4, 40, (6, 8))
    tgt[:, 0] = config.bos_id
    T, cache_len = tgt.shape[1], 12  # a cache longer than the prefix: unused slots masked

    full = np.asarray(jax.jit(model)(jnp.asarray(src), jnp.asarray(tgt)))  # (B, T, V)
    memory, _ = model.encode(jnp.asarray(src))
    src_mask = jnp.asarray(src != config.pad_id)[:, None, None, :]
    cache = model.init_cache(memory, cache_len)
    decode_step = jax.jit(model.decode_step)  # one compilation; position is traced
    steps = []
    for t in range(T):
        logits, cache = decode_step(jnp.asarray(tgt[:, t:t + 1]), cache, t, src_mask)
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.stack(steps, axis=1), full, atol=2e-5, rtol=0)

    with torch.no_grad():
        full_t = to_numpy(torch_model(to_torch(src), to_torch(tgt)))
        memory, _ = torch_model.encode(to_torch(src))
        src_mask = to_torch(src != config.pad_id)[:, None, None, :]
        cache = torch_model.init_cache(memory, cache_len)
        steps = []
        for t in range(T):
            logits, cache = torch_model.decode_step(to_torch(tgt[:, t:t + 1]), cache, t,
                                                    src_mask)
            steps.append(to_numpy(logits))
    np.testing.assert_allclose(np.stack(steps, axis=1), full_t, atol=2e-5, rtol=0)
    np.testing.assert_allclose(full_t, full, atol=2e-5, rtol=0)


def test_cross_attention_keys_values_projected_once():
    """The step reads cross-attention keys/values from the cache (computed once
    by init_cache), not from the memory: changing them changes the logits."""
    model = nnx.view(Transformer(CONFIG, rngs=nnx.Rngs(0)), deterministic=True)
    memory, _ = model.encode(jnp.asarray(source_batch()))
    cache = model.init_cache(memory, 4)
    ids = jnp.full((6, 1), CONFIG.bos_id)
    decode_step = jax.jit(model.decode_step)
    logits, _ = decode_step(ids, cache, 0, None)
    zeroed = [{**c, "cross_k": jnp.zeros_like(c["cross_k"])} for c in cache]
    assert not np.allclose(decode_step(ids, zeroed, 0, None)[0], logits)


def test_top_k_tie_breaking_agrees():
    x = np.random.RandomState(0).randint(0, 3, size=(4, 200)).astype(np.float64)
    jax_values, jax_indices = jax.lax.top_k(jnp.asarray(x, jnp.float32), 50)
    torch_values, torch_indices = torch_search.top_k(to_torch(x), 50)
    np.testing.assert_array_equal(np.asarray(jax_indices), to_numpy(torch_indices))
    np.testing.assert_array_equal(np.asarray(jax_values), to_numpy(torch_values))
    # and argmax (greedy): the first maximum on both sides
    assert int(jnp.argmax(jnp.asarray([1.0, 3.0, 3.0]))) == 1
    assert int(to_torch([1.0, 3.0, 3.0]).argmax()) == 1


# ---------------------------------------------------------- searches, float64

@pytest.fixture(scope="module")
def models(x64):
    """A float64 model (and its torch copy) whose sentences end at different steps.

    Random tiny models repeat one token forever; Xavier-drawn weights (the paper's
    init, larger than N(0, 0.02)) and a larger output projection give varied
    tokens, and the eos bias below makes greedy sentences end
    after 1, 4 and 10 tokens or not at all, and leaves one sentence with no
    finished beam (checked in `test_outputs_cover_eos_cases`).
    """
    config = CONFIG.replace(output_bias=True, tie_output=False, weight_init="xavier")
    model = Transformer(config, rngs=nnx.Rngs(0), dtype=jnp.float64, param_dtype=jnp.float64)
    rng = np.random.RandomState(1)
    kernel = np.asarray(model.output_projection.kernel[...]) * 3  # (D, V)
    kernel[:, config.eos_id] = rng.randn(config.d_model) * 1.5
    bias = rng.randn(config.tgt_vocab_size)
    bias[[config.pad_id, 1, config.bos_id]] = -10.0
    bias[config.eos_id] = 6.5
    model.output_projection.kernel[...] = jnp.asarray(kernel)
    model.output_projection.bias[...] = jnp.asarray(bias)
    return model, torch_copy(model, torch.float64)


def lengths(tokens, eos_id=CONFIG.eos_id):
    """Tokens up to and including eos; -1 where there is none."""
    tokens = to_numpy(tokens)
    ended = tokens == eos_id
    return np.where(ended.any(-1), ended.argmax(-1) + 1, -1)


def test_outputs_cover_eos_cases(models):
    model, _ = models
    tokens, _ = jax_decoding.greedy_search(model, source_batch(), max_len=MAX_LEN)
    greedy_lengths = lengths(tokens)
    assert len(set(greedy_lengths.tolist())) >= 3 and (greedy_lengths == -1).any()
    beams, _ = jax_decoding.beam_search(model, source_batch(), max_len=MAX_LEN, beam_size=BEAM)
    beam_lengths = lengths(beams)  # (B, K)
    assert (beam_lengths == -1).all(axis=1).any()  # a sentence with no finished beam
    assert len(set(beam_lengths[beam_lengths > 0].tolist())) >= 4
    assert len(set(np.asarray(beams)[:, 0, :3].ravel().tolist())) >= 5  # varied tokens


def test_greedy_jax_equals_torch(models):
    model, torch_model = models
    jax_tokens, jax_scores = jax_decoding.greedy_search(model, source_batch(), max_len=MAX_LEN)
    torch_tokens, torch_scores = torch_decoding.greedy_search(torch_model, source_batch(),
                                                              max_len=MAX_LEN)
    np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
    np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9, rtol=0)
    # after eos: pad only
    for row, n in zip(np.asarray(jax_tokens), lengths(jax_tokens)):
        if n > 0:
            assert (row[n:] == CONFIG.pad_id).all()


@pytest.mark.parametrize("settings", fast_tier(
    [Sampling(temperature=0.7, top_k=8, top_p=0.9, seed=3), Sampling(seed=4),
     Sampling(temperature=0)], fast={Sampling(temperature=0.7, top_k=8, top_p=0.9, seed=3)}),
    ids=["all_cuts", "plain", "temperature_0"])
def test_sample_jax_equals_torch(models, settings):
    """Sampling from the encoder-decoder: the same tokens for the same seed;
    temperature 0 is greedy search."""
    model, torch_model = models
    jax_tokens, jax_scores = jax_decoding.sample(model, source_batch(), max_len=MAX_LEN,
                                                 sampling=settings)
    torch_tokens, torch_scores = torch_decoding.sample(torch_model, source_batch(),
                                                       max_len=MAX_LEN, sampling=settings)
    np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
    np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9, rtol=0)
    greedy, _ = torch_decoding.greedy_search(torch_model, source_batch(), max_len=MAX_LEN)
    assert (to_numpy(greedy) == to_numpy(torch_tokens)).all() == settings.greedy


@pytest.mark.parametrize("alpha", fast_tier([0.6, 0.0, 2.0], fast={0.6}))
def test_beam_jax_equals_torch(models, alpha):
    model, torch_model = models
    jax_tokens, jax_scores = jax_decoding.beam_search(
        model, source_batch(), max_len=MAX_LEN, beam_size=BEAM, alpha=alpha)
    torch_tokens, torch_scores = torch_decoding.beam_search(
        torch_model, source_batch(), max_len=MAX_LEN, beam_size=BEAM, alpha=alpha)
    np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
    np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9, rtol=0)
    scores = np.asarray(jax_scores)
    assert (np.diff(scores, axis=1) <= 0).all()  # best beam first


def test_beam_search_over_a_growing_cache_equals_torch(models):
    """max_len 80: the JAX beam search's cache grows through 32, 40 and 80 positions
    (search.growing_loop), torch's holds 80 from the start. With eos_id -1 no beam
    ends, and the searches run all 80 steps."""
    model, _ = models
    long = Transformer(model.config.replace(max_len=80), rngs=nnx.Rngs(0), dtype=jnp.float64,
                       param_dtype=jnp.float64)
    nnx.update(long, nnx.state(model))
    torch_model = torch_copy(long, torch.float64)
    assert jax_search.cache_lengths(80) == [32, 40, 80]
    for eos_id in (None, -1):
        jax_tokens, jax_scores = jax_decoding.beam_search(
            long, source_batch(), max_len=80, beam_size=BEAM, eos_id=eos_id)
        torch_tokens, torch_scores = torch_decoding.beam_search(
            torch_model, source_batch(), max_len=80, beam_size=BEAM, eos_id=eos_id)
        np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
        np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9,
                                   rtol=0)
    assert (np.asarray(jax_tokens) != CONFIG.pad_id).all()  # eos -1: 80 tokens everywhere


@pytest.mark.slow  # many forced decodings; test_beam_search_* keep beam parity fast
@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_every_beam_scores_its_forced_decoding_log_probability(models, alpha):
    """jaxformer-translate --nbest prints every beam with its score: in both frameworks,
    each finished beam's score is the log-probability the model gives its tokens when
    forced to decode them (the full forward, no cache), divided by the length penalty."""
    model, torch_model = models
    src, eval_model = source_batch(), nnx.view(model, deterministic=True)  # dropout off
    for tokens, scores, forward in (
            (*jax_decoding.beam_search(model, src, max_len=MAX_LEN, beam_size=BEAM, alpha=alpha),
             lambda s, t: np.asarray(eval_model(jnp.asarray(s), jnp.asarray(t)))),
            (*torch_decoding.beam_search(torch_model, src, max_len=MAX_LEN, beam_size=BEAM,
                                         alpha=alpha),
             lambda s, t: to_numpy(torch_model(to_torch(s), to_torch(t))))):
        tokens, scores, checked = to_numpy(tokens), to_numpy(scores), 0
        for b, k in np.ndindex(scores.shape):
            length = lengths(tokens[b, k][None])[0]
            if length < 0:  # unfinished: ranked by its running score, not a sentence's
                continue
            hypothesis = tokens[b, k, :length]
            decoder_in = np.concatenate([[CONFIG.bos_id], hypothesis[:-1]])[None]
            logits = forward(src[b:b + 1], decoder_in)[0]  # (length, V)
            log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
            log_prob = log_probs[np.arange(length), hypothesis].sum()
            assert scores[b, k] == pytest.approx(
                log_prob / ((5 + length) / 6) ** alpha, abs=1e-9), (b, k)
            checked += 1
        assert checked >= 2 * BEAM


def test_a_scanned_model_searches_alike(models):
    """With its layer stacks scanned (the cached steps run them in a loop), the model
    gives torch's greedy and beam tokens, and scores within the same 1e-9."""
    model, torch_model = models
    model = scan_layers(nnx.clone(model))
    for search, options in ((jax_decoding.greedy_search, {}),
                            (jax_decoding.beam_search, {"beam_size": BEAM})):
        jax_tokens, jax_scores = search(model, source_batch(), max_len=MAX_LEN, **options)
        torch_tokens, torch_scores = getattr(torch_decoding, search.__name__)(
            torch_model, source_batch(), max_len=MAX_LEN, **options)
        np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
        np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9,
                                   rtol=0)


@pytest.mark.slow
def test_float32_searches_jax_equal_torch(models):
    """In float32 too (matmuls at full precision, as conftest pins them on every
    device): the same greedy and beam tokens. Scores within float32 rounding."""
    model64, _ = models
    model = Transformer(model64.config, rngs=nnx.Rngs(0))  # float32
    pretrained.load_torch_state_dict(model, {k: v.astype(np.float32) for k, v in
                                             pretrained.to_torch_state_dict(model64).items()})
    torch_model = torch_copy(model)
    for search, kwargs in (("greedy_search", {}), ("beam_search", dict(beam_size=BEAM))):
        jax_tokens, jax_scores = getattr(jax_decoding, search)(model, source_batch(),
                                                               max_len=MAX_LEN, **kwargs)
        torch_tokens, torch_scores = getattr(torch_decoding, search)(torch_model, source_batch(),
                                                                     max_len=MAX_LEN, **kwargs)
        assert np.asarray(jax_scores).dtype == np.float32
        np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens), search)
        np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-5,
                                   rtol=0, err_msg=search)


def test_beam_scores_are_length_normalised_log_probs(models):
    """Rescore the best finished beams with a full forward pass."""
    model, torch_model = models
    src = source_batch()
    tokens, scores = torch_decoding.beam_search(torch_model, src, max_len=MAX_LEN,
                                                beam_size=BEAM, alpha=0.6)
    best, n = tokens[:, 0], lengths(tokens[:, 0])
    bos = torch.full((len(src), 1), CONFIG.bos_id, device=TORCH_DEVICE)
    tgt_in = torch.cat([bos, best[:, :-1]], dim=1)
    with torch.no_grad():
        log_probs = torch.log_softmax(torch_model(to_torch(src), tgt_in), dim=-1)
    token_log_probs = to_numpy(log_probs.gather(-1, best[:, :, None])[..., 0])
    for i in np.flatnonzero(n > 0):
        expected = token_log_probs[i, : n[i]].sum() / ((5.0 + n[i]) / 6.0) ** 0.6
        assert abs(scores[i, 0].item() - expected) < 1e-9


TAKE_ROWS = jax_search.take_rows  # the function itself, for the patched one to call


@pytest.mark.parametrize("options", [dict(alpha=0.6),
                                     dict(alpha=1.0, length_penalty_style="hf")],
                         ids=["gnmt", "hf"])
def test_settled_sentences_leave_the_batch_with_the_same_tokens(models, monkeypatch, options):
    """16 sentences: once at most 2 of them are not settled (search.narrower(16)), JAX's
    beam search goes on with those alone (search.leaving_when_done), and gives torch's
    tokens and scores, whose search keeps every sentence to the end."""
    model, torch_model = models
    rng = np.random.RandomState(0)
    src = rng.randint(4, 40, (64, 9))
    src[np.arange(9) >= rng.randint(2, 10, (64, 1))] = 0  # lengths 2-9
    # 14 sentences that settle within 20 tokens, and 2 (rows 1 and 3) that do not
    src = src[[0, 2, 3, 4, 8, 9, 10, 15, 16, 17, 19, 23, 26, 27, 32, 38]]
    kept = []
    monkeypatch.setattr(jax_search, "take_rows", lambda s, rows, beam_size: kept.append(
        rows.shape[0]) or TAKE_ROWS(s, rows, beam_size))
    jax.clear_caches()  # traced afresh, through the patched take_rows
    jax_tokens, jax_scores = jax_decoding.beam_search(model, src, max_len=2 * MAX_LEN,
                                                      beam_size=BEAM, **options)
    torch_tokens, torch_scores = torch_decoding.beam_search(torch_model, src, max_len=2 * MAX_LEN,
                                                            beam_size=BEAM, **options)
    np.testing.assert_array_equal(np.asarray(jax_tokens), to_numpy(torch_tokens))
    np.testing.assert_allclose(np.asarray(jax_scores), to_numpy(torch_scores), atol=1e-9, rtol=0)
    assert kept == [2]  # 14 rows left the batch, 2 went on alone


@pytest.mark.slow
def test_uncached_greedy_equals_cached(models):
    model, torch_model = models
    cached, cached_scores = jax_decoding.greedy_search(model, source_batch(), max_len=MAX_LEN)
    for tokens, scores in (
            jax_decoding.greedy_search_uncached(model, source_batch(), max_len=MAX_LEN,
                                                pad_to=MAX_LEN),  # one compilation
            torch_decoding.greedy_search_uncached(torch_model, source_batch(), max_len=MAX_LEN)):
        np.testing.assert_array_equal(to_numpy(tokens), to_numpy(cached))
        np.testing.assert_allclose(to_numpy(scores), to_numpy(cached_scores),
                                   atol=1e-9, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_batched_equals_one_by_one(models, framework):
    """Each sentence decoded alone gives the batch's tokens and scores. Alone
    means unpadded in torch; in JAX each sentence is kept at the batch's width
    (1, S), so that this test compiles each search once, not once per length."""
    model = models[0] if framework == "jax" else models[1]
    decoding = jax_decoding if framework == "jax" else torch_decoding
    src = source_batch()
    greedy = decoding.greedy_search(model, src, max_len=MAX_LEN)
    beam = decoding.beam_search(model, src, max_len=MAX_LEN, beam_size=BEAM)
    for i, row in enumerate(src):
        alone = row[None] if framework == "jax" else row[row != CONFIG.pad_id][None]
        for search, (tokens, scores) in ((decoding.greedy_search, greedy),
                                         (decoding.beam_search, beam)):
            kwargs = dict(beam_size=BEAM) if search is decoding.beam_search else {}
            one_tokens, one_scores = search(model, alone, max_len=MAX_LEN, **kwargs)
            np.testing.assert_array_equal(to_numpy(one_tokens)[0], to_numpy(tokens)[i])
            np.testing.assert_allclose(to_numpy(one_scores)[0], to_numpy(scores)[i],
                                       atol=1e-9, rtol=0)


@pytest.mark.slow
def test_search_compiles_once_per_shape(models):
    model, _ = models
    src = source_batch()
    jax_decoding.greedy_search(model, src, max_len=MAX_LEN)
    before = jax_decoding._pick_jit._cache_size()
    other = Transformer(model.config, rngs=nnx.Rngs(5), dtype=jnp.float64,
                        param_dtype=jnp.float64)  # new weights, same shapes
    jax_decoding.greedy_search(other, src[::-1].copy(), max_len=MAX_LEN)
    jax_decoding.greedy_search(model, src, max_len=MAX_LEN)
    assert jax_decoding._pick_jit._cache_size() == before
    jax_decoding.beam_search(model, src, max_len=MAX_LEN, beam_size=BEAM, alpha=0.6)
    before = jax_decoding._beam_jit._cache_size()
    jax_decoding.beam_search(other, src, max_len=MAX_LEN, beam_size=BEAM, alpha=1.1)
    assert jax_decoding._beam_jit._cache_size() == before


def test_max_len_is_checked(models):
    model, torch_model = models
    with pytest.raises(ValueError, match="max_len"):
        jax_decoding.greedy_search(model, source_batch(), max_len=CONFIG.max_len + 1)
    with pytest.raises(ValueError, match="max_len"):
        torch_decoding.beam_search(torch_model, source_batch(), max_len=0)
