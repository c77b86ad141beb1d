"""Every command line: bad input is one `error: ...` line and exit code 2."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jax_transformer.train.runtime import signals
from jax_transformer.commands import exit_codes
from tests.train.runs import TINY
from transformer_core.errors import RunFailed
from transformer_core.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("raised, code", [
    (ConfigError("d_model must be a positive integer"), 2),
    (FileNotFoundError("no such file: x.txt"), 2),
    (RunFailed("loss nan at step 3"), 1),
    (signals.Interrupted("interrupted: saved step 4"), 130),
])
def test_outcomes_become_exit_codes_and_one_line(capsys, raised, code):
    def main(argv):
        raise raised
    before = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    try:
        assert exit_codes.run(main, []) == code
        after = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    finally:
        signals.set_stop_handlers(before)
    err = capsys.readouterr().err
    assert err.strip() == (f"error: {raised}" if code in (1, 2) else str(raised))
    # After a stop the process is exiting: a repeated signal must not meet the
    # default handler (SIGTERM's kills the process with -15, not 143).
    assert (after == before) == (code in (1, 2))


def test_bugs_are_not_hidden():
    def main(argv):
        raise ZeroDivisionError("a bug")
    with pytest.raises(ZeroDivisionError):
        exit_codes.run(main, [])


def write_bad_files(tmp: Path) -> None:
    """What the bad-input cases below point at: {tmp} in a command is this folder."""
    (tmp / "good.json").write_text("{}")
    (tmp / "typo.json").write_text('{"dropout": "0.1"}')
    (tmp / "cut.safetensors").write_bytes(b'\x40\0\0\0\0\0\0\0{"a":')  # header cut off
    checkpoint = tmp / "ckpt"  # a string "false" must not load as a pre-norm model
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"pre_norm": "false"}')
    for name in ("model.safetensors", "tokenizer.model"):
        (checkpoint / name).write_bytes(b"")


@pytest.mark.slow
@pytest.mark.parametrize("command, message", [
    (["train.py", "--src-path", "missing.en", "--tgt-path", "missing.de", "--quiet"],
     "missing.en"),
    (["-m", "jax_transformer.commands.translate", "--checkpoint", "missing"], "missing"),
    (["-m", "jax_transformer.commands.translate", "--checkpoint", "missing", "--output",
      "{tmp}/missing/out.txt"], "error: --output {tmp}/missing/out.txt"),
    (["-m", "jax_transformer.commands.translate", "--checkpoint", "{tmp}/ckpt"],
     "{tmp}/ckpt/config.json: pre_norm must be a boolean"),
    (["-m", "jax_transformer.commands.port", "--from", "hf-marian", "missing", "out"], "missing"),
    (["-m", "jax_transformer.commands.port", "--from", "torch-reference", "{tmp}/cut.safetensors",
      "{tmp}/out", "--config", "{tmp}/good.json"],
     "cannot read {tmp}/cut.safetensors: corrupt or truncated"),
    (["-m", "jax_transformer.commands.port", "--from", "torch-reference", "{tmp}/cut.safetensors",
      "{tmp}/out", "--config", "{tmp}/typo.json"],
     "{tmp}/typo.json: dropout must be a number, got '0.1' (str)"),
    (["-m", "jax_transformer.commands.parity", "missing"], "missing"),
    (["-m", "jax_transformer.commands.parity", "{tmp}/ckpt"],
     "{tmp}/ckpt/config.json: pre_norm must be a boolean"),
])
def test_every_command_line_reports_bad_input_the_same_way(tmp_path, command, message):
    write_bad_files(tmp_path)
    command = [part.format(tmp=tmp_path) for part in command]
    result = subprocess.run([sys.executable, *command, *(
        ["--workdir", str(tmp_path)] if command[0] == "train.py" else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message.format(tmp=tmp_path) in last, last
    assert "Traceback" not in result.stderr


COMMANDS = {"jaxformer-train": ["train.py"],
            **{f"jaxformer-{name.replace('_', '-')}": ["-m", f"jax_transformer.commands.{name}"]
               for name in ("translate", "generate", "port", "parity", "prepare",
                            "natural_corpus", "launch")}}


@pytest.mark.slow
@pytest.mark.parametrize("prog", COMMANDS)
def test_a_bad_flag_is_one_error_line_and_a_hint(prog):
    """Before: argparse printed the usage first, 48 lines of it for train.py, then
    `jaxformer-train: error: argument --seed: invalid int value: 'x'`."""
    flag = {"jaxformer-translate": "--beam", "jaxformer-port": "--step",
            "jaxformer-launch": "--num-processes"}.get(prog, "--seed")
    result = subprocess.run([sys.executable, *COMMANDS[prog], flag, "x"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    shown = "-n/--num-processes" if prog == "jaxformer-launch" else flag
    assert result.stderr.splitlines() == [f"error: argument {shown}: invalid int value: 'x'",
                                          f"see {prog} --help"]


@pytest.mark.slow
@pytest.mark.parametrize("command, message", [
    (["train.py", "--workdir", "{tmp}/run", *TINY, "--steps", "1", "--init-from", ""],
     ["error: --init-from is an empty path (an unset shell variable?)"]),
    (["-m", "jax_transformer.commands.translate", "--checkpoint", "{tmp}/ckpt", "--input", ""],
     ["error: argument --input: an empty path (an unset shell variable?)",
      "see jaxformer-translate --help"]),
    (["-m", "jax_transformer.commands.port", "--from", "hf-marian", "", "{tmp}/out"],
     ["error: argument src: an empty path (an unset shell variable?)",
      "see jaxformer-port --help"]),
])
def test_an_empty_path_is_refused(tmp_path, command, message):
    """Before: `--init-from ''` (an unset variable) trained from scratch, `--input ''` read
    stdin, and port's SRC '' was the current directory."""
    write_bad_files(tmp_path)
    result = subprocess.run([sys.executable, *[part.format(tmp=tmp_path) for part in command]],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.splitlines() == message
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()
