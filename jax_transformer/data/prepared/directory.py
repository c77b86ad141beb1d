"""A prepared corpus on disk (pipeline.py writes it): the directory, its manifest, and
its stores read back.

    DIR/manifest.json          what it was prepared from (`key`: the corpus's settings,
                               its files' resolved paths, the encoding's settings), the
                               files' sizes, times and SHA-256,
                               each split's size and fingerprint, the log lines, timings
    DIR/tokenizer.model        the SentencePiece vocabulary (ours: trained there or given)
    DIR/SPLIT.src.*, .tgt.*    each split's piece ids (store.py), pieces only: batches
                               add eos/bos. A language model's lines are SPLIT.tgt alone
    DIR/dev.json, test.json    the held-out examples as text, to decode and score

Opening a directory checks it without reading its stores whole: the manifest's fields,
every file present and inside DIR (a link out of it is refused), the stores' sizes
against their offsets and the manifest's counts, the held-out examples parsed; the
gathers check the ids against the vocabulary (store.py). Anything else is a
CorpusError naming the file. Needs numpy alone.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from jax_transformer.data.corpora import CorpusError
from jax_transformer.data.prepared.store import TokenStore, check_sizes, damaged
from transformer_core.checkpoint_dir import TOKENIZER_FILE
from transformer_core.errors import listing

FORMAT = 1  # manifest.json's layout; another is prepared again
MANIFEST = "manifest.json"
SPLITS = ("train", "dev", "test")
HELD_OUT = ("dev", "test")  # the splits kept as text too (DIR/SPLIT.json)
UNIT_SIDES = {"pairs": ["src", "tgt"], "lines": ["tgt"]}  # the stores of each split
IDS_DTYPES = ("uint16", "int32")  # store.ids_dtype's, or a checkpoint tokenizer's
FILE_FIELDS = {"path": str, "size": int, "mtime_ns": int, "sha256": str}  # of "files"
JSON_TYPES = {dict: "an object", list: "a list", str: "a string", int: "an integer"}


def file_sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Prepared:
    """A prepared directory, as `prepare` wrote it."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.manifest = self._read_manifest()
        self.dtype = np.dtype(self.manifest["ids_dtype"])
        names = [f"{split}.{side}.{suffix}" for split in SPLITS for side in self.manifest["sides"]
                 for suffix in ("lengths", "offsets", "ids")]
        if self.manifest.get("tokenizer_sha256") is not None:  # ours, not a checkpoint's
            names.append(TOKENIZER_FILE)
        for name in [*names, *(f"{split}.json" for split in HELD_OUT)]:
            self._own_file(name)
        for split in SPLITS:
            for side in self.manifest["sides"]:
                check_sizes(self.directory, f"{split}.{side}", self.dtype,
                            self.manifest["splits"][split]["examples"])
        self._examples = {split: self._read_examples(split) for split in HELD_OUT}

    def _read_manifest(self) -> dict:
        """DIR/manifest.json, its fields checked (_manifest_problem)."""
        path = self.directory / MANIFEST
        if not path.is_file():
            raise CorpusError(f"{self.directory} is not a prepared corpus (it has no "
                              f"{MANIFEST}); make one with jaxformer-prepare")
        self._own_file(MANIFEST)
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise CorpusError(f"{path} cannot be read ({e}); prepare the corpus again") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise CorpusError(f"{self.directory} was prepared in another format than this "
                              f"version reads ({FORMAT}); prepare the corpus again")
        problem = _manifest_problem(manifest)
        if problem:
            raise self._damaged(MANIFEST, problem)
        return manifest

    def _own_file(self, name: str) -> Path:
        """DIR/name, which must be a file inside DIR: a link out of it is refused, since
        its target (any file of the user's) would be read as part of the corpus."""
        path = self.directory / name
        target = path.resolve()
        if not target.is_relative_to(self.directory.resolve()):
            raise self._damaged(name, f"is a link to {target}, outside {self.directory}")
        if not target.is_file():
            raise self._damaged(name, "is missing")
        return path

    def _read_examples(self, split: str) -> list:
        """DIR/SPLIT.json: (source, target) pairs, or lines."""
        path = self.directory / f"{split}.json"
        try:
            examples = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise self._damaged(path.name, f"cannot be read ({e})") from None
        pairs = self.unit == "pairs"
        if not isinstance(examples, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(isinstance(t, str) for t in e)
                if pairs else isinstance(e, str) for e in examples):
            raise self._damaged(path.name, "is not a list of "
                                + ("[source, target] pairs of text" if pairs else "lines of text"))
        return [tuple(e) for e in examples] if pairs else examples

    def _damaged(self, name: str, problem: str) -> CorpusError:
        return damaged(self.directory / name, problem)

    @property
    def key(self) -> dict:
        return self.manifest["key"]

    @property
    def unit(self) -> str:
        return self.manifest["key"]["unit"]

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / TOKENIZER_FILE

    def sides(self, split: str, vocab_sizes: tuple[int, int] | None = None
              ) -> tuple[TokenStore | None, TokenStore]:
        """(source store or None for a language model's lines, target store); with
        `vocab_sizes` (source, target), each store's gathers check its ids against its
        side's vocabulary."""
        bounds = dict(zip(("src", "tgt"), vocab_sizes or (None, None)))
        stores = {side: TokenStore.open(self.directory, f"{split}.{side}", self.dtype,
                                        bounds[side])
                  for side in self.manifest["sides"]}
        return stores.get("src"), stores["tgt"]

    def fingerprint(self, split: str) -> str:
        return self.manifest["splits"][split]["fingerprint"]

    def split_bytes(self, split: str) -> int:
        """The size of a split's stores on disk."""
        return sum(path.stat().st_size for path in self.directory.glob(f"{split}.*")
                   if not path.name.endswith(".json"))

    def examples(self, split: str) -> list:
        """The dev or test split as text: (source, target) pairs, or lines."""
        return list(self._examples[split])

    @functools.cached_property
    def changed_files(self) -> list[str]:
        """The corpus files that are here and differ from those prepared (their size, or
        their contents when their modification time changed: hashed once per Prepared).
        Files not here are not checked: a prepared directory is used without its corpus."""
        changed = []
        for entry in self.manifest["files"]:
            path = Path(entry["path"])
            try:
                stat = path.stat()
            except OSError:
                continue
            if stat.st_size != entry["size"] or (stat.st_mtime_ns != entry["mtime_ns"] and
                                                 file_sha256(path) != entry["sha256"]):
                changed.append(str(path))
        return changed

    def staleness(self, wanted: dict) -> str | None:
        """Why this is not the preparation of key `wanted` (which names the files by their
        resolved paths) from today's files, or None when it is. A key that names its
        tokenizer by its file's digest (a resumed run's) matches a preparation that trained
        that very tokenizer."""
        mine = dict(self.key)
        if wanted.get("tokenizer") == f"sha256:{self.manifest.get('tokenizer_sha256')}":
            mine["tokenizer"] = wanted["tokenizer"]
        if "files" not in mine:
            return "it was prepared before preparations recorded which files they read"
        if mine["files"] != wanted["files"]:
            return (f"it was prepared from {listing(mine['files']) or 'no files'}, not "
                    f"{listing(wanted['files']) or 'no files'}")
        if self.changed_files:
            return f"{listing(self.changed_files)} changed since it was prepared"
        differing = sorted(name for name in {*mine, *wanted} if mine.get(name) != wanted.get(name))
        return f"it was prepared with other {', '.join(differing)}" if differing else None


