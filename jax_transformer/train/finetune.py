"""Fine-tuning: train.py --init-from DIR starts from a checkpoint directory.

    read_init_dir(DIR)       its config and tokenizer, checked (TrainError naming DIR)
    model_defaults(config)   the model flags' defaults: DIR's config
    check_settings(s, init)  refuse model flags (and --task, --max-len) DIR's model contradicts,
                             language codes its tokenizer lacks or needs, a --workdir in DIR
    run_config(config, m)    DIR's config with the training-only overrides (--dropout)
    fingerprint(DIR)         what run_args.json records: a resume needs the same DIR
    install_tokenizer(...)   DIR's tokenizer files copied into WORKDIR/tokenizer/, loaded

The tokenizer is the checkpoint's own, never a new one: ours (tokenizer.model), a
converted opus-mt model's Marian files (source.spm / target.spm + vocab.json:
separate source and target pieces in one id space), a converted FSMT model's (Moses +
BPE, two vocabularies) or M2M100/NLLB model's (SentencePiece + language codes, which
--src-lang-code / --tgt-lang-code pick), whichever
transformer_core.checkpoint_dir.load_tokenizer finds. The batches use the config's
special ids, so a Marian model's decoder starts from its pad id, and a fairseq
model's from </s>, as transformers' do. Needs neither JAX nor torch (train.py's flags
are checked before JAX loads).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import safetensors

from jax_transformer.train.settings import RunSettings
from jax_transformer.train.settings.data import TASK_ARCHITECTURES
from jax_transformer.train.settings.fields import flag
from jax_transformer.train.settings.model import ModelSettings
from transformer_core import checkpoint_dir
from transformer_core.checkpoint_dir import CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE
from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.errors import InputError, TrainError
from transformer_core.fairseq_tokenizer import FAIRSEQ_TOKENIZER_FILES
from transformer_core.fsmt_tokenizer import FSMT_TOKENIZER_FILES
from transformer_core.marian_tokenizer import MARIAN_TOKENIZER_FILES
from transformer_core.tokenizer import CheckpointTokenizer

# Config fields that only change training, which a fine-tuning run may set anew.
TRAINING_ONLY_FIELDS = ("dropout",)
# Every tokenizer file checkpoint_dir.load_tokenizer reads: ours, Marian's, M2M100/NLLB's
# and FSMT's, each listed once by the tokenizer that reads it (tests/train/test_finetune.py
# checks these are the files the port writes).
TOKENIZER_FILES = (TOKENIZER_FILE, *MARIAN_TOKENIZER_FILES, *FAIRSEQ_TOKENIZER_FILES,
                   *FSMT_TOKENIZER_FILES)
LANGUAGE_FLAGS = ("--src-lang-code", "--tgt-lang-code")
RUN_TOKENIZER_DIR = "tokenizer"  # WORKDIR/tokenizer/: the fine-tuning run's copy


class InitDir(NamedTuple):
    """A checkpoint directory to start from: where, its config, its tokenizer."""
    directory: Path
    config: TransformerConfig
    tokenizer: CheckpointTokenizer

    @property
    def task(self) -> str | None:
        """The train.py task that trains this architecture (None: none does)."""
        return next((task for task, architecture in TASK_ARCHITECTURES.items()
                     if architecture == self.config.architecture), None)


def read_init_dir(path: str | Path) -> InitDir:
    """DIR's config and tokenizer, and its weights' names and shapes (read from the
    safetensors header, not loaded), each checked; a TrainError naming DIR otherwise."""
    directory = Path(path)
    where = f"--init-from {directory}"
    if not directory.is_dir():
        raise TrainError(f"{where}: no such directory (a checkpoint directory: train.py's "
                         "export/, or one jaxformer-port wrote)")
    try:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise TrainError(f"{where}: has no {name}; is it a checkpoint directory?")
        config = TransformerConfig.from_json(directory / CONFIG_FILE)
        with safetensors.safe_open(directory / WEIGHTS_FILE, "numpy") as weights:
            shapes = {key: _Shape(tuple(weights.get_slice(key).get_shape()))
                      for key in weights.keys()}
        checkpoint_dir.check_state_dict(shapes, config, source=str(directory / WEIGHTS_FILE))
        for name in tokenizer_files(directory):  # copied into the run and its export
            checkpoint_dir.file_to_copy(directory, name)
        tokenizer = checkpoint_dir.load_tokenizer(directory)
        tokenizer.check_fits(config)
    except TrainError:
        raise
    except (InputError, ConfigError, OSError) as e:
        raise TrainError(f"{where}: {e}") from None
    except safetensors.SafetensorError as e:
        raise TrainError(f"{where}: {directory / WEIGHTS_FILE} is corrupt or truncated: "
                         f"{e}") from None
    return InitDir(directory, config, tokenizer)


class _Shape(NamedTuple):  # what check_state_dict reads of a tensor
    shape: tuple[int, ...]


def model_defaults(config: TransformerConfig) -> dict[str, Any]:
    """The model flags' values that say DIR's model: its config's fields (train.py's
    defaults with --init-from; a library caller builds ModelSettings(**these))."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(ModelSettings)}


