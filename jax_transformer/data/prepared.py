"""A prepared corpus on disk (prepare.py writes it): the directory, its manifest, and
its stores read back.

    DIR/manifest.json          what it was prepared from (`key`: the corpus's settings,
                               its files' resolved paths, the encoding's settings), the
                               files' sizes, times and SHA-256,
                               each split's size and fingerprint, the log lines, timings
    DIR/tokenizer.model        the SentencePiece vocabulary (ours: trained there or given)
    DIR/SPLIT.src.*, .tgt.*    each split's piece ids (store.py), pieces only: batches
                               add eos/bos. A language model's lines are SPLIT.tgt alone
    DIR/dev.json, test.json    the held-out examples as text, to decode and score

Needs numpy alone.
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
from jax_transformer.data.store import TokenStore
from transformer_core.checkpoint_dir import TOKENIZER_FILE
from transformer_core.errors import listing

FORMAT = 1  # manifest.json's layout; another is prepared again
MANIFEST = "manifest.json"
SPLITS = ("train", "dev", "test")


def file_sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class Prepared:
    """A prepared directory, as `prepare` wrote it."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        path = self.directory / MANIFEST
        try:
            self.manifest = json.loads(path.read_text())
        except FileNotFoundError:
            raise CorpusError(f"{self.directory} is not a prepared corpus (it has no "
                              f"{MANIFEST}); make one with jaxformer-prepare") from None
        except (OSError, ValueError) as e:
            raise CorpusError(f"{path} cannot be read ({e}); prepare the corpus again") from None
        if not isinstance(self.manifest, dict) or self.manifest.get("format") != FORMAT:
            raise CorpusError(f"{self.directory} was prepared in another format than this "
                              f"version reads ({FORMAT}); prepare the corpus again")
        self.dtype = np.dtype(self.manifest["ids_dtype"])

    @property
    def key(self) -> dict:
        return self.manifest["key"]

    @property
    def unit(self) -> str:
        return self.manifest["key"]["unit"]

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / TOKENIZER_FILE

    def sides(self, split: str) -> tuple[TokenStore | None, TokenStore]:
        """(source store or None for a language model's lines, target store)."""
        stores = {side: TokenStore.open(self.directory, f"{split}.{side}", self.dtype)
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
        examples = json.loads((self.directory / f"{split}.json").read_text())
        return [tuple(e) for e in examples] if self.unit == "pairs" else examples

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


def link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source` where both are on one file system (a prepared
    directory's files are never changed in place), else a copy; whole or absent."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)
