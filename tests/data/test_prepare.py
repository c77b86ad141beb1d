"""A corpus prepared once (data/prepared/: pipeline.py, store.py): the same examples,
tokenizer, fingerprints and batches as the in-memory path, in bounded memory; whole or
absent."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from tqdm import tqdm

from jax_transformer.data import corpora
from jax_transformer.data.prepared import encode_worker, pipeline
from jax_transformer.data.corpora import CorpusError, CorpusReport
from jax_transformer.data.tokenizing import TOO_MANY_TOKENS, encode_lines, encode_pairs, \
    train_tokenizer
from jax_transformer.data.batches.packed import PackedBatches
from jax_transformer.data.prepared.pipeline import Encoding, NoneFits, key, prepare
from jax_transformer.data.prepared.directory import Prepared
from jax_transformer.data.prepared.raw_text import Corpus, Source, given
from jax_transformer.data.prepared.store import StoreWriter, TokenStore, fingerprint
from tests.helpers import CORPUS_WORDS, tree_hashes, write_parallel
from transformer_core.tokenizer import Tokenizer


def parallel_corpus(src, tgt, num_dev=30, num_test=40, **given_splits):
    report = CorpusReport(f"{src} | {tgt}")
    sources = {split: Source(lambda r, s=s, t=t: corpora.parallel_text(s, t, r),
                             CorpusReport(f"{s} | {t}"), files=(str(s), str(t)))
               for split, (s, t) in given_splits.items()}
    return Corpus("pairs", train=Source(lambda r: corpora.parallel_text(src, tgt, r), report,
                                        files=(str(src), str(tgt))),
                  settings={"files": [str(src), str(tgt)]}, **sources,
                  held_out=lambda available, files_given: (
                      0 if "dev" in files_given else num_dev,
                      0 if "test" in files_given else num_test))


def in_memory(src, tgt, tmp_path, num_dev=30, num_test=40, max_len=16, vocab_size=60):
    """The in-memory path (read, hold out, train the tokenizer, encode): per split (src ids,
    tgt ids, report), the tokenizer, the splits as text."""
    pairs, _ = corpora.read_parallel_text(src, tgt)
    splits = corpora.holdout_split(pairs, num_dev, num_test, seed=0)
    tokenizer = train_tokenizer(splits["train"], tmp_path / "memory.model", vocab_size=vocab_size)
    encoded = {split: encode_pairs(tokenizer, examples, max_len=max_len)
               for split, examples in splits.items()}
    return encoded, tokenizer, splits


def assert_same_batches(a: PackedBatches, b: PackedBatches, count: int = 10):
    ia, ib = a.iterator(), b.iterator()
    for _ in range(count):
        x, y = next(ia), next(ib)
        assert x.keys() == y.keys()
        for name in x:
            np.testing.assert_array_equal(x[name], y[name])


# --- store.py ------------------------------------------------------------------------------

def test_a_store_on_disk_gives_what_one_in_memory_does(tmp_path):
    rng = np.random.default_rng(0)
    sentences = [rng.integers(0, 60000, rng.integers(0, 9)).astype(np.int32) for _ in range(300)]
    writer = StoreWriter(tmp_path, "s", np.uint16)
    for start in range(0, 300, 70):  # written in batches, as the encoder does
        chunk = sentences[start:start + 70]
        writer.add([len(x) for x in chunk], np.concatenate(chunk))
    writer.close()
    disk = TokenStore.open(tmp_path, "s", np.uint16)
    memory = TokenStore.in_memory(sentences, np.uint16)
    assert len(disk) == 300 and disk.lengths.dtype == np.uint16
    indices = rng.permutation(300)[:50]
    np.testing.assert_array_equal(disk.gather(indices), np.concatenate(
        [sentences[i] for i in indices]))
    np.testing.assert_array_equal(disk.gather(indices), memory.gather(indices))
    np.testing.assert_array_equal(disk[7], sentences[7])
    assert disk.each(indices) == memory.each(indices) == [
        sentences[i].astype(np.uint16).tobytes() for i in indices]
    before = disk.bytes_read  # what gathers asked for: the values and their offsets
    values = disk.gather(indices)
    assert disk.bytes_read - before == values.nbytes + 8 * len(indices)
    # The fingerprint is the in-memory path's (PackedBatches' before stores existed).
    assert fingerprint([disk]) == fingerprint([memory])
    other = [s.copy() for s in sentences]
    other[299] = other[299] + 1 if len(other[299]) else np.array([1], np.int32)
    assert fingerprint([TokenStore.in_memory(other)]) != fingerprint([memory])


# --- pipeline.py: the in-memory path's examples ---------------------------------------------

def test_a_prepared_corpus_equals_the_in_memory_path(tmp_path):
    """The same tokenizer (byte for byte), the same examples in the same order (the
    fingerprint), the same skip report, the same batches, and the held-out texts."""
    src, tgt = write_parallel(tmp_path, 600, long_every=25)
    encoded, tokenizer, splits = in_memory(src, tgt, tmp_path)
    prepared = prepare(tmp_path / "prepared", parallel_corpus(src, tgt),
                       Encoding(max_len=16, vocab_size=60), log=lambda line: None,
                       progress=False)
    assert prepared.tokenizer_path.read_bytes() == tokenizer.path.read_bytes()
    assert sorted(p.name for p in prepared.directory.iterdir()) == sorted(  # docs/data.md's
        ["manifest.json", "tokenizer.model", "dev.json", "test.json", ".jaxformer-prepare"]
        + [f"{split}.{side}.{suffix}" for split in ("train", "dev", "test")
           for side in ("src", "tgt") for suffix in ("ids", "offsets", "lengths")])
    assert not list(tmp_path.glob("prepared.*"))  # no temporary twin left
    for split, (src_ids, tgt_ids, report) in encoded.items():
        memory = PackedBatches(src_ids, tgt_ids, 256, [(32, 32)], seed=4)
        disk = PackedBatches(*prepared.sides(split), 256, [(32, 32)], seed=4,
                             fingerprint=prepared.fingerprint(split))
        assert disk.fingerprint == memory.fingerprint
        assert PackedBatches(*prepared.sides(split), 256, [(32, 32)]).fingerprint == \
            memory.fingerprint  # the manifest's fingerprint is the stores' own
        assert_same_batches(memory, disk)
        assert prepared.manifest["splits"][split]["examples"] == len(src_ids)
    assert prepared.examples("test") == splits["test"] and prepared.examples("dev") == \
        splits["dev"]
    _, _, train_report = encoded["train"]
    assert train_report.skipped[TOO_MANY_TOKENS] > 0  # the long sentences, line-numbered
    assert f"train: {train_report}" in prepared.manifest["log"]


def test_workers_encode_in_parts_that_join_in_order(tmp_path, monkeypatch):
    """Split into three parts, encoded by three worker processes, then joined: the same
    stores as one part encoded here."""
    src, tgt = write_parallel(tmp_path, 900, long_every=40)
    corpus, encoding = parallel_corpus(src, tgt), Encoding(max_len=16, vocab_size=60)
    whole = prepare(tmp_path / "whole", corpus, encoding, log=lambda line: None,
                    progress=False)
    monkeypatch.setattr(pipeline, "PART_EXAMPLES", 200)
    parts = prepare(tmp_path / "parts", parallel_corpus(src, tgt), encoding,
                    log=lambda line: None, progress=False, workers=3)
    def entries(prepared):
        return {split: {k: v for k, v in entry.items() if k not in ("parts", "encode_seconds")}
                for split, entry in prepared.manifest["splits"].items()}
    assert entries(parts) == entries(whole)
    assert parts.manifest["splits"]["train"]["parts"] == 3
    for suffix in ("ids", "offsets", "lengths"):
        for side in ("src", "tgt"):
            name = f"train.{side}.{suffix}"
            assert (parts.directory / name).read_bytes() == (whole.directory / name).read_bytes()
    too_long = [line for line in parts.manifest["log"] if line.startswith("train: tokenized")]
    assert too_long == [line for line in whole.manifest["log"]
                        if line.startswith("train: tokenized")] and too_long


def test_given_dev_and_test_files_and_a_language_models_lines(tmp_path):
    src, tgt = write_parallel(tmp_path, 300)
    (tmp_path / "held").mkdir()
    dev_src, dev_tgt = write_parallel(tmp_path / "held", 20, seed=1)
    prepared = prepare(tmp_path / "prepared",
                       parallel_corpus(src, tgt, dev=(dev_src, dev_tgt)),
                       Encoding(max_len=128, vocab_size=60), log=lambda line: None,
                       progress=False)
    pairs, _ = corpora.read_parallel_text(dev_src, dev_tgt)
    assert prepared.examples("dev") == pairs  # the given file, whole and in order
    assert prepared.manifest["splits"]["test"]["examples"] == 40
    assert prepared.manifest["splits"]["train"]["examples"] == 260

    lines = [" ".join(np.random.default_rng(i).choice(CORPUS_WORDS, 5)) for i in range(200)]
    text = Corpus("lines", settings={}, **{
        split: Source(lambda r, part=part: given(part, r), CorpusReport("counting", unit="lines"))
        for split, part in (("train", lines[:150]), ("dev", lines[150:170]),
                            ("test", lines[170:]))})
    tokenizer = Tokenizer.train(lines[:150], tmp_path / "lm.model", vocab_size=40)
    lm = prepare(tmp_path / "lm", text, Encoding(max_len=32, tokenizer=tokenizer),
                 log=lambda line: None, progress=False)
    src_store, tgt_store = lm.sides("train")
    ids, _ = encode_lines(tokenizer, lines[:150], max_len=32)
    assert src_store is None
    assert lm.fingerprint("train") == PackedBatches(None, ids, 128, [(0, 32)]).fingerprint
    assert lm.examples("test") == lines[170:]
    assert lm.tokenizer_path.read_bytes() == tokenizer.path.read_bytes()


# --- bad data, refusals, interruptions --------------------------------------------------------

def test_mostly_unknown_and_too_long_splits_are_refused(tmp_path):
    src, tgt = write_parallel(tmp_path, 200)
    with pytest.raises(NoneFits, match=r"every pair of the test split \(40\) is longer than "
                                       "max_len 2 tokens"):
        prepare(tmp_path / "p", parallel_corpus(src, tgt), Encoding(max_len=2, vocab_size=60),
                log=lambda line: None, progress=False)
    other = Tokenizer.train(["xyz qrs"] * 50, tmp_path / "other.model", vocab_size=12)
    with pytest.raises(CorpusError, match=r"test: 40 of 40 pairs \(100.0%\) are 25% or more "
                                          r"unknown pieces"):
        prepare(tmp_path / "p", parallel_corpus(src, tgt),
                Encoding(max_len=64, tokenizer=other), log=lambda line: None, progress=False)
    assert not (tmp_path / "p").exists() and not list(tmp_path.glob("p.tmp-*"))


def test_a_few_mostly_unknown_examples_are_counted_and_reported(tmp_path):
    """A side with 25% or more <unk> pieces flags its pair, whichever side it is."""
    english = [" ".join(np.random.default_rng(i).choice(CORPUS_WORDS, 4)) for i in range(40)]
    tokenizer = Tokenizer.train(english, tmp_path / "en.model", vocab_size=40)
    greek = "αβγ δεζ ηθι"
    pairs = [(greek if i < 3 else e, greek if 3 <= i < 5 else e) for i, e in enumerate(english)]
    pairs[5] = (english[5] + " αβγ", english[5])  # one unknown piece of many: not flagged
    corpus = Corpus("pairs", settings={}, **{
        split: Source(lambda r, part=part: given(part, r), CorpusReport("mixed"))
        for split, part in (("train", pairs), ("dev", pairs[20:]), ("test", pairs[30:]))})
    lines = []
    prepared = prepare(tmp_path / "p", corpus, Encoding(max_len=64, tokenizer=tokenizer),
                       log=lines.append, progress=False)
    assert prepared.manifest["splits"]["train"]["many_unknown"] == 5
    assert "train: 5 of 40 pairs (12.5%) are 25% or more unknown pieces (<unk>) to the " \
           "tokenizer" in lines
    assert prepared.manifest["splits"]["dev"]["many_unknown"] == 0


def test_unequal_line_counts_are_named_and_nothing_is_left(tmp_path):
    src, tgt = write_parallel(tmp_path, 100)
    tgt.write_text(tgt.read_text() + "one more\n")
    with pytest.raises(CorpusError, match="has 100 lines but .* has 101"):
        prepare(tmp_path / "p", parallel_corpus(src, tgt), Encoding(max_len=32, vocab_size=60),
                log=lambda line: None, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.src", "train.tgt"]


def test_a_changed_corpus_file_is_detected(tmp_path):
    src, tgt = write_parallel(tmp_path, 200)
    corpus, encoding = parallel_corpus(src, tgt), Encoding(max_len=32, vocab_size=60)
    prepared = prepare(tmp_path / "p", corpus, encoding, log=lambda line: None, progress=False)
    assert prepared.staleness(key(corpus, encoding)) is None
    assert prepared.staleness(key(corpus, Encoding(max_len=33, vocab_size=60))) == \
        "it was prepared with other max_len"
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched, not changed
    assert Prepared(prepared.directory).changed_files == []
    text = src.read_text()
    src.write_text(text.replace("cat", "dog", 1) if "cat" in text else "x" + text[1:])
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert Prepared(prepared.directory).changed_files == [str(src.resolve())]  # same size
    src.unlink()  # a prepared directory is used without its corpus
    assert Prepared(prepared.directory).changed_files == []


def test_a_failing_worker_stops_the_others_and_says_why(tmp_path):
    jobs = [encode_worker.Job(raw=str(tmp_path), split="train", store="train", start=0,
                              stop=10, output=str(tmp_path / f"part{k}"), sides=["tgt"],
                              max_len=8, unknown_ids=[1], dtype="uint16",
                              tokenizer=str(tmp_path / "missing.model")) for k in range(2)]
    with pytest.raises(RuntimeError, match=r"(?s)encoding examples 0-10 of the train split failed "
                                           r"\(exit 1\): .*missing.model"):
        encode_worker.run(jobs, tqdm(disable=True))


def test_the_worker_that_failed_is_reported_not_the_one_stopped_for_it(tmp_path, monkeypatch):
    """Part 0 still runs (a sleep stands in for it) when part 1 fails: the error is part
    1's, not the SIGKILL that stopped part 0."""
    jobs = [encode_worker.Job(raw=str(tmp_path), split="train", store="train", start=10 * k,
                              stop=10 * k + 10, output=str(tmp_path / f"part{k}"), sides=["tgt"],
                              max_len=8, unknown_ids=[1], dtype="uint16",
                              tokenizer=str(tmp_path / "missing.model")) for k in range(2)]
    popen = subprocess.Popen

    def part_0_sleeps(argv, **kwargs):
        if argv[-1].endswith("part0.job"):
            argv = [sys.executable, "-c", "import time; time.sleep(60)"]
        return popen(argv, **kwargs)

    monkeypatch.setattr(encode_worker.subprocess, "Popen", part_0_sleeps)
    with pytest.raises(RuntimeError, match=r"(?s)encoding examples 10-20 of the train split "
                                           r"failed \(exit 1\): .*missing.model"):
        encode_worker.run(jobs, tqdm(disable=True))


