"""The checkpoint directory both frameworks read and write.

    DIR/config.json        TransformerConfig as JSON
    DIR/model.safetensors  torch-named, torch-layout tensors
    DIR/tokenizer.model    SentencePiece model (when there is one)

Only numpy and safetensors are needed here: both frameworks read and write it.
The Flax <-> torch naming rule is written once, in `flax_path_to_torch_key`:

    Flax path (joined by '/')          torch key                  tensor
    .../<linear>/kernel                .../<linear>.weight        transposed
    .../<linear>/bias                  .../<linear>.bias          as is
    .../<name>_norm/scale              .../<name>_norm.weight     as is
    <name>_embed/embedding             <name>_embed.weight        as is
    layers/<i>/...                     layers.<i>. ...            as is
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Callable, Collection, Iterator, Mapping

import numpy as np
import safetensors
import safetensors.numpy

from transformer_core.config import ConfigError, TransformerConfig
from transformer_core.errors import InputError, listing
from transformer_core.fairseq_tokenizer import FAIRSEQ_TOKENIZER_FILES, FairseqTokenizer
from transformer_core.fsmt_tokenizer import FSMT_TOKENIZER_FILES, FSMTTokenizer
from transformer_core.marian_tokenizer import MARIAN_TOKENIZER_FILES, MarianTokenizer
from transformer_core.text import read_json_object
from transformer_core.tokenizer import CheckpointTokenizer, Tokenizer, TokenizerError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.model"
# What our exporters and converters write into a directory (ours, or a Hugging Face
# Marian one): a directory holding only these is an earlier output, which a new one replaces.
OUTPUT_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE, "generation_config.json",
                          *MARIAN_TOKENIZER_FILES, *FAIRSEQ_TOKENIZER_FILES,
                          *FSMT_TOKENIZER_FILES})


class CheckpointError(InputError):
    """A checkpoint directory or state dict does not fit the model."""


# ---------------------------------------------------------------- naming

def expected_shapes(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every torch key the model defines, with its torch-layout shape."""
    d, f = config.d_model, config.d_ff
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(prefix, n_in, n_out, bias=True):
        shapes[f"{prefix}.weight"] = (n_out, n_in)
        if bias:
            shapes[f"{prefix}.bias"] = (n_out,)

    def norm(prefix):
        shapes[f"{prefix}.weight"] = (d,)
        shapes[f"{prefix}.bias"] = (d,)

    def attention(prefix):
        for name in ("W_q", "W_k", "W_v", "W_o"):
            linear(f"{prefix}.{name}", d, d)

    def ffn(prefix):
        linear(f"{prefix}.W_1", d, f)
        linear(f"{prefix}.W_2", f, d)

    if config.share_embeddings:
        shapes["shared_embed.weight"] = (config.src_vocab_size, d)
    else:
        shapes["src_embed.weight"] = (config.src_vocab_size, d)
        shapes["tgt_embed.weight"] = (config.tgt_vocab_size, d)
    if config.position_encoding == "learned":
        shapes["position_embed.weight"] = (config.max_len + config.position_offset, d)
    if config.architecture != "decoder_only":
        for i in range(config.num_encoder_layers):
            p = f"encoder.layers.{i}"
            attention(f"{p}.self_attn"); norm(f"{p}.self_attn_norm")
            ffn(f"{p}.ffn"); norm(f"{p}.ffn_norm")
        if config.final_norm:
            norm("encoder.final_norm")
    if config.architecture != "encoder_only":
        for i in range(config.num_decoder_layers):
            p = f"decoder.layers.{i}"
            attention(f"{p}.self_attn"); norm(f"{p}.self_attn_norm")
            if config.architecture == "encoder_decoder":
                attention(f"{p}.cross_attn"); norm(f"{p}.cross_attn_norm")
            ffn(f"{p}.ffn"); norm(f"{p}.ffn_norm")
        if config.final_norm:
            norm("decoder.final_norm")
    if config.tie_output:
        if config.output_bias:
            shapes["output_bias"] = (config.tgt_vocab_size,)
    else:
        linear("output_projection", d, config.tgt_vocab_size, bias=config.output_bias)
    return shapes


def flax_path_to_torch_key(path: tuple) -> tuple[str, bool]:
    """('encoder', 'layers', 0, 'self_attn', 'W_q', 'kernel') ->
    ('encoder.layers.0.self_attn.W_q.weight', transpose=True)."""
    *parents, leaf = (str(p) for p in path)
    transpose = False
    if leaf == "kernel":
        leaf, transpose = "weight", True
    elif leaf in ("scale", "embedding"):
        leaf = "weight"
    return ".".join([*parents, leaf]), transpose


