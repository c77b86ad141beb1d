"""Every command line: bad input is one `error: ...` line and exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from jax_transformer import cli
from transformer_core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("raised, code", [
    (ConfigError("d_model must be a positive integer"), 2),
    (FileNotFoundError("no such file: x.txt"), 2),
    (cli.RunFailed("loss nan at step 3"), 1),
    (cli.Interrupted("interrupted: saved step 4"), 130),
])
def test_outcomes_become_exit_codes_and_one_line(capsys, raised, code):
    def main(argv):
        raise raised
    assert cli.run(main, []) == code
    err = capsys.readouterr().err
    assert err.strip() == (f"error: {raised}" if code in (1, 2) else str(raised))


def test_bugs_are_not_hidden():
    def main(argv):
        raise ZeroDivisionError("a bug")
    with pytest.raises(ZeroDivisionError):
        cli.run(main, [])


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    ["train.py", "--src-path", "missing.en", "--tgt-path", "missing.de", "--quiet"],
    ["-m", "jax_transformer.translate", "--checkpoint", "missing"],
    ["-m", "jax_transformer.port", "--from", "hf-marian", "missing", "out"],
    ["-m", "jax_transformer.parity", "missing"],
])
def test_every_command_line_reports_bad_input_the_same_way(tmp_path, command):
    result = subprocess.run([sys.executable, *command, *(
        ["--workdir", str(tmp_path)] if command[0] == "train.py" else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in result.stderr