@pytest.mark.slow  # a subprocess, killed
def test_a_killed_preparation_leaves_nothing_a_run_could_take_for_whole(tmp_path):
    src, tgt = write_parallel(tmp_path, 60_000)
    command = [sys.executable, "-m", "jax_transformer.commands.prepare", "--output",
               str(tmp_path / "p"), "--src-path", str(src), "--tgt-path", str(tgt),
               "--vocab-size", "60", "--quiet"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:  # killed while it encodes
        if line.startswith("vocabulary: "):
            break
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "p").exists() and list(tmp_path.glob("p.tmp-*"))
    with pytest.raises(CorpusError, match="is not a prepared corpus"):
        Prepared(tmp_path / "p")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert Prepared(tmp_path / "p").manifest["splits"]["train"]["examples"] > 0
    assert not list(tmp_path.glob("p.tmp-*"))  # the interrupted one's twin is gone
    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert "kept as it is" in again.stderr


# --- what jaxformer-prepare may replace ----------------------------------------------------

def run_prepare(output, src, tgt, *flags) -> int:
    """jaxformer-prepare on a tiny corpus, in this process."""
    from jax_transformer.commands import prepare as prepare_command
    return prepare_command.main(["--output", str(output), "--src-path", str(src),
                                 "--tgt-path", str(tgt), "--num-dev", "10", "--num-test", "10",
                                 "--vocab-size", "60", "--max-len", "64", "--workers", "1",
                                 "--quiet", *flags])


