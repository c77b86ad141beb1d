"""The layout's promises: a neutral core, commands on top of libraries, no import cycles
(between modules or folders, lazy imports included), no test module imported by another
module, functions that fit a screen, modules short enough to read (in benchmarks/, a
warning), and a train/ whose top a reader takes in at a glance."""

import ast
import subprocess
import sys
import warnings
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transformer_core", "jax_transformer", "torch_reference")
TEST_FOLDERS = ("tests", "parity_tests")
COMMANDS = "jax_transformer.commands"
MAX_LINES = 400  # a module's: over it, a failure in PACKAGES, a warning in benchmarks/
# Longer modules of PACKAGES, each with the reason it stays whole.
LONG_MODULES: dict[str, str] = {}
TRAIN = ROOT / "jax_transformer" / "train"
MAX_TRAIN_MODULES = 12  # at train/'s top, besides __init__.py; subpackages are folders
MAX_FUNCTION_LINES = 60  # a function's or method's, its docstring not counted
# Longer functions, each with the reason it stays whole.
LONG_FUNCTIONS = {
    "jax_transformer.port.torch_nn.torch_nn_transformer_tensors":
        "a table: one line per torch.nn.Transformer tensor and its name in ours",
    "jax_transformer.port.torch_nn_encoder.torch_nn_encoder_tensors":
        "a table: one line per torch.nn.TransformerEncoder tensor and its name in ours",
}


def modules(folders=PACKAGES) -> dict[str, Path]:
    found = {}
    for package in folders:
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


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, name, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(name, chain):
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                return chain[chain.index(target):] + [target]
            if target not in state and (cycle := visit(target, chain + [target])):
                return cycle
        state[name] = "done"

    for name in sorted(graph):
        if name not in state and (cycle := visit(name, [name])):
            return cycle
    return None


