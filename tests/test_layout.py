"""The layout's promises: a neutral core, no import cycles, small modules."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transformer_core", "jax_transformer", "torch_reference")
MAX_LINES = 400


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """Project modules that `path` (module `name`) imports, at any depth of its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # `from pkg import sub` imports the submodule pkg.sub when there is one
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names}
    return {m for m in found if m in known and m != name}


def test_no_import_cycles():
    known = modules()
    graph = {name: imports(path, name, known) for name, path in known.items()}
    state: dict[str, str] = {}

    def visit(name, chain):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycle = chain[chain.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, chain + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert "jax_transformer.model" in graph["jax_transformer.train.step"]  # the graph is real


def test_the_core_imports_neither_framework_and_torch_reference_no_jax_transformer():
    known = modules()
    for name, path in known.items():
        targets = imports(path, name, known)
        if name.startswith("torch_reference"):
            assert not {t for t in targets if t.startswith("jax_transformer")}, name
        if name.startswith("transformer_core"):
            assert not {t for t in targets if not t.startswith("transformer_core")}, name
    script = ("import sys\n"
              "sys.modules['jax'] = sys.modules['torch'] = None\n"
              "import transformer_core, transformer_core.checkpoint_dir, "
              "transformer_core.positions, transformer_core.tokenizer\n")
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True)


def test_modules_stay_short():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
