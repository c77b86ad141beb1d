"""jaxformer-launch: N processes of one command as one JAX job on this machine (children
here are small Python scripts, not JAX)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.train.runs import REPO_ROOT

LAUNCH = [sys.executable, "-m", "jax_transformer.commands.launch"]


def launch(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*LAUNCH, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=timeout)


def python(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def test_each_process_gets_its_place_in_the_job_and_a_prefix():
    result = launch("-n", "2", "--cpu-devices", "3", *python(
        "import os; e = os.environ; print(e['JAX_PROCESS_ID'], e['JAX_NUM_PROCESSES'], "
        "e['JAX_COORDINATOR_ADDRESS'], e['JAX_NUM_CPU_DEVICES'], e['JAX_PLATFORMS'])"))
    assert result.returncode == 0, result.stderr
    lines = sorted(result.stdout.splitlines())
    assert [line.split()[:3] for line in lines] == [["[p0]", "0", "2"], ["[p1]", "1", "2"]]
    addresses = {line.split()[3] for line in lines}
    assert len(addresses) == 1 and addresses.pop().startswith("127.0.0.1:")
    assert all(line.split()[4:] == ["3", "cpu"] for line in lines)


def test_a_failure_ends_the_others_after_the_grace_and_gives_its_exit_code():
    started = time.time()
    result = launch("-n", "2", "--grace", "1", *python(
        "import os, sys, time\n"
        "if os.environ['JAX_PROCESS_ID'] == '1': print('failing', file=sys.stderr); sys.exit(3)\n"
        "time.sleep(60)"))
    assert result.returncode == 3, result.stderr
    assert time.time() - started < 30
    assert "[p1] failing" in result.stderr.splitlines()
    assert "[launch] process 1 exited with code 3; the others get 1 s to end" in result.stderr
    assert "[launch] process 0 is still running 1 s later: killed" in result.stderr


def test_sigterm_reaches_every_process():
    process = subprocess.Popen([*LAUNCH, "-n", "2", *python(
        "import os, signal, sys, time\n"
        "def stop(signum, frame): print('stopped', flush=True); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)")], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    ready = [process.stdout.readline() for _ in range(2)]
    assert sorted(ready) == ["[p0] ready\n", "[p1] ready\n"], ready
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 143
    assert sorted(out.splitlines()) == ["[p0] stopped", "[p1] stopped"]


def test_a_process_a_signal_kills_exits_as_a_shell_reports_it():
    result = launch("-n", "1", *python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert result.returncode == 128 + signal.SIGKILL, result.stderr


def test_a_missing_command_is_one_error_line():
    result = launch("-n", "2")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: no command to run: give it after --, e.g. jaxformer-launch -n 2 -- python "
        "train.py --distributed"]