def user_directory(path, files=("notes.txt", "sub/deep.txt")):
    for name in files:
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(f"the user's {name}\n")
    return path


def refused(capsys, match: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert re.match(f"error: .*{match}", err), err


def test_prepare_refuses_a_regular_file_as_output(tmp_path, capsys):
    src, tgt = write_parallel(tmp_path, 100)
    (tmp_path / "afile").write_text("mine\n")
    assert run_prepare(tmp_path / "afile", src, tgt) == 2
    refused(capsys, "afile is a file, not a directory")
    assert (tmp_path / "afile").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "train.src", "train.tgt"]


def test_prepare_refuses_a_directory_of_the_users_files(tmp_path, capsys):
    src, tgt = write_parallel(tmp_path, 100)
    before = tree_hashes(user_directory(tmp_path / "userdir"))
    assert run_prepare(tmp_path / "userdir", src, tgt) == 2
    refused(capsys, "userdir is not a prepared corpus.*notes.txt")
    assert tree_hashes(tmp_path / "userdir") == before
    lookalike = user_directory(tmp_path / "lookalike", ("manifest.json", "train.txt"))
    (lookalike / "manifest.json").write_text('{"key": "mine"}')
    before = tree_hashes(lookalike)
    assert run_prepare(lookalike, src, tgt) == 2
    refused(capsys, "lookalike is not a prepared corpus .*train.txt")
    assert tree_hashes(lookalike) == before
    (tmp_path / "empty").mkdir()
    assert run_prepare(tmp_path / "empty", src, tgt) == 0  # an empty directory may be used
    assert Prepared(tmp_path / "empty").manifest["splits"]["train"]["examples"] == 80


