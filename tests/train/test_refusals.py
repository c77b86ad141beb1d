"""train.py refusing what it cannot do well, through its command line: seeds out of
range, text in UTF-16, held-out splits that leave nothing or that no line fits, a
time budget too short for one step; and what its evaluation reports."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

from jax_transformer.commands import train as train_command
from jax_transformer.train.tasks.metrics import translation_metrics
from tests.train.runs import REPO_ROOT, TINY

LM = ["--task", "lm", "--max-tokens", "256"]


def run_main(tmp_path, capsys, *flags):
    """train.py's main() in this process: (exit code, stdout, stderr lines)."""
    code = train_command.main(["--workdir", str(tmp_path / "run"), *TINY, *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip().splitlines()


def book(n: int, long_line: int | None = None) -> str:
    """n short lines of text; line `long_line` of 40 distinct words."""
    lines = [f"line {i}: " + " ".join(["the cat sat on the mat", "a dog ran", "birds sing"][
        i % 3].split()[: 2 + i % 5]) for i in range(n)]
    if long_line is not None:
        lines[long_line] = " ".join(f"word{i}" for i in range(40))
    return "".join(line + "\n" for line in lines)


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999", "4294967296"])
def test_a_seed_out_of_range_is_refused_naming_the_flag(tmp_path, capsys, seed):
    """-1 and 2**66 were tracebacks (numpy, JAX); 2**32 silently trained as seed 0."""
    code, _, err = run_main(tmp_path, capsys, "--seed", seed)
    assert code == 2 and err == [f"error: --seed must be from 0 to 4294967295, got {seed}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16"])
def test_a_text_file_in_utf16_is_refused(tmp_path, capsys, encoding):
    """It trained on NUL-interleaved text (no byte order mark), or skipped the byte order
    mark's line as not UTF-8 and trained on the rest."""
    text = tmp_path / "book.txt"
    text.write_bytes(book(400).encode(encoding))
    code, _, err = run_main(tmp_path, capsys, *LM, "--text-path", str(text))
    assert code == 2 and err[-1].startswith(f"error: {text} ")
    assert "UTF-16 LE text" in err[-1] and "not UTF-8" in err[-1]
    assert not (tmp_path / "run" / "tokenizer.model").exists()


def test_held_out_splits_that_leave_nothing_to_train_on_name_the_flags(tmp_path, capsys):
    text = tmp_path / "book.txt"
    text.write_text(book(30))
    code, _, err = run_main(tmp_path, capsys, *LM, "--text-path", str(text), "--num-dev", "20",
                            "--num-test", "20")
    assert code == 2
    assert err[-1] == (f"error: --num-dev 20 + --num-test 20 held-out lines leave none of the "
                       f"30 usable lines of {text} to train on; lower them")


def test_a_split_whose_every_line_is_too_long_is_named(tmp_path, capsys):
    """Only the one held-out test line is longer than --max-len: the error said "every
    line is longer than max_len", of a corpus whose training lines all fit."""
    test_line = int(np.random.default_rng(0).permutation(400)[0])  # holdout_split's, seed 0
    text = tmp_path / "book.txt"
    text.write_text(book(400, long_line=test_line))
    code, _, err = run_main(tmp_path, capsys, *LM, "--text-path", str(text), "--num-dev", "1",
                            "--num-test", "1", "--max-len", "32")
    assert code == 2
    assert err[-1] == ("error: every line of the test split (1) is longer than max_len 32 "
                       "tokens with its bos or eos; raise --max-len")


@pytest.mark.slow
def test_a_time_budget_spent_before_the_first_step_says_so_and_exports_nothing(tmp_path):
    """--time-budget 0.001 exported the untrained model with exit code 0, and matplotlib
    warned "No artists with labels found to put in legend" drawing its empty loss curve."""
    workdir = tmp_path / "run"
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY,
                             "--time-budget", "0.001"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "No artists" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --time-budget 0.001 s ran out before the first training "
                           "step (setting up took ")
    assert last.endswith("no step ran, so no checkpoint was saved and no model exported; give "
                         "a longer budget")
    assert result.stdout == "" and not (workdir / "export").exists()
    assert not (workdir / "checkpoints").exists() or not any((workdir / "checkpoints").iterdir())


def test_bleu_counts_only_n_grams_the_references_have():
    """One-word references (the built-in number corpus): BLEU-4 is 0 even for perfect
    output, so "bleu" is BLEU-1 there and says why; real sentences get BLEU-4."""
    words = ["dreihundert", "zweiundvierzig", "eins", "sieben"]
    perfect = translation_metrics(words, words)
    assert sacrebleu.corpus_bleu(words, [words]).score == 0.0  # what was reported
    assert perfect["bleu"] == pytest.approx(100.0)
    assert (perfect["bleu_order"], perfect["exact_match"]) == (1, 1.0)
    assert perfect["bleu_note"].startswith("bleu is BLEU-1, not BLEU-4: 4 of the 4 references "
                                           "have fewer than 4 tokens")
    assert perfect["bleu4"] == 0.0  # BLEU-4 beside the lower order
    sentences = ["the cat sat on the mat", "a dog ran over the hill", "the bird sings", "x"]
    hypotheses = ["the cat sat on a mat", "a dog ran over the hill", "a bird sings", "x"]
    scores = translation_metrics(hypotheses, sentences)
    assert scores["bleu_order"] == 4 and "bleu_note" not in scores
    assert scores["bleu"] == sacrebleu.corpus_bleu(hypotheses, [sentences]).score > 0
    assert "bleu4" not in scores  # "bleu" is BLEU-4 already


def test_every_score_says_how_sacrebleu_computed_it():
    """Before: eval.json had BLEU and chrF figures without sacreBLEU's signature."""
    hypotheses, references = ["the cat sat on a mat", "x"], ["the cat sat on the mat", "x"]
    scores = translation_metrics(hypotheses, references)
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu.corpus_score(hypotheses, [references]), chrf.corpus_score(hypotheses, [references])
    assert scores["bleu_signature"] == bleu.get_signature().format()
    assert scores["chrf_signature"] == chrf.get_signature().format()
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")


@pytest.mark.slow
def test_the_summary_of_a_number_corpus_run_reports_bleu_that_means_something(tmp_path,
                                                                           capsys):
    code, out, err = run_main(tmp_path, capsys, "--steps", "2")
    assert code == 0, err[-20:]
    summary = json.loads(out)
    test = json.loads((tmp_path / "run" / "eval.json").read_text())["test"]
    for scores in (test, {k.removeprefix("test_"): v for k, v in summary.items()}):
        assert scores["bleu_order"] == 1
        assert scores["bleu_note"].startswith("bleu is BLEU-1, not BLEU-4: 40 of the 40 "
                                              "references have fewer than 4 tokens")
    assert test["bleu"] >= 0 and summary["test_bleu"] == round(test["bleu"], 2)
    assert summary["test_bleu4"] == round(test["bleu4"], 2)
    assert summary["test_bleu_signature"] == test["bleu_signature"]


def test_an_fsdp_that_does_not_divide_the_devices_is_refused_before_the_corpus(tmp_path,
                                                                               capsys):
    import jax
    count = jax.device_count()
    code, _, err = run_main(tmp_path, capsys, "--fsdp", str(count + 1))
    assert code == 2
    assert err == [f"error: --fsdp {count + 1} must divide the number of devices, {count}"]
    assert not (tmp_path / "run").exists()  # nothing read, prepared or written
