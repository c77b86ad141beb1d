"""train.py on a prepared corpus: --data DIR trains as the run that prepares its own
WORKDIR/data, a resume reuses that preparation, and flags that contradict DIR are refused."""

import json

import pytest

from jax_transformer.commands import prepare as prepare_command
from jax_transformer.commands import train as train_command
from jax_transformer.data.corpora import CorpusError
from jax_transformer.train import inputs
from tests.helpers import write_parallel
from tests.train.runs import TINY, losses, tiny_run, tiny_settings
from transformer_core.errors import TrainError

# TINY's data flags: what jaxformer-prepare takes of them.
DATA_FLAGS = TINY[:TINY.index("--d-model")]


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
