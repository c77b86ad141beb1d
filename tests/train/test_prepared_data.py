"""train.py on a prepared corpus: --data DIR trains as the run that prepares its own
WORKDIR/data, a resume reuses that preparation, flags that contradict DIR are refused,
and so is a damaged DIR, in one line naming the file."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jax_transformer.commands import prepare as prepare_command
from jax_transformer.commands import train as train_command
from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.prepared.directory import Prepared
from jax_transformer.train import inputs
from tests.helpers import tree_hashes, write_parallel
from tests.train.runs import REPO_ROOT, TINY, losses, tiny_run, tiny_settings
from transformer_core.errors import TrainError
from transformer_core.tokenizer import Tokenizer

# TINY's data flags: what jaxformer-prepare takes of them; the rest, what --data leaves.
DATA_FLAGS = TINY[:TINY.index("--d-model")]
MODEL_FLAGS = TINY[TINY.index("--d-model"):]


@pytest.mark.slow
def test_a_prepared_directory_trains_as_the_run_that_prepares_its_own(tmp_path, capfd):
    tiny_run(tmp_path / "own", "--steps", "4")
    assert (tmp_path / "own" / "data" / "manifest.json").is_file()
    assert "data: preparing" in capfd.readouterr().err

    assert prepare_command.main(["--output", str(tmp_path / "prepared"), *DATA_FLAGS,
                                 "--quiet"]) == 0
    summary = tiny_run(tmp_path / "ahead", "--data", str(tmp_path / "prepared"), "--steps", "4")
    assert losses(tmp_path / "ahead") == losses(tmp_path / "own")
    assert not (tmp_path / "ahead" / "data").exists()  # nothing read or encoded again
    read = summary["training"]["train_data_read_bytes"]
    assert len(read) == 1 and 0 < read[0] < summary["training"]["train_data_bytes"]

    manifest = (tmp_path / "own" / "data" / "manifest.json").stat().st_mtime_ns
    capfd.readouterr()
    tiny_run(tmp_path / "own", "--steps", "6")  # a resume: the same preparation serves
    assert "prepared earlier" in capfd.readouterr().err
    assert (tmp_path / "own" / "data" / "manifest.json").stat().st_mtime_ns == manifest
    assert [step for step, _ in losses(tmp_path / "own")] == list(range(1, 7))


@pytest.mark.slow
def test_flags_that_contradict_a_prepared_directory_are_refused(tmp_path):
    directory = tmp_path / "prepared"
    assert prepare_command.main(["--output", str(directory), *DATA_FLAGS, "--quiet"]) == 0
    run = tiny_settings(tmp_path / "run", "--data", str(directory))
    assert run.data.num_train == 1500 and run.data.vocab_size == 200  # DIR's own
    with pytest.raises(TrainError, match=r"--data .* was prepared with --max-len 256; "
                                                  r"drop --max-len 64"):
        tiny_settings(tmp_path / "run", "--data", str(directory), "--max-len", "64")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["key"]["corpus"]["num_train"] == 1500
    with pytest.raises(CorpusError, match="is not a prepared corpus"):
        tiny_settings(tmp_path / "run", "--data", str(tmp_path))


def test_workdir_data_follows_the_files_a_relative_path_names_today(tmp_path, monkeypatch,
                                                                      capfd):
    for name, seed in (("first", 0), ("second", 1)):
        (tmp_path / name).mkdir()
        write_parallel(tmp_path / name, 100, seed=seed)
    flags = ["--workdir", str(tmp_path / "run"), "--src-path", "train.src", "--tgt-path",
             "train.tgt", "--num-dev", "10", "--num-test", "10", "--max-len", "64",
             "--vocab-size", "60", "--quiet"]
    for name in ("first", "second"):
        monkeypatch.chdir(tmp_path / name)
        prepared = inputs.prepared_corpus(tmp_path / "run", train_command.parse_args(flags),
                                          None, True)
    assert (f"data: preparing {tmp_path / 'run' / 'data'} again: it was prepared from "
            f"{tmp_path / 'first' / 'train.src'}") in capfd.readouterr().err
    assert prepared.manifest["files"][0]["path"] == str(tmp_path / "second" / "train.src")


# --- a damaged DIR ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """A tiny preparation of the built-in corpus, which each test copies and damages."""
    directory = tmp_path_factory.mktemp("whole") / "prepared"
    assert prepare_command.main(["--output", str(directory), "--num-train", "200", "--num-dev",
                                 "10", "--num-test", "10", "--max-number", "10000",
                                 "--vocab-size", "80", "--workers", "1", "--quiet"]) == 0
    return directory


def copy_of(whole, tmp_path):
    return shutil.copytree(whole, tmp_path / "prepared", symlinks=True)


def shorten(path, by: int) -> None:
    os.truncate(path, path.stat().st_size - by)


def edit_manifest(directory, edit) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    edit(manifest)
    (directory / "manifest.json").write_text(json.dumps(manifest))


def link_out(directory) -> None:
    """DIR/dev.json a link to a file outside DIR, of the very text dev.json held."""
    outside = directory.parent / "elsewhere.json"
    os.replace(directory / "dev.json", outside)
    (directory / "dev.json").symlink_to(outside)


# issue 57's cases: what damages the directory, and the file the error names
DAMAGED = {
    "6-train-ids-truncated": (lambda d: shorten(d / "train.src.ids", 2), "train.src.ids"),
    "7-dev-offsets-truncated": (lambda d: shorten(d / "dev.src.offsets", 8),
                                "dev.src.offsets"),
    "8-manifest-of-format-alone": (
        lambda d: (d / "manifest.json").write_text('{"format": 1}'), "manifest.json"),
    "9-ids-dtype-bogus": (lambda d: edit_manifest(d, lambda m: m.update(ids_dtype="bogus")),
                          "manifest.json"),
    "10-key-without-vocab-size": (
        lambda d: edit_manifest(d, lambda m: m["key"]["corpus"].pop("vocab_size")),
        "manifest.json"),
    "11-dev-json-a-link-out": (link_out, "dev.json"),
}


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_directory_is_one_line_naming_the_file(whole, tmp_path, capsys, case):
    """Each was a traceback (KeyError, TypeError; an IndexError once training started) or
    went unnoticed (the last offset cut off; a link out of DIR followed and read)."""
    damage, name = DAMAGED[case]
    directory = copy_of(whole, tmp_path)
    damage(directory)
    before = tree_hashes(tmp_path)
    code = train_command.main(["--workdir", str(tmp_path / "run"), "--data", str(directory),
                               *MODEL_FLAGS, "--steps", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"error: {directory / name} "), err
    assert err[0].endswith(f": {directory} is damaged; remove it and prepare it again"), err
    assert tree_hashes(tmp_path) == before  # no work directory, nothing changed


def overwrite_ids(path, value: int, sentence: int | None = None) -> None:
    """`value` in place of every id of a store's NAME.ids, or of `sentence`'s first id."""
    ids = np.fromfile(path, np.uint16)
    if sentence is None:
        ids[:] = value
    else:
        ids[np.fromfile(str(path).replace(".ids", ".offsets"), np.int64)[sentence]] = value
    ids.tofile(path)


def test_ids_outside_the_vocabulary_are_named_by_the_gather_that_meets_them(whole, tmp_path):
    """Case 12: ids overwritten in place (the sizes whole) trained to a nan loss. A store
    of the vocabulary's size checks each gather's ids; the directory opens as it did."""
    directory = copy_of(whole, tmp_path)
    vocab = Tokenizer(directory / "tokenizer.model").vocab_size
    sentences = np.arange(Prepared(directory).manifest["splits"]["train"]["examples"])
    for side in Prepared(directory).sides("train", (vocab, vocab)):
        side.gather(sentences)  # every id of a whole preparation is in the vocabulary
    overwrite_ids(directory / "train.tgt.ids", vocab, sentence=7)
    _, target = Prepared(directory).sides("train", (vocab, vocab))
    target.gather(np.array([3, 9]))
    with pytest.raises(CorpusError, match="^" + re.escape(
            f"{directory / 'train.tgt.ids'} holds id {vocab} in sentence 7, outside the "
            f"vocabulary of {vocab} pieces: {directory} is damaged; remove it and prepare it "
            "again") + "$"):
        target.gather(np.array([3, 7, 9]))


@pytest.mark.slow  # a train.py subprocess
def test_train_py_stops_at_ids_outside_the_vocabulary_with_one_line(whole, tmp_path):
    """The issue's run: every training target id overwritten, same size: it was `loss nan
    ... stopping`, exit 1, which reads as a diverged run."""
    directory = copy_of(whole, tmp_path)
    overwrite_ids(directory / "train.tgt.ids", 60000)
    result = subprocess.run([sys.executable, "train.py", "--workdir", str(tmp_path / "run"),
                             "--data", str(directory), *MODEL_FLAGS, "--steps", "2"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert errors == [result.stderr.strip().splitlines()[-1]] and errors[0].startswith(
        f"error: {directory / 'train.tgt.ids'} holds id 60000 in sentence "), result.stderr
