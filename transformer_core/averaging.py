"""Checkpoint averaging: the paper's last step before decoding ("the last 5 checkpoints,
written at 10-minute intervals" for the base models, 20 for the big ones), as fairseq's
scripts/average_checkpoints.py and Marian's --average-checkpoints do it.

    mean = ParameterMean(); mean.add(tensors, "DIR"); ...; mean.result()
    average_dirs([DIR, DIR, ...], OUT)   checkpoint directories -> their mean, in OUT

Sums are float64 and the mean float32, so averaging N copies of one checkpoint gives it
back bit for bit. Needs numpy and safetensors only (no framework).
"""

from __future__ import annotations

import filecmp
import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from transformer_core.checkpoint_dir import (CONFIG_FILE, OUTPUT_FILES, WEIGHTS_FILE,
                                             CheckpointError, check_state_dict,
                                             directory_written_whole, file_to_copy, read_config,
                                             read_weights, write_safetensors)
from transformer_core.config import TransformerConfig
from transformer_core.errors import listing


class ParameterMean:
    """The element-wise mean of parameter sets with the same names and shapes."""

    def __init__(self):
        self.sums: dict[str, np.ndarray] = {}
        self.count = 0
        self.first = ""  # where the names and shapes came from

    def add(self, tensors: Mapping[str, np.ndarray], source: str) -> None:
        """Add one set; a CheckpointError naming `source` if its names or shapes are not
        the first set's."""
        if not self.count:
            self.sums = {name: np.asarray(t, np.float64).copy() for name, t in tensors.items()}
            self.count, self.first = 1, source
            return
        if tensors.keys() != self.sums.keys():
            differ = sorted(tensors.keys() ^ self.sums.keys())
            raise CheckpointError(f"{source} and {self.first} hold different tensors "
                                  f"({listing(differ)}): only checkpoints of one model average")
        for name, tensor in tensors.items():
            if tensor.shape != self.sums[name].shape:
                raise CheckpointError(f"{source}: {name} has shape {tuple(tensor.shape)}, "
                                      f"{self.first}'s {self.sums[name].shape}")
            self.sums[name] += np.asarray(tensor, np.float64)
        self.count += 1

    def result(self) -> dict[str, np.ndarray]:
        """name -> the mean, float32."""
        return {name: (total / self.count).astype(np.float32) for name, total in self.sums.items()}


def tokenizer_files(directory: Path) -> list[str]:
    """The files beside the weights that describe the model (config, tokenizer, generation
    settings): every checkpoint averaged must hold the same ones, byte for byte."""
    return sorted(p.name for p in directory.iterdir()
                  if p.name in OUTPUT_FILES - {CONFIG_FILE, WEIGHTS_FILE} and p.is_file())


def check_same_model(directories: Sequence[Path]) -> TransformerConfig:
    """The config every directory holds; a CheckpointError naming the first directory
    whose config (the fields that differ) or tokenizer files are not the first one's."""
    first, configs = directories[0], [read_config(directory) for directory in directories]
    for directory, config in zip(directories[1:], configs[1:]):
        if config != configs[0]:
            fields = [f for f, v in config.to_dict().items() if configs[0].to_dict()[f] != v]
            raise CheckpointError(f"{directory} and {first} are different models ({CONFIG_FILE} "
                                  f"differs in {listing(fields)}): only checkpoints of one "
                                  "model average")
        names = tokenizer_files(directory)
        if names != tokenizer_files(first) or not all(
                filecmp.cmp(directory / n, first / n, shallow=False) for n in names):
            raise CheckpointError(f"{directory} and {first} have different tokenizers "
                                  f"({listing(names) or 'none'} against "
                                  f"{listing(tokenizer_files(first)) or 'none'}, or their "
                                  "bytes): only checkpoints of one model average")
    return configs[0]


def check_each_once(directories: Sequence[Path]) -> None:
    """A CheckpointError naming the first directory given twice (however spelt): the mean
    would weigh it double."""
    seen: dict[Path, Path] = {}
    for directory in directories:
        first = seen.setdefault(directory.resolve(), directory)
        if first is not directory:
            also = f" (as {first} and {directory})" if str(first) != str(directory) else ""
            raise CheckpointError(f"{first} is given twice{also}: an average takes each "
                                  "checkpoint once, and the same one twice would weigh it "
                                  "double; give it once")


def average_dirs(directories: Sequence[str | os.PathLike], output: str | os.PathLike) -> Path:
    """Write the mean of checkpoint `directories` (one model: the same config and
    tokenizer) to `output` as a checkpoint directory, whole or not at all; returns it."""
    directories, output = [Path(d) for d in directories], Path(output)
    if not directories:
        raise CheckpointError("no checkpoint directories to average")
    for directory in directories:
        if directory.resolve() == output.resolve():
            raise CheckpointError(f"--output {output} is one of the checkpoints averaged: "
                                  "write the average to a new directory")
    check_each_once(directories)
    config = check_same_model(directories)
    mean = ParameterMean()
    for directory in directories:
        mean.add(read_weights(directory), str(directory))
    tensors = mean.result()
    check_state_dict(tensors, config, source=str(directories[0] / WEIGHTS_FILE))
    with directory_written_whole(output) as tmp:
        write_safetensors(tmp / WEIGHTS_FILE, tensors)
        for name in (CONFIG_FILE, *tokenizer_files(directories[0])):
            (tmp / name).write_bytes(file_to_copy(directories[0], name).read_bytes())
    return output
