"""The console scripts pyproject.toml installs: each is on PATH beside the interpreter and
does what its `python -m jax_transformer.commands.X` form does."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
BIN = Path(sys.executable).parent


def run(argv, **kwargs):
    return subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_every_command_module_has_a_script():
    commands = {p.stem for p in (ROOT / "jax_transformer" / "commands").glob("*.py")} - {
        "__init__", "exit_codes", "parsing"}
    assert {target.split(":")[0].rpartition(".")[2] for target in SCRIPTS.values()} == commands
    assert all(name == "jaxformer-" + target.split(":")[0].rpartition(".")[2].replace("_", "-")
               for name, target in SCRIPTS.items())


# A subprocess each: the fast tier starts one script, the full suite every one.
@pytest.mark.parametrize("name", [pytest.param(name, marks=() if name == "jaxformer-train"
                                               else pytest.mark.slow) for name in sorted(SCRIPTS)])
def test_a_script_gives_its_module_s_help_and_errors(name, tmp_path):
    module = SCRIPTS[name].split(":")[0]
    assert (BIN / name).is_file(), f"{name} is not installed: pip install -e ."
    for argv in (["--help"], ["--no-such-flag"]):
        script, as_module = run([BIN / name, *argv]), run([sys.executable, "-m", module, *argv])
        assert (script.returncode, script.stdout, script.stderr) == (
            as_module.returncode, as_module.stdout, as_module.stderr), argv
        assert script.returncode == (0 if argv == ["--help"] else 2)


def test_a_script_gives_its_module_s_result(tmp_path):
    """jaxformer-natural-corpus (no JAX, so quick) writes what its module writes."""
    args = ["--pairs", "20", "--seed", "3", "--out-dir"]
    assert run([BIN / "jaxformer-natural-corpus", *args, tmp_path / "a"]).returncode == 0
    assert run([sys.executable, "-m", "jax_transformer.commands.natural_corpus", *args,
                tmp_path / "b"]).returncode == 0
    for name in ("train.src", "train.tgt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_train_py_is_jaxformer_train():
    script, legacy = run([BIN / "jaxformer-train", "--help"]), run([sys.executable, "train.py",
                                                                    "--help"])
    assert script.returncode == legacy.returncode == 0 and script.stdout == legacy.stdout