# ------------------------------------------------------------ validation

def check_state_dict(tensors: Mapping[str, object], config: TransformerConfig,
                     source: str = "state dict") -> None:
    """Raise CheckpointError unless `tensors` has exactly the model's keys and shapes.

    Called before any weight is written into a model, so a bad checkpoint is
    never half-loaded.
    """
    expected = expected_shapes(config)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    problems = []
    if missing:
        problems.append(f"missing keys: {listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {listing(unexpected)}")
    for key in sorted(set(expected) & set(tensors)):
        shape = tuple(tensors[key].shape)
        if shape != expected[key]:
            problems.append(f"shape mismatch for {key}: checkpoint has {shape}, "
                            f"config expects {expected[key]}")
    if problems:
        raise CheckpointError(f"{source} does not match the config: " + "; ".join(problems))


# ------------------------------------------------------------ directory

def save_dir(directory: str | os.PathLike, config: TransformerConfig,
             tensors: Mapping[str, np.ndarray], tokenizer: str | os.PathLike | None = None) -> Path:
    """Write config.json + model.safetensors (+ tokenizer.model), each file atomically."""
    check_state_dict(tensors, config)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_safetensors(directory / WEIGHTS_FILE, {k: np.ascontiguousarray(v)
                                                 for k, v in tensors.items()})
    write_atomically(directory / CONFIG_FILE, config.to_json)
    if tokenizer is not None and Path(tokenizer).resolve() != (directory / TOKENIZER_FILE).resolve():
        write_atomically(directory / TOKENIZER_FILE, lambda p: shutil.copyfile(tokenizer, p))
    return directory


