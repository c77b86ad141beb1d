"""jaxformer-translate's searches for real use, through the real command: n-best lists
with their scores, scores of the best, sampling, and lines answered as they arrive."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from jax_transformer.applications import translator
from tests.helpers import REPO

SOURCES = ["the quick brown fox", "", "a small red house", "the bird sings"]
COMMAND = [sys.executable, "-m", "jax_transformer.commands.translate"]
# float32 as IEEE float32 on every device, in this process and in the command: on a GPU,
# JAX's default float32 matmuls are TF32, and the command's scores were 1.8e-3 from the
# same model's here.
IEEE_FLOAT32 = "highest"


@pytest.fixture(autouse=True)
def ieee_float32():
    with jax.default_matmul_precision(IEEE_FLOAT32):
        yield


def translate(*args, stdin: str = "\n".join(SOURCES) + "\n") -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "JAX_DEFAULT_MATMUL_PRECISION": IEEE_FLOAT32})


def forced_log_prob(model, framework: str, source: str, ids, tokenizer) -> float:
    """The log-probability `model` gives the generated `ids` after `source`, decoding
    them all at once (no cache, no search)."""
    src = np.array([tokenizer.encode_source(source)])
    tgt = np.array([[model.config.bos_id, *ids[:-1]]])
    if framework == "torch":
        import torch
        with torch.no_grad():
            logits = model(torch.from_numpy(src).to(model.device),
                           torch.from_numpy(tgt).to(model.device))[0].double().cpu().numpy()
    else:
        from flax import nnx
        logits = np.asarray(nnx.view(model, deterministic=True)(src, tgt)[0], np.float64)
    log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return float(log_probs[np.arange(len(ids)), list(ids)].sum())


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "torch"])
def test_nbest_writes_the_beams_best_first_with_their_forced_decoding_scores(
        framework, jax_checkpoint, torch_checkpoint, tokenizer):
    """Before: only the best translation, without a score."""
    checkpoint = jax_checkpoint if framework == "jax" else torch_checkpoint
    result = translate("--checkpoint", checkpoint, "--framework", framework, "--beam", "3",
                       "--nbest", "3", "--alpha", "0", "--max-len", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    model, _ = translator.load(checkpoint, framework)
    expected = translator.search_lines(SOURCES, model, tokenizer, framework=framework, beam=3,
                                       alpha=0.0, max_len=8, nbest=3)
    assert [int(r[0]) for r in rows] == [i for i, best in enumerate(expected) for _ in best]
    for i, source in enumerate(SOURCES):
        mine = [r for r in rows if int(r[0]) == i]
        texts, scores = [r[2] for r in mine], [float(r[1]) for r in mine]
        assert texts == [h.text for h in expected[i]]
        assert scores == sorted(scores, reverse=True)
        for hypothesis, score in zip(expected[i], scores):
            forced = (forced_log_prob(model, framework, source, hypothesis.ids, tokenizer)
                      if source else 0.0)
            assert score == pytest.approx(forced, abs=2e-4), (i, hypothesis)


class OneText:
    """A tokenizer whose every translation detokenizes to the same text, as different
    segmentations of one string do."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)

    def decode(self, ids) -> str:
        return "one text"


def test_nbest_lists_each_text_once_with_its_best_score(torch_checkpoint):  # noqa: F811
    """Before: --nbest 3 wrote a text once per beam that detokenized to it, and a blank
    line 3 times."""
    model, tokenizer = translator.load(torch_checkpoint, "torch")  # noqa: F811
    search = dict(framework="torch", beam=3, nbest=3, max_len=8)
    beams = translator.search_lines(SOURCES, model, tokenizer, **search)
    merged = translator.search_lines(SOURCES, model, OneText(tokenizer), **search)
    assert merged == [[translator.Hypothesis("one text", best[0].score, best[0].ids)] if source
                      else [translator.Hypothesis("", 0.0, ())]
                      for source, best in zip(SOURCES, beams)]


@pytest.mark.slow
def test_print_scores_and_sampling(torch_checkpoint):
    """Before: neither --print-scores nor sampling existed for translation."""
    base = ["--checkpoint", torch_checkpoint, "--framework", "torch", "--max-len", "8"]
    greedy = translate(*base, "--beam", "1")
    scored = translate(*base, "--beam", "1", "--print-scores")
    assert greedy.returncode == scored.returncode == 0, scored.stderr[-2000:]
    pairs = [line.split("\t") for line in scored.stdout.splitlines()]
    assert [text for _, text in pairs] == greedy.stdout.splitlines()
    assert all(float(score) < 0 for (score, _), s in zip(pairs, SOURCES) if s)
    draws = [translate(*base, "--sample", "--seed", seed, "--top-k", "20").stdout
             for seed in ("1", "1", "2")]
    assert draws[0] == draws[1] != draws[2]
    assert "sampling" in translate(*base, "--sample").stderr
    assert translate(*base, "--sample", "--temperature", "0").stdout == greedy.stdout


@pytest.mark.slow
def test_a_line_is_answered_before_the_next_is_written(torch_checkpoint):
    """Before: translate read all of stdin before it wrote a line."""
    process = subprocess.Popen([*COMMAND, "--checkpoint", torch_checkpoint, "--framework",
                                "torch", "--beam", "1", "--max-len", "8"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    timer = threading.Timer(120, process.kill)  # a hang fails the test, not the suite
    timer.start()
    try:
        answers = []
        for line in ("the cat", "a dog sat"):
            process.stdin.write(line + "\n")
            process.stdin.flush()
            answers.append(process.stdout.readline())
        process.stdin.close()
        assert process.wait() == 0 and all(a.endswith("\n") for a in answers), answers
    finally:
        timer.cancel()
        process.kill()
    model, tokenizer = translator.load(torch_checkpoint, "torch")
    assert [a[:-1] for a in answers] == translator.translate_lines(
        ["the cat", "a dog sat"], model, tokenizer, framework="torch", beam=1, max_len=8)


@pytest.mark.parametrize("flags, message", [
    (["--nbest", "5", "--beam", "4"], "--nbest 5 is more than the search finds: --beam 4 keeps 4"),
    (["--nbest", "2", "--sample"], "--nbest 2 is more than the search finds: sampling draws one"),
    (["--nbest", "0"], "--nbest must be positive, got 0"),
    (["--temperature", "0.5"], "--temperature set how --sample draws: add --sample"),
    (["--sample", "--beam", "2"], "--sample draws one translation per line; drop --beam 2"),
    (["--nbest", "2", "--print-scores"], "--nbest writes every translation with its score"),
    (["--sample", "--top-p", "0"], "top_p must be in (0, 1]"),
    (["--compile-cache", "x", "--no-compile-cache"],
     "--no-compile-cache turns off the --compile-cache x it names; drop one"),
    (["--compile-cache", "x"],  # with --framework torch
     "--compile-cache and --no-compile-cache are JAX's; torch compiles nothing"),
])
def test_bad_search_flags_are_one_line(torch_checkpoint, flags, message):
    result = translate("--checkpoint", torch_checkpoint, "--framework", "torch", *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