def test_prepare_refuses_an_output_that_holds_its_corpus(tmp_path, monkeypatch, capsys):
    corpdir = tmp_path / "corpdir"
    corpdir.mkdir()
    src, tgt = write_parallel(corpdir, 100)
    assert run_prepare(corpdir, src, tgt) == 2
    refused(capsys, f"{src} is inside {corpdir}")
    monkeypatch.chdir(corpdir)
    assert run_prepare(".", "train.src", "train.tgt") == 2
    refused(capsys, f"train.src is inside {corpdir}")
    assert src.exists() and tgt.exists()
    # A preparation holding the corpus is refused too: replacing it would delete the corpus.
    prepared = tmp_path / "prepared"
    assert run_prepare(prepared, src, tgt) == 0
    for path in (src, tgt):
        os.rename(path, prepared / path.name.replace("train", "text"))
    assert run_prepare(prepared, prepared / "text.src", prepared / "text.tgt") == 2
    assert (prepared / "text.src").exists() and (prepared / "text.tgt").exists()


def test_prepare_removes_only_the_stale_twins_it_made(tmp_path, capsys):
    src, tgt = write_parallel(tmp_path, 100)
    for name in ("p.old-backup", "p.tmp-99999999", "p.old-99999999"):
        user_directory(tmp_path / name)
    before = tree_hashes(tmp_path)
    assert run_prepare(tmp_path / "p", src, tgt) == 0
    after = tree_hashes(tmp_path)
    assert {name: after[name] for name in before} == before
    ours = tmp_path / "p.tmp-99999998"  # an interrupted preparation's
    ours.mkdir()
    (ours / pipeline.TWIN_MARKER).write_text("")
    assert run_prepare(tmp_path / "p", src, tgt, "--seed", "1") == 0
    assert not ours.exists() and tree_hashes(tmp_path / "p.tmp-99999999") == {
        name.removeprefix("p.tmp-99999999/"): digest for name, digest in before.items()
        if name.startswith("p.tmp-99999999/")}


