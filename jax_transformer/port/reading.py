"""Reading source weights: safetensors (a file, or a Hugging Face directory and its
shards), or torch pickles opened safely.

Pickles are read with `torch.load(weights_only=True)`, so a checkpoint cannot
run code; safetensors need no torch at all. A file that cannot be read (cut
off, corrupt, not JSON) is a one-line PortError naming it. Converters take
tensors out of a `TensorConsumer`, which names every tensor nobody asked for.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from transformer_core import text
from transformer_core.config import type_problem
from transformer_core.errors import InputError, listing

class PortError(InputError):
    """The source checkpoint cannot be converted faithfully; the message says why."""


def check_field_types(values: Mapping[str, Any], types: Mapping[str, Any], source: str) -> None:
    """The one type check of every importer's foreign config (a Hugging Face config.json,
    a torch.nn mapping): each field of `values` named in `types` that is present and not
    null must have that type, by TransformerConfig's rules (transformer_core.config.
    type_problem), else a PortError names `source` and the field. Nothing is cast: "2"
    is not 2, "false" is not false."""
    for name, annotation in types.items():
        value = values.get(name)
        problem = None if value is None else type_problem(name, value, annotation)
        if problem:
            raise PortError(f"{source}: {problem}")


def read_weights(path: str | Path) -> dict[str, np.ndarray]:
    """A flat {name: numpy array} from .safetensors or a pickled torch state dict.

    Pickles are opened with `torch.load(weights_only=True)`: tensors and plain
    containers only, no code. A dict wrapping the state dict under "state_dict"
    or "model" is unwrapped.
    """
    path = Path(path)
    if not path.is_file():
        raise PortError(f"weights file {path} does not exist")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    obj = torch_load(path)
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):
            if isinstance(obj.get(wrapper), Mapping):
                obj = obj[wrapper]
                break
    if not isinstance(obj, Mapping):
        raise PortError(f"{path} holds a {type(obj).__name__}, not a state dict")
    tensors = {}
    for key, value in obj.items():
        if not hasattr(value, "detach"):
            raise PortError(f"{path}: entry {key!r} is a {type(value).__name__}, not a tensor")
        tensors[key] = torch_to_numpy(value)
    return tensors


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A .safetensors file as numpy arrays; bfloat16, which numpy lacks, goes through torch."""
    import safetensors
    import safetensors.numpy
    try:
        try:
            return dict(safetensors.numpy.load_file(path))
        except (TypeError, ValueError):  # a dtype numpy lacks
            import safetensors.torch
            return {k: torch_to_numpy(v) for k, v in safetensors.torch.load_file(path).items()}
    except safetensors.SafetensorError as e:  # a plain Exception, not an InputError
        raise PortError(f"cannot read {path}: corrupt or truncated ({e})") from e


def torch_load(path: Path):
    try:
        import torch
    except ImportError as e:
        raise PortError(f"reading {path} needs torch (pip install '.[torch]')") from e
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # torch's message: many lines on weights_only=False
        raise PortError(f"cannot read {path}: corrupt or truncated, or a pickle that needs code "
                        "to load, which torch.load(weights_only=True) refuses") from e
    except Exception as e:  # a cut-off file: EOFError, OSError, RuntimeError, struct.error...
        raise PortError(f"cannot read {path}: corrupt or truncated ({first_sentence(e)})") from e


def first_sentence(error: Exception) -> str:
    """The start of an error's message, on one line: torch's run on for paragraphs."""
    lines = str(error).strip().splitlines()
    return lines[0].split(". ")[0].rstrip(".") if lines else type(error).__name__


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON file holding an object, or a PortError naming the file."""
    return text.read_json_object(path, PortError)


def read_mapping(path: str | Path) -> dict[str, Any]:
    """A --mapping JSON file: an object with any of a format's option fields."""
    try:
        spec = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise PortError(f"--mapping {path} is not valid JSON: {e}") from e
    if not isinstance(spec, dict):
        raise PortError(f"--mapping {path} must hold a JSON object")
    return spec


def torch_to_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if str(tensor.dtype) in ("torch.bfloat16", "torch.float16"):
        tensor = tensor.float()
    return tensor.numpy().copy()


class TensorConsumer:
    """Pops source tensors by name and reports the ones nobody asked for."""

    def __init__(self, tensors: Mapping[str, np.ndarray], source: str):
        self.tensors, self.source, self.used = dict(tensors), source, set()

    def __contains__(self, key):
        return key in self.tensors

    def take(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise PortError(f"{self.source} has no tensor {key!r}")
        self.used.add(key)
        return self.tensors[key]

    def take_tied(self, *candidates: str) -> np.ndarray:
        """One tied table, stored under any of `candidates`: the copies present must
        be equal (transformers 5 unties copies that differ, so a tied config would
        not describe the checkpoint)."""
        present = [k for k in candidates if k in self]
        if not present:
            raise PortError(f"{self.source} has none of {', '.join(candidates)}")
        table = self.take(present[0])
        for k in present[1:]:
            if not np.array_equal(self.take(k), table):
                raise PortError(f"{k} differs from {present[0]}, but the config says they "
                                "are one tied table")
        return table

    def ignore(self, key: str) -> None:
        self.used.add(key)

    def check_all_used(self, hint: str = "") -> None:
        left = sorted(set(self.tensors) - self.used)
        if left:
            raise PortError(f"{self.source} has tensors this converter does not understand: "
                            f"{listing(left)}{hint}")


def read_hf_weights(src_dir: Path) -> dict[str, np.ndarray]:
    """A Hugging Face model directory's weights: model.safetensors, its shards, or
    pytorch_model.bin."""
    if (src_dir / "model.safetensors").is_file():
        return read_weights(src_dir / "model.safetensors")
    index = src_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise PortError(f"{index} has no weight_map object")
        tensors = {}
        for shard in sorted(set(weight_map.values())):
            tensors.update(read_weights(src_dir / shard))
        return tensors
    if (src_dir / "pytorch_model.bin").is_file():
        return read_weights(src_dir / "pytorch_model.bin")
    raise PortError(f"{src_dir} has no model.safetensors, model.safetensors.index.json "
                    "or pytorch_model.bin")
