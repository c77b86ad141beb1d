"""transformers' beam search and forced first token, in both of our frameworks.

Random-weight Marian and M2M100 models (helpers.make_marian and make_fairseq, every
parameter perturbed; nothing downloaded), converted with
`jaxformer-port`, decode as transformers' `generate` does:

- `beam_search(..., length_penalty_style="hf", alpha=lp)` gives
  `generate(num_beams=K, length_penalty=lp)`'s K beams (tokens, and
  `sequences_scores` within 1e-5) at lp 0.6, 1.0 and 2.0; the eos logit is raised
  so that beams end at several lengths, before and at max length;
- `forced_first` gives `generate(forced_bos_token_id=...)` in greedy and beam
  search, one forced id per row (transformers takes one per call: each row is
  compared with its own call); the forced token's log-probability counts as 0
  in both; sampling picks it too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jax_transformer import decoding as jax_decoding
from jax_transformer.commands import port as port_command
from parity_tests.helpers import (FAIRSEQ_EOS, FAIRSEQ_PAD, MARIAN_EOS, MARIAN_PAD,
                                  convert_fairseq, fairseq_batch, fast_tier, load_ours,
                                  make_fairseq, make_marian, source_batch, to_numpy, to_torch)
from torch_reference import decoding as torch_decoding
from transformer_core.generation import Sampling

transformers = pytest.importorskip("transformers")

MAX_LEN = 12  # generated tokens; transformers' max_new_tokens
EOS_BIAS = 2.0  # added to Marian's eos logit: random models rarely end otherwise


def marian(tmp_path):
    model, src_dir = make_marian(tmp_path)
    with torch.no_grad():
        model.final_logits_bias[0, MARIAN_EOS] += EOS_BIAS
    model.save_pretrained(src_dir)
    assert port_command.main(["--from", "hf-marian", str(src_dir), str(tmp_path / "ours")]) == 0
    src = source_batch(100, MARIAN_PAD, MARIAN_EOS)
    return model, src, MARIAN_PAD


def m2m100(tmp_path):
    model, src_dir = make_fairseq(tmp_path, "m2m100", tie_word_embeddings=False)
    with torch.no_grad():  # untied, so that only the eos logit grows
        model.lm_head.weight[FAIRSEQ_EOS] *= 2.5
    model.save_pretrained(src_dir)
    convert_fairseq("m2m100", src_dir, tmp_path / "ours")
    src, _ = fairseq_batch(100, 100)
    return model, src, FAIRSEQ_PAD


FAMILIES = {"marian": marian, "m2m100": m2m100}


@pytest.fixture(scope="module", params=list(FAMILIES))
def converted(request, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp(request.param)
    model, src, pad = FAMILIES[request.param](tmp_path)
    flax_model, torch_model = load_ours(tmp_path / "ours", "float32")
    return request.param, model, src, pad, flax_model, torch_model


def hf_generate(model, src, pad, **kwargs):
    """generate's tokens (B * R, MAX_LEN) without the start token, pad after the end, and
    its result object."""
    src_t = to_torch(src)
    with torch.no_grad():
        out = model.generate(input_ids=src_t, attention_mask=src_t != pad, do_sample=False,
                             max_new_tokens=MAX_LEN, max_length=None, forced_eos_token_id=None,
                             early_stopping=False, return_dict_in_generate=True,
                             output_scores=True, **kwargs)
    sequences = to_numpy(out.sequences)[:, 1:]
    tokens = np.full((sequences.shape[0], MAX_LEN), pad)
    tokens[:, : sequences.shape[1]] = sequences
    return tokens, out


def ours(side, flax_model, torch_model):
    return (jax_decoding, flax_model) if side == "flax" else (torch_decoding, torch_model)


@pytest.mark.parametrize("lp", fast_tier([0.6, 1.0, 2.0], fast={1.0}))
@pytest.mark.parametrize("side", ["flax", "torch"])
def test_hf_style_beam_equals_generate(converted, side, lp):
    family, model, src, pad, flax_model, torch_model = converted
    K = 4
    want, out = hf_generate(model, src, pad, num_beams=K, num_return_sequences=K,
                            length_penalty=lp)
    decoding, ours_model = ours(side, flax_model, torch_model)
    tokens, scores = decoding.beam_search(ours_model, src, max_len=MAX_LEN, beam_size=K,
                                          alpha=lp, length_penalty_style="hf")
    got = to_numpy(tokens).reshape(-1, MAX_LEN)
    np.testing.assert_array_equal(got, want, err_msg=f"{family} lp={lp}")
    np.testing.assert_allclose(to_numpy(scores).reshape(-1), to_numpy(out.sequences_scores),
                               rtol=0, atol=1e-5)
    eos = MARIAN_EOS if family == "marian" else FAIRSEQ_EOS
    ended = [(row == eos).any() for row in got]
    assert any(ended), "the test needs beams that end in eos"
    if lp == 2.0:  # (so that no case goes untested: 0.6 and 1.0 end earlier)
        assert not all(ended), "the test needs beams that reach max length"


def hf_row_scores(model, out, tokens, eos):
    """Summed transition scores up to eos, as transformers computes them (the forced
    token's, from the processed scores, is 0)."""
    steps = to_numpy(model.compute_transition_scores(out.sequences, out.scores,
                                                     normalize_logits=True)).astype(np.float64)
    alive = np.cumsum(tokens == eos, axis=1) - (tokens == eos) == 0  # up to and with eos
    return (np.where(alive[:, : steps.shape[1]], steps, 0.0)).sum(axis=1)


@pytest.mark.parametrize("side", ["flax", "torch"])
def test_forced_first_token_equals_generate(converted, side):
    family, model, src, pad, flax_model, torch_model = converted
    eos = MARIAN_EOS if family == "marian" else FAIRSEQ_EOS
    forced = np.array([97, 42, 5])[: src.shape[0]]  # one target-language-like id per row
    decoding, ours_model = ours(side, flax_model, torch_model)
    greedy, greedy_scores = decoding.greedy_search(ours_model, src, max_len=MAX_LEN,
                                                   forced_first=forced)
    beam, _ = decoding.beam_search(ours_model, src, max_len=MAX_LEN, beam_size=3, alpha=1.0,
                                   length_penalty_style="hf", forced_first=forced)
    for row, token in enumerate(forced):
        want, out = hf_generate(model, src[row:row + 1], pad, num_beams=1,
                                forced_bos_token_id=int(token))
        assert want[0, 0] == token
        np.testing.assert_array_equal(to_numpy(greedy)[row], want[0])
        want_score = hf_row_scores(model, out, want, eos)[0]
        assert abs(float(to_numpy(greedy_scores)[row]) - want_score) <= 1e-4
        want, _ = hf_generate(model, src[row:row + 1], pad, num_beams=3, num_return_sequences=3,
                              length_penalty=1.0, forced_bos_token_id=int(token))
        np.testing.assert_array_equal(to_numpy(beam)[row], want)


def test_forced_first_token_in_sampling_and_per_row(converted):
    """Sampling starts with the forced id in both frameworks (same tokens, same scores: the
    forced token counts 0); a negative id forces nothing in its row."""
    _, _, src, _, flax_model, torch_model = converted
    forced = np.full(src.shape[0], -1)
    forced[0] = 97
    sampling = Sampling(temperature=1.5, seed=3)
    results = [to_numpy(x) for x in jax_decoding.sample(flax_model, src, max_len=MAX_LEN,
                                                        sampling=sampling, forced_first=forced)]
    results2 = [to_numpy(x) for x in torch_decoding.sample(torch_model, to_torch(src),
                                                           max_len=MAX_LEN, sampling=sampling,
                                                           forced_first=forced)]
    np.testing.assert_array_equal(results[0], results2[0])
    np.testing.assert_allclose(results[1], results2[1], rtol=0, atol=1e-4)
    assert results[0][0, 0] == 97
    free, _ = jax_decoding.sample(flax_model, src, max_len=MAX_LEN, sampling=sampling)
    np.testing.assert_array_equal(results[0][1:], to_numpy(free)[1:])  # unforced rows as before
