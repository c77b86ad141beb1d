"""jaxformer-translate's searches compiled ahead of time (applications/compiled_searches.py):
the model's own translations, loaded by a later call without building the model, and
compiled again when an entry is damaged or made for something else."""

import subprocess
import sys

import pytest

from jax_transformer.applications import compiled_searches, translator
from jax_transformer.applications.compiled_searches import CompiledSearches
from tests.helpers import LINES, REPO
from transformer_core.generation import Sampling

SEARCHES = {
    "greedy": dict(beam=1),
    "beam": dict(beam=3, nbest=3),
    "beam hf": dict(beam=2, nbest=2, alpha=1.0, length_penalty_style="hf"),
    "sampling": dict(beam=1, sampling=Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=3)),
}


def compiled(checkpoint, keep_in):
    return translator.load(checkpoint, "jax", compiled_searches=True, keep_compiled_in=keep_in)[0]


def refuse_to_compile(*args):
    raise AssertionError("compiled a search that was kept")


@pytest.mark.parametrize("search", [  # the fast tier: greedy and beam search
    pytest.param(name, marks=() if name in ("greedy", "beam") else pytest.mark.slow)
    for name in SEARCHES])
def test_compiled_searches_translate_as_the_model_does(jax_checkpoint, tmp_path, search):
    """Texts, scores (exactly) and ids of every hypothesis, in batches of 4 and 2 rows."""
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    settings = dict(batch_size=4, max_len=20, **SEARCHES[search])
    expected = translator.search_lines(LINES, model, tokenizer, **settings)
    assert translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer,
                                   **settings) == expected


@pytest.mark.slow
def test_another_alpha_runs_the_same_entry_with_its_own_length_penalty(jax_checkpoint,
                                                                     tmp_path):
    model, tokenizer = translator.load(jax_checkpoint, "jax")
    searches = compiled(jax_checkpoint, tmp_path)
    for alpha in (0.0, 2.0):
        settings = dict(beam=3, nbest=3, alpha=alpha, max_len=20)
        assert (translator.search_lines(LINES, searches, tokenizer, **settings)
                == translator.search_lines(LINES, model, tokenizer, **settings))
    assert len(list((tmp_path / compiled_searches.FOLDER).iterdir())) == 1


def test_a_later_call_loads_the_searches_without_building_the_model(jax_checkpoint, tmp_path,
                                                                    monkeypatch):
    _, tokenizer = translator.load(jax_checkpoint, "torch")
    first = translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer,
                                    batch_size=4)
    entries = sorted((tmp_path / compiled_searches.FOLDER).iterdir())
    assert len(entries) == 2  # 4 rows, then the last 1 (source width 8 for both)
    monkeypatch.setattr(CompiledSearches, "_compile", refuse_to_compile)
    searches = compiled(jax_checkpoint, tmp_path)
    assert translator.search_lines(LINES, searches, tokenizer, batch_size=4) == first
    assert searches._model is None
    assert sorted((tmp_path / compiled_searches.FOLDER).iterdir()) == entries


@pytest.mark.slow
def test_a_damaged_entry_is_compiled_again_with_one_warning(jax_checkpoint, tmp_path, capsys,
                                                            monkeypatch):
    _, tokenizer = translator.load(jax_checkpoint, "torch")
    first = translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer)
    [entry] = (tmp_path / compiled_searches.FOLDER).iterdir()
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])  # a write cut short
    capsys.readouterr()
    assert translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer) == first
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and "could not be loaded" in warnings[0], warnings
    monkeypatch.setattr(CompiledSearches, "_compile", refuse_to_compile)
    translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer)
    assert capsys.readouterr().err == ""  # replaced: loaded whole


@pytest.mark.slow
def test_an_entry_kept_after_the_compilation_cache_had_its_program_runs(jax_checkpoint,
                                                                        tmp_path):
    """The search compiled once without keeping it (JAX's persistent cache, on in the tests,
    keeps its program), then compiled and kept, then loaded: it runs. Before: the kept
    executable was the one JAX's cache had loaded, which serializes without its code, and
    the entry failed when it ran ("Function broadcast_multiply_fusion not found")."""
    _, tokenizer = translator.load(jax_checkpoint, "torch")
    settings = dict(beam=2, max_len=18)
    first = translator.search_lines(LINES, compiled(jax_checkpoint, None), tokenizer, **settings)
    translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer, **settings)
    searches = compiled(jax_checkpoint, tmp_path)
    assert translator.search_lines(LINES, searches, tokenizer, **settings) == first
    assert searches._model is None  # loaded, and it ran


@pytest.mark.slow
def test_an_entry_that_loads_but_cannot_run_is_compiled_again(jax_checkpoint, tmp_path, capsys,
                                                              monkeypatch):
    _, tokenizer = translator.load(jax_checkpoint, "torch")
    first = translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer)

    def broken(*args):
        raise RuntimeError("NOT_FOUND: Function fusion not found")
    monkeypatch.setattr(CompiledSearches, "_load", lambda *args: broken)
    capsys.readouterr()
    assert translator.search_lines(LINES, compiled(jax_checkpoint, tmp_path), tokenizer) == first
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and "could not run" in warnings[0], warnings


def test_an_entry_is_named_by_everything_that_fixes_its_program(jax_checkpoint, monkeypatch):
    """Another shape, output length, sampling cut or version of the code names another
    entry; another sampling seed does not (its draws are an argument)."""
    searches = compiled(jax_checkpoint, None)
    beam = dict(beam=4, sampling=None, length_penalty_style="gnmt", forced=None)
    sampled = dict(beam, beam=1, sampling=Sampling(temperature=0.7, seed=1))

    def name(shape=(4, 8), out_len=26, **changes):
        return searches._entry_name(shape, out_len, {**beam, **changes})
    names = [name(), name(shape=(2, 8)), name(shape=(4, 16)), name(out_len=20),
             name(length_penalty_style="hf"), name(**sampled),
             name(**dict(sampled, sampling=Sampling(temperature=0.7, top_p=0.5, seed=1)))]
    assert len(set(names)) == len(names)
    assert name(**dict(sampled, sampling=Sampling(temperature=0.7, seed=2))) == names[-2]
    monkeypatch.setattr(compiled_searches, "code_fingerprint", lambda: "another version")
    assert name() != names[0]


@pytest.mark.slow  # two jaxformer-translate processes
def test_a_second_call_builds_no_model_and_compiles_nothing(jax_checkpoint, tmp_path):
    """The first call keeps its searches in --compile-cache; the second loads them: it
    imports no Flax and adds nothing to the cache."""
    cache = tmp_path / "xla"
    script = ("import sys\n"
              "from jax_transformer.commands.translate import main\n"
              "code = main(sys.argv[1:])\n"
              "print('built the model:', 'flax' in sys.modules, file=sys.stderr)\n"
              "sys.exit(code)\n")

    def call():
        return subprocess.run([sys.executable, "-c", script, "--checkpoint", str(jax_checkpoint),
                               "--compile-cache", str(cache)], input=b"the cat\nthe dog sat\n",
                              capture_output=True, cwd=REPO, timeout=120)
    first = call()
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert first.stderr.splitlines()[-1] == b"built the model: True"  # to compile its searches
    kept = sorted(path.relative_to(cache) for path in cache.rglob("*"))
    assert any(path.parent.name == compiled_searches.FOLDER for path in kept), kept
    second = call()
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert second.stderr.splitlines()[-1] == b"built the model: False"
    assert second.stdout == first.stdout and len(second.stdout.splitlines()) == 2
    assert sorted(path.relative_to(cache) for path in cache.rglob("*")) == kept