def folder(path: Path) -> str:
    """The folder a module file lives in, dotted: jax_transformer/train/step.py and
    jax_transformer/train/__init__.py -> jax_transformer.train."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def test_no_import_cycles_between_modules_or_folders():
    graph, known = import_graph(), modules()
    assert "jax_transformer.model" in graph["jax_transformer.train.step"]  # the graph is real
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    folders: dict[str, set[str]] = {}
    for name, targets in graph.items():
        here = folder(known[name])
        folders.setdefault(here, set()).update(
            t for t in (folder(known[t]) for t in targets) if t != here)
    assert find_cycle(folders) is None, "folders import in a cycle: " + " -> ".join(
        find_cycle(folders))


def test_the_cycle_checks_can_fail():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert folder(ROOT / "jax_transformer" / "port" / "__init__.py") == "jax_transformer.port"
    assert folder(ROOT / "jax_transformer" / "model.py") == "jax_transformer"


def test_no_library_module_imports_a_command():
    """Commands sit on top: nothing in the packages below imports one, lazily or not."""
    for name, targets in import_graph().items():
        if not name.startswith(COMMANDS):
            assert not {t for t in targets if t.startswith(COMMANDS)}, name


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


def imported_test_modules(known: dict[str, Path]) -> dict[str, list[str]]:
    """Each module of `known` that imports test modules (test_*.py), at any depth of its
    code -> those it imports."""
    tests = {name for name, path in known.items() if path.name.startswith("test_")}
    found = {name: sorted(imports(path, name, known) & tests) for name, path in known.items()}
    return {name: targets for name, targets in found.items() if targets}


def test_no_module_imports_a_test_module():
    """Tests and benchmarks share code through conftest.py and the helpers modules, so a
    test module is imported by none: not by another test, a benchmark or a library."""
    known = modules(PACKAGES + TEST_FOLDERS + ("benchmarks",))
    assert "parity_tests.test_port" in known and "benchmarks.bench_init_from" in known
    found = imported_test_modules(known)
    assert not found, f"test modules imported (share through conftest.py or helpers): {found}"


def test_the_test_module_check_can_fail(tmp_path):
    sources = {"tests.test_a": "X = 1\n",
               "tests.test_b": "def f():\n    from tests.test_a import X\n",  # lazily
               "benchmarks.bench": "from tests import test_a\n",
               "tests.helpers": "X = 1\n", "tests.test_c": "from tests.helpers import X\n"}
    known = {name: tmp_path / f"{name.replace('.', '/')}.py" for name in sources}
    for name, path in known.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(sources[name])
    assert imported_test_modules(known) == {"tests.test_b": ["tests.test_a"],
                                            "benchmarks.bench": ["tests.test_a"]}


def function_lengths(source: str, module: str) -> dict[str, int]:
    """Every function's and method's length in lines, its docstring left out, by its
    dotted name (module.Class.method)."""
    lengths = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                doc = child.body[0] if (isinstance(child.body[0], ast.Expr) and isinstance(
                    child.body[0].value, ast.Constant) and isinstance(
                    child.body[0].value.value, str)) else None
                lines = child.end_lineno - child.lineno + 1
                lengths[name] = lines - (doc.end_lineno - doc.lineno + 1 if doc else 0)
                visit(child, name)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")

    visit(ast.parse(source), module)
    return lengths


def test_functions_fit_a_screen():
    long = {}
    for name, path in modules(PACKAGES + ("benchmarks",)).items():
        long |= {function: n for function, n in function_lengths(path.read_text(), name).items()
                 if n > MAX_FUNCTION_LINES and function not in LONG_FUNCTIONS}
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (docstrings left out): {long}"
    assert set(LONG_FUNCTIONS) <= {f for name, path in modules().items()
                                   for f, n in function_lengths(path.read_text(), name).items()
                                   if n > MAX_FUNCTION_LINES}, "an allowed function got short"


def test_the_function_length_check_can_fail():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    source = f'class A:\n    def f(self):\n        """Doc."""\n{body}\n        return 0\n'
    source = source.replace("\n    x", "\n        x")
    assert function_lengths(source, "m") == {"m.A.f": MAX_FUNCTION_LINES + 2}


def long_modules(known: dict[str, Path]) -> dict[str, int]:
    """Each module of `known` over MAX_LINES lines -> its length."""
    return {name: n for name, path in known.items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}


def test_modules_are_short_enough_to_read():
    long = long_modules(modules())
    assert not {name: n for name, n in long.items() if name not in LONG_MODULES}, (
        f"modules over {MAX_LINES} lines (split by concept): {long}")
    assert set(LONG_MODULES) <= set(long), "an allowed module got short"
    benchmarks = long_modules(modules(("benchmarks",)))
    if benchmarks:
        warnings.warn(f"benchmarks over {MAX_LINES} lines (split by concept, if one is "
                      f"hiding in there): {benchmarks}")


def test_the_module_length_check_can_fail(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert long_modules({"long": tmp_path / "long.py", "short": tmp_path / "short.py"}) == {
        "long": MAX_LINES + 1}


def top_modules(folder: Path) -> list[str]:
    """The modules directly in `folder`, its __init__.py left out."""
    return sorted(path.stem for path in folder.glob("*.py") if path.name != "__init__.py")


def test_train_has_at_most_12_modules_at_its_top():
    """A reader looking for a concept in train/ scans its top: the run, the loop, the
    export, the step, ...; the rest is grouped in folders (settings/, tasks/, runtime/,
    records/)."""
    found = top_modules(TRAIN)
    assert "run" in found and len(found) <= MAX_TRAIN_MODULES, (
        f"train/ has {len(found)} modules at its top (at most {MAX_TRAIN_MODULES}): {found}")


def test_the_train_module_count_can_fail(tmp_path):
    for name in ["__init__", *(f"m{i}" for i in range(MAX_TRAIN_MODULES + 1))]:
        (tmp_path / f"{name}.py").write_text("")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "inner.py").write_text("")
    assert len(top_modules(tmp_path)) == MAX_TRAIN_MODULES + 1