def _manifest_problem(manifest: dict) -> str | None:
    """What of the fields this module reads is missing from `manifest` or not as prepare
    writes it (the first such), or None."""
    for field, wanted in _fields(manifest):
        value = manifest
        for part in field.split("."):
            if isinstance(value, list):
                value = value[int(part)]
            elif isinstance(value, dict) and part in value:
                value = value[part]
            else:
                return f"has no {field}"
        if isinstance(wanted, type):
            if not isinstance(value, wanted) or isinstance(value, bool):
                return f"has {field} {value!r}, not {JSON_TYPES[wanted]}"
        elif value not in wanted:
            return f"has {field} {value!r}, not one of {', '.join(map(repr, wanted))}"
    return None


def _fields(manifest: dict):
    """(field, a type or the values it may take) of each field this module reads, dotted
    (`files.0.path`), each after the fields it lies in: lazily, as `manifest`'s lists are
    known to be lists only once they are checked."""
    yield from [("key", dict), ("key.unit", tuple(UNIT_SIDES)), ("key.corpus", dict),
                ("ids_dtype", IDS_DTYPES), ("splits", dict), ("files", list), ("log", list)]
    yield "sides", (UNIT_SIDES[manifest["key"]["unit"]],)
    for split in SPLITS:
        yield from [(f"splits.{split}", dict), (f"splits.{split}.examples", int),
                    (f"splits.{split}.fingerprint", str)]
    for i in range(len(manifest["files"])):
        yield from [(f"files.{i}", dict), *((f"files.{i}.{name}", kind)
                                            for name, kind in FILE_FIELDS.items())]
    yield from ((f"log.{i}", str) for i in range(len(manifest["log"])))


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` where both are on one file system (a prepared
    directory's files are never changed in place), else a copy; whole or absent."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
