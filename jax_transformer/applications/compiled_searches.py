"""jaxformer-translate's JAX searches, compiled ahead of time and kept on disk.

A translate call that finds its searches here loads their executables and runs them
on the checkpoint's weights, read as numpy arrays: it imports no Flax, builds no model
and traces nothing, so its first line is answered about as soon as JAX is imported.
Each entry is one search (greedy, beam or sampling, with its settings) at one batch
shape and output length, compiled with the weights, the sources and the sampling
draws as its arguments (batch_search.run_search, the same function the live
model runs), and serialized with `jax.experimental.serialize_executable` into the
compilation cache's `searches/` folder. An entry's name hashes everything that fixes
its program: the model's config and dtype, the search's settings, the shapes, the
versions of JAX and of this package's code (its source files), the backend, the
device and the CPU's features. A missing entry is compiled (the Flax model built once
per process) and written; one that cannot be loaded is compiled again and replaced,
with a warning. Entries are executable code, trusted as the compilation cache is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import platform
import secrets
import sys
import threading
from pathlib import Path

import numpy as np

from jax_transformer.applications.batch_search import run_search
from transformer_core.config import TransformerConfig

FOLDER = "searches"  # under the compilation cache's directory
FORMAT = 1  # of an entry: a JSON header line (the weights to transpose), then the executable
PACKAGES = ("jax_transformer", "transformer_core")  # whose code the programs are made of


class CompiledSearches:
    """A checkpoint's searches, as translator.search_batch calls them: (B, S) sources ->
    tokens and scores as numpy arrays, shaped as run_search's. `tensors` are the checkpoint's,
    torch-named and torch-laid-out; `keep_in` the compilation cache's directory (None:
    compile each search once per process and keep none)."""

    def __init__(self, config: TransformerConfig, tensors: dict[str, np.ndarray],
                 keep_in: Path | None):
        self.config, self.keep_in = config, keep_in
        self.dtype = next(iter(tensors.values())).dtype  # as load_pretrained has it
        self.tensors = {key: value.astype(self.dtype, copy=False) for key, value in tensors.items()}
        self._programs: dict[str, object] = {}  # entry name -> an executable that ran
        self._weights = None  # on the device, Flax-laid-out, made at the first search
        self._model = None  # the Flax model, built at the first compile
        self._finding = threading.Lock()  # held while a program is loaded or compiled

    def __call__(self, src: np.ndarray, out_len: int, *, framework: str = "jax", beam: int,
                 alpha: float, sampling, length_penalty_style: str, forced):
        search = dict(beam=beam, sampling=sampling, length_penalty_style=length_penalty_style,
                      forced=forced)
        src = np.asarray(src, np.int32)
        traced = traced_settings(len(src), out_len, alpha=alpha, **search)
        name = self._entry_name(src.shape, out_len, search)

        def run(program):
            tokens, scores = program(self._weights, src, traced)
            self._programs[name] = program
            return np.asarray(tokens), np.asarray(scores)

        if name in self._programs:
            return run(self._programs[name])
        with self._finding:  # batches searched at once (translator.in_turn) load or compile once
            if name in self._programs:
                return run(self._programs[name])
            loaded = self._load(name, src, traced)
            if loaded is not None:
                try:
                    return run(loaded)
                except Exception as e:  # noqa: BLE001  (an entry that loads but cannot run)
                    print(f"warning: the compiled search {self._path(name)} could not run "
                          f"({type(e).__name__}: {e}); compiling it again", file=sys.stderr)
            return run(self._compile(name, src, out_len, search, traced))

    # ------------------------------------------------------------ entries

    def _entry_name(self, shape, out_len: int, search: dict) -> str:
        """The entry of this search (traced_settings aside) at this shape."""
        sampling = search["sampling"]
        fixed = dict(format=FORMAT, config=dataclasses.asdict(self.config), dtype=str(self.dtype),
                     shape=list(shape), out_len=out_len,
                     search={**search, "sampling": sampling and {  # the seed: only the draws
                         k: v for k, v in dataclasses.asdict(sampling).items() if k != "seed"}},
                     machine=machine(), code=code_fingerprint())
        digest = hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode())
        return f"translate-{digest.hexdigest()[:40]}"

    def _path(self, name: str) -> Path | None:
        return None if self.keep_in is None else Path(self.keep_in, FOLDER, name)

    def _load(self, name: str, src: np.ndarray, traced: dict):
        """The entry's executable, or None when there is none or it cannot be loaded."""
        path = self._path(name)
        if path is None or not path.is_file():
            return None
        try:
            header, payload = path.read_bytes().split(b"\n", 1)
            transposed = json.loads(header)["transposed"]
            self._place_weights(transposed)
            return _deserialize(payload, (self._weights, src, traced))
        except Exception as e:  # noqa: BLE001  (a damaged or foreign entry is compiled again)
            print(f"warning: the compiled search {path} could not be loaded "
                  f"({type(e).__name__}: {e}); compiling it again", file=sys.stderr)
            return None

    def _compile(self, name: str, src: np.ndarray, out_len: int, search: dict, traced: dict):
        """The search compiled for this shape, written as entry `name` when kept."""
        import jax
        from flax import nnx

        from jax_transformer.model import Transformer
        from jax_transformer.pretrained import from_tensors
        from transformer_core.checkpoint_dir import flax_path_to_torch_key

        if self._model is None:
            self._model = from_tensors(Transformer, self.config, self.tensors)
        graphdef, params, rest = nnx.split(nnx.view(self._model, deterministic=True), nnx.Param,
                                           ...)
        flat = nnx.to_flat_state(params)
        names = [flax_path_to_torch_key(path) for path, _ in flat]  # (torch key, transposed)
        self._place_weights([key for key, transposed in names if transposed])

        def program(weights, src, traced):  # the weights Flax-laid-out, by torch key
            state = nnx.from_flat_state([(path, variable.replace(weights[key]))
                                         for (path, variable), (key, _) in zip(flat, names)])
            model = nnx.merge(graphdef, state, rest)
            return run_search(model, src, out_len, framework="jax", **search, **traced)

        with persistent_cache_off(when=self.keep_in is not None):
            compiled = jax.jit(program).lower(self._weights, src, traced).compile()
        self._write(name, compiled, [key for key, transposed in names if transposed])
        return compiled

    def _write(self, name: str, compiled, transposed: list[str]) -> None:
        """Keep `compiled` as entry `name`, written whole or not at all; a folder that cannot
        be written keeps nothing (use_compilation_cache has said so for a read-only cache)."""
        from jax.experimental import serialize_executable

        path = self._path(name)
        if path is None:
            return
        try:
            payload, _, _ = serialize_executable.serialize(compiled)
        except (ValueError, NotImplementedError) as e:  # this JAX cannot: compile every call
            print(f"warning: this JAX cannot keep compiled searches ({e}); each translate "
                  "call compiles its searches", file=sys.stderr)
            return
        tmp = path.with_name(f".{name}.{secrets.token_hex(4)}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(json.dumps({"transposed": transposed}).encode() + b"\n" + payload)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)

    def _place_weights(self, transposed: list[str]) -> None:
        """The weights on the device, Flax-laid-out (a Linear's (out, in) as (in, out)), once."""
        if self._weights is None:
            import jax

            transposed = set(transposed)
            self._weights = jax.device_put({
                key: np.ascontiguousarray(value.T) if key in transposed else value
                for key, value in self.tensors.items()})


def _deserialize(payload: bytes, args: tuple):
    """The executable of `payload`, called with arguments like `args` (weights, sources,
    traced settings), whose tree it takes."""
    import jax
    from jax.experimental import serialize_executable

    in_tree = jax.tree.structure((args, {}))
    out_tree = jax.tree.structure((0, 0))  # tokens, scores
    return serialize_executable.deserialize_and_load(payload, in_tree, out_tree)


def traced_settings(rows: int, out_len: int, *, beam: int, alpha: float, sampling, **_) -> dict:
    """The search's settings that are arguments of its program, not part of it, as the
    model's searches trace them: beam search's alpha, sampling's draws (`rows` x
    `out_len`, from its seed). A float is held as JAX holds a Python float (float32
    unless x64 is on)."""
    import jax

    dtype = jax.dtypes.canonicalize_dtype(np.float64)
    if sampling is not None and not sampling.greedy:
        return {"uniforms": sampling.uniforms(rows, out_len).astype(dtype)}
    if sampling is not None:
        return {}
    return {"alpha": np.asarray(alpha, dtype)} if beam > 1 else {}


@contextlib.contextmanager
def persistent_cache_off(when: bool):
    """JAX's persistent compilation cache off for the compiles inside (`when`): an
    executable that cache loaded serializes without its code (jax 0.10.2 on the CPU: "Function
    ... not found" when the entry runs), so an executable to keep is compiled afresh."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    was_on = jax.config.jax_enable_compilation_cache
    if not (when and was_on):
        yield
        return
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once whether it uses the cache
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", True)
        compilation_cache.reset_cache()


def machine() -> dict:
    """What a compiled program is bound to besides its source: JAX, the backend and
    device, the settings that change a program, and the CPU (its instruction set)."""
    import jax
    import jaxlib

    device = jax.devices()[0]
    return dict(jax=jax.__version__, jaxlib=jaxlib.__version__, backend=jax.default_backend(),
                platform_version=device.client.platform_version, device=device.device_kind,
                x64=jax.config.jax_enable_x64,
                matmul_precision=str(jax.config.jax_default_matmul_precision),
                xla_flags=os.environ.get("XLA_FLAGS", ""), cpu=platform.machine(),
                cpu_features=_cpu_features())


@functools.cache
def _cpu_features() -> str:
    """The CPU's feature flags (Linux), hashed; empty elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


@functools.cache
def code_fingerprint() -> str:
    """A hash of this package's source files: another version of the searches' code
    (an upgrade, an edit) makes other entries."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for package in PACKAGES:
        for path in sorted(Path(root, package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]