def write_safetensors(path: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Write `arrays` to `path` as a safetensors file, atomically (write_atomically).
    safetensors reports a failed write (a full disk, a quota) as a SafetensorError, not an
    OSError ("Error while serializing: I/O error: No space left on device (os error
    28)"): it is raised as that OSError, naming `path`, so the commands and train.py's
    full-disk check take it as they take any failed write."""
    try:
        write_atomically(path, lambda tmp: safetensors.numpy.save_file(arrays, tmp,
                                                                       metadata=metadata))
    except safetensors.SafetensorError as e:
        reported = re.search(r"\(os error (\d+)\)", str(e))
        if reported is None:
            raise
        number = int(reported.group(1))
        raise OSError(number, os.strerror(number), str(path)) from e


def write_atomically(path: str | os.PathLike, write: Callable[[Path], object]) -> None:
    """`write(tmp)` to a new file beside `path`, then rename it to `path`: a reader (or a
    failed write) sees the old file or the new one, never part of one. The file gets
    the mode open() gives (0o666 & ~umask), not mkstemp's 0o600."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, mode)  # safetensors' save_file makes its file 0o600 whatever the umask
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def directory_written_whole(path: str | os.PathLike,
                            replaceable: Collection[str] = OUTPUT_FILES) -> Iterator[Path]:
    """Write a directory whole or not at all: yields a new empty directory beside `path`
    (.NAME.HEX.tmp) to write into; when the block ends without an error it is renamed
    to `path`. A failure part way (an error, a full disk) removes it and leaves `path`
    as it was, so a reader sees the old directory or the new one, never part of one; its
    error names the files by `path`, not by the temporary directory.

    An existing `path` is replaced whole, so it must be an earlier output: empty, or
    holding only `replaceable` names (and write_atomically's leftovers). Anything else
    in it is refused before a byte is written (a CheckpointError naming the files),
    since replacing the directory would delete them. Directories made above `path`
    are removed again after a failure."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} is a file, not a directory")
    if path.is_dir():
        others = sorted(entry.name for entry in path.iterdir() if entry.name not in replaceable
                        and not (entry.name.startswith(".") and entry.name.endswith(".tmp")))
        if others:
            raise CheckpointError(
                f"{path} holds files a checkpoint directory does not ({listing(others)}); "
                "writing there would replace the directory and delete them: choose a new or "
                "empty directory")
    made = [parent for parent in path.absolute().parents if not parent.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.mkdir()  # the mode mkdir gives (0o777 & ~umask), as the directory it becomes
    try:
        yield tmp
        _rename_into_place(tmp, path)
    except BaseException as error:
        shutil.rmtree(tmp, ignore_errors=True)
        for parent in made:  # innermost first; only the empty ones this call made
            with contextlib.suppress(OSError):
                parent.rmdir()
        if isinstance(error, InputError) and str(tmp) in str(error):  # a check of the output
            raise type(error)(str(error).replace(str(tmp), str(path))) from error
        if isinstance(error, OSError) and str(tmp) in str(error.filename):  # a failed write
            raise type(error)(error.errno, error.strerror,
                              str(error.filename).replace(str(tmp), str(path))) from error
        raise


def _rename_into_place(tmp: Path, path: Path) -> None:
    """`tmp` becomes `path`; an existing `path` is moved aside first and deleted once
    `tmp` is in its place (or put back if that fails)."""
    if not path.exists():
        os.rename(tmp, path)
        return
    old = path.with_name(f".{path.name}.{secrets.token_hex(4)}.old")
    os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def load_dir(directory: str | os.PathLike) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and validate a checkpoint directory; returns (config, torch-named numpy tensors)."""
    directory = Path(directory)
    config = read_config(directory)
    tensors = read_weights(directory)
    check_state_dict(tensors, config, source=str(directory / WEIGHTS_FILE))
    return config, tensors


def read_config(directory: Path) -> TransformerConfig:
    """A checkpoint directory's config, once it is seen to hold a config and weights; a
    CheckpointError naming what is missing or wrong."""
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory {directory} does not exist")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if not (directory / name).is_file():
            raise CheckpointError(missing_file(directory, name))
    try:
        return TransformerConfig.from_json(directory / CONFIG_FILE)
    except ConfigError as e:  # the message names the file
        raise CheckpointError(str(e)) from e


def read_weights(directory: Path) -> dict[str, np.ndarray]:
    """A checkpoint directory's tensors by torch key, as stored (not checked against a
    config); a CheckpointError for a damaged file."""
    try:
        return safetensors.numpy.load_file(directory / WEIGHTS_FILE)
    except (safetensors.SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{directory / WEIGHTS_FILE} is corrupt or truncated: {e}") from e


def missing_file(directory: Path, name: str) -> str:
    """The error for a checkpoint `directory` without file `name`: a train.py work
    directory has a config.json and a tokenizer.model of its own, and its model in
    export/, which the error then names."""
    export = directory / "export"
    hint = (f" (a train.py work directory? its model is in {export})"
            if (export / CONFIG_FILE).is_file() and (export / WEIGHTS_FILE).is_file() else "")
    return f"{directory} has no {name}{hint}"


def tokenizer_path(directory: str | os.PathLike) -> Path | None:
    path = Path(directory) / TOKENIZER_FILE
    return path if path.is_file() else None


def load_tokenizer(directory: str | os.PathLike) -> CheckpointTokenizer:
    """The directory's tokenizer: a converted Marian model's (source.spm + vocab.json), an
    M2M100/NLLB model's (sentencepiece.bpe.model + fairseq_tokenizer.json), an FSMT
    model's (vocab-src.json + fsmt_tokenizer.json ...) or ours (tokenizer.model); a
    TokenizerError when it has none."""
    if MarianTokenizer.is_present(directory):
        return MarianTokenizer(directory)
    if FairseqTokenizer.is_present(directory):
        return FairseqTokenizer(directory)
    if FSMTTokenizer.is_present(directory):
        return FSMTTokenizer(directory)
    path = tokenizer_path(directory)
    if path is None:
        raise TokenizerError(f"{directory} has no {TOKENIZER_FILE} (nor Marian's source.spm + "
                             "vocab.json); save the checkpoint with its tokenizer "
                             "(save_pretrained(dir, tokenizer=path))")
    return Tokenizer(path)


def file_to_copy(directory: str | os.PathLike, name: str) -> Path:
    """DIRECTORY/name, checked before its bytes are copied into another checkpoint (a
    fine-tuning run's, an export, a conversion): a link to a file outside the directory is
    refused, since the copy would carry that file to whoever the checkpoint is shared
    with, and a JSON file must parse as an object (CheckpointError)."""
    directory = Path(directory)
    path = directory / name
    target = path.resolve()
    if not target.is_relative_to(directory.resolve()):
        raise CheckpointError(f"{path} is a link to {target}, outside {directory}; copy the "
                              f"file itself into {directory}")
    if name.endswith(".json"):
        read_json_object(path, CheckpointError)
    return path