def check_settings(settings: RunSettings, init: InitDir) -> None:
    """Refuse, in one line, what contradicts DIR's model: each model flag that differs
    from its config (training-only ones excepted), a task that trains another
    architecture, a --max-len beyond its positions."""
    where = f"--init-from {init.directory}"
    config = init.config
    check_workdir(settings.train.workdir, init.directory)
    if init.task is None:
        raise TrainError(f"{where}: its model is {config.architecture}; train.py trains "
                         + " and ".join(f"{a} (--task {t})" for t, a in TASK_ARCHITECTURES.items()))
    if settings.data.task != init.task:
        raise TrainError(f"--task {settings.data.task} trains {settings.data.architecture} "
                         f"models; the model of {where} is {config.architecture}: use --task "
                         f"{init.task}")
    differ = [f"{flag(name)} {value!r} (its config.json: {getattr(config, name)!r})"
              for name, value in dataclasses.asdict(settings.model).items()
              if name not in TRAINING_ONLY_FIELDS and value != getattr(config, name)]
    if differ:
        raise TrainError(f"{where} fixes the model: {', '.join(differ)}; drop these flags "
                         f"(only {', '.join(map(flag, TRAINING_ONLY_FIELDS))} may differ)")
    if settings.data.max_len > config.max_len:
        raise TrainError(f"--max-len {settings.data.max_len} is longer than the positions of "
                         f"{where} (max_len {config.max_len})")
    set_languages(init.tokenizer, language_codes(settings), where)


def check_workdir(workdir: str, directory: Path) -> None:
    """Refuse a --workdir that is, holds or sits inside DIR: the run would write its
    config.json, checkpoints and export into the checkpoint it starts from."""
    work, init = Path(workdir).resolve(), Path(directory).resolve()
    relation = ("is" if work == init else "holds" if work in init.parents
                else "sits inside" if init in work.parents else None)
    if relation:
        raise TrainError(f"--workdir {workdir} {relation} --init-from {directory}: the run "
                         "would write its files into the checkpoint it starts from; give a "
                         "--workdir outside it")


def language_codes(settings: RunSettings) -> tuple[str | None, str | None]:
    """(--src-lang-code, --tgt-lang-code) as flagged."""
    return settings.train.src_lang_code, settings.train.tgt_lang_code


def set_languages(tokenizer: CheckpointTokenizer, codes: tuple[str | None, str | None],
                  where: str) -> None:
    """Give an M2M100/NLLB tokenizer the corpus's language codes, both required and known
    to it; refuse codes for a tokenizer without any (a TrainError naming `where`)."""
    if not hasattr(tokenizer, "set_languages"):
        if any(codes):
            raise TrainError(f"{' and '.join(LANGUAGE_FLAGS)} are for an M2M100/NLLB "
                             f"checkpoint; the tokenizer of {where} "
                             f"({type(tokenizer).__name__}) has no language codes: drop them")
        return
    if tokenizer.source_code == "suffix":
        raise TrainError(f"{where}: its tokenizer puts the source code after </s> "
                         "(legacy_behaviour), which training batches cannot end a source with; "
                         "convert it with legacy_behaviour false")
    known = f"known codes: {' '.join(tokenizer.supported_language_codes)}"
    if not all(codes):
        raise TrainError(f"{where} is a {tokenizer.family} model: give the corpus's languages "
                         f"as {' and '.join(LANGUAGE_FLAGS)}; {known}")
    unknown = [f"{name} {code!r}" for name, code in zip(LANGUAGE_FLAGS, codes)
               if code not in tokenizer.supported_language_codes]
    if unknown:
        raise TrainError(f"{where}: its {tokenizer.family} tokenizer has no language "
                         f"{' nor '.join(unknown)}; {known}")
    tokenizer.set_languages(*codes)


def run_config(config: TransformerConfig, model: ModelSettings) -> TransformerConfig:
    """The fine-tuned model's config: DIR's, with the training-only fields as flagged."""
    return config.replace(**{name: getattr(model, name) for name in TRAINING_ONLY_FIELDS})


def tokenizer_files(directory: Path) -> list[str]:
    return [name for name in TOKENIZER_FILES if (Path(directory) / name).is_file()]


def fingerprint(directory: str | Path) -> str:
    """A digest of DIR's config, weights and tokenizer files (names and bytes)."""
    digest = hashlib.sha256()
    for name in (CONFIG_FILE, WEIGHTS_FILE, *tokenizer_files(Path(directory))):
        digest.update(name.encode() + b"\0")
        with open(Path(directory) / name, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def install_tokenizer(init: InitDir, workdir: Path, codes: tuple[str | None, str | None],
                      primary: bool = True) -> CheckpointTokenizer:
    """Copy DIR's tokenizer files into WORKDIR/tokenizer/ (replacing what was there) and
    load them, with the language `codes` (set_languages): the run and its export use that
    copy. Only the `primary` process writes; the others read DIR's own files (the same
    bytes: the fingerprint covers them)."""
    target = workdir / RUN_TOKENIZER_DIR
    if not primary:
        set_languages(init.tokenizer, codes, f"--init-from {init.directory}")
        return init.tokenizer
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in tokenizer_files(init.directory):
        checkpoint_dir.write_atomically(
            target / name, lambda p, name=name: shutil.copyfile(
                checkpoint_dir.file_to_copy(init.directory, name), p))
    tokenizer = checkpoint_dir.load_tokenizer(target)
    tokenizer.check_fits(init.config)
    set_languages(tokenizer, codes, f"--init-from {init.directory}")
    return tokenizer


def copy_tokenizer(workdir: Path, directory: Path) -> list[str]:
    """The run's tokenizer files (WORKDIR/tokenizer/) into an export directory."""
    names = tokenizer_files(workdir / RUN_TOKENIZER_DIR)
    for name in names:
        checkpoint_dir.write_atomically(directory / name, lambda p, name=name: shutil.copyfile(
            workdir / RUN_TOKENIZER_DIR / name, p))
    return names