def test_prepare_keys_on_the_files_a_relative_path_names_today(tmp_path, monkeypatch, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    for directory, seed in ((first, 0), (second, 1)):
        directory.mkdir()
        write_parallel(directory, 100, seed=seed)
    monkeypatch.chdir(first)
    assert run_prepare(tmp_path / "p", "train.src", "train.tgt") == 0
    monkeypatch.chdir(second)
    capsys.readouterr()
    assert run_prepare(tmp_path / "p", "train.src", "train.tgt") == 0
    err = capsys.readouterr().err
    assert "kept as it is" not in err
    assert f"was prepared from {first / 'train.src'}" in err, err
    files = Prepared(tmp_path / "p").manifest["files"]
    assert [entry["path"] for entry in files] == [str(second / "train.src"),
                                                  str(second / "train.tgt")]


def test_a_preparation_from_before_keys_held_files_is_prepared_again(tmp_path, capsys):
    src, tgt = write_parallel(tmp_path, 100)
    assert run_prepare(tmp_path / "p", src, tgt) == 0
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    del manifest["key"]["files"]
    (tmp_path / "p" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "p" / pipeline.TWIN_MARKER).unlink()
    capsys.readouterr()
    assert run_prepare(tmp_path / "p", src, tgt) == 0
    assert "it was prepared before preparations recorded which files" in capsys.readouterr().err
    assert "files" in Prepared(tmp_path / "p").key


def test_prepare_changes_nothing_it_did_not_write(tmp_path, capsys):
    """Every kind of existing --output, and the user's look-alikes of its twins: each file
    of the tree is as it was, but for the previous preparation, which is replaced."""
    (tmp_path / "corpus").mkdir()
    src, tgt = write_parallel(tmp_path / "corpus", 100)
    (tmp_path / "afile").write_text("mine\n")
    user_directory(tmp_path / "userdir")
    (tmp_path / "corpdir").mkdir()
    held_src, held_tgt = write_parallel(tmp_path / "corpdir", 100, seed=2)
    (tmp_path / "link").symlink_to(tmp_path / "userdir")
    assert run_prepare(tmp_path / "previous", src, tgt) == 0
    for output in ("afile", "userdir", "corpdir", "link", "previous"):
        for suffix in ("old-backup", "tmp-99999999"):
            user_directory(tmp_path / f"{output}.{suffix}")
    before = tree_hashes(tmp_path)
    for output, corpus, code in (("afile", (src, tgt), 2), ("userdir", (src, tgt), 2),
                                 ("corpdir", (held_src, held_tgt), 2), ("link", (src, tgt), 2),
                                 ("previous", (src, tgt), 0)):
        assert run_prepare(tmp_path / output, *corpus, "--seed", "3") == code, output
    after = tree_hashes(tmp_path)
    changed = {name for name in before if after.get(name) != before[name]}
    assert changed and all(name.startswith("previous/") for name in changed), changed
    assert Prepared(tmp_path / "previous").key["seed"] == 3
