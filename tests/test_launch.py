"""jaxformer-launch: N processes of one command as one JAX job on this machine (children
here are small Python scripts, not JAX)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

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


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie no one has reaped yet counts)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def child_pids(stderr_path) -> list[int]:
    """The pids the launcher announced on its stderr (a file), once both are there."""
    deadline = time.time() + 30
    while time.time() < deadline:
        pids = [int(line.rsplit(" ", 1)[1]) for line in stderr_path.read_text().splitlines()
                if line.startswith("[launch] process ") and ": pid " in line]
        if len(pids) == 2:
            return pids
        time.sleep(0.05)
    raise AssertionError(stderr_path.read_text())


def end(*pids: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_closed_output_ends_the_launcher_and_its_processes(tmp_path):
    """`jaxformer-launch -n 2 -- CMD | head -1`. Before: the relay thread died with
    BrokenPipeError, the process blocked writing to its pipe, the launcher waited for
    ever."""
    err = tmp_path / "err"
    with err.open("w") as stderr:
        process = subprocess.Popen([*LAUNCH, "-n", "2", *python(
            "while True: print('y' * 80, flush=True)")], cwd=REPO_ROOT,
            stdout=subprocess.PIPE, stderr=stderr)
    pids = child_pids(err)
    try:
        assert process.stdout.readline().endswith(b"y\n")
        process.stdout.close()
        assert process.wait(timeout=30) == 128 + signal.SIGPIPE, err.read_text()
        assert all(gone(pid) for pid in pids)
        assert "Traceback" not in err.read_text()
    finally:
        end(process.pid, *pids)


def test_ctrl_c_reaches_each_process_once_through_the_launcher():
    """Ctrl-C: SIGINT to the launcher's process group. Before: each process got it from
    the terminal and again from the launcher (and train.py takes a second SIGINT for
    "stop now, without saving")."""
    wait = ("import os, signal\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})\n"
            "print('ready', flush=True)\n"
            "sender = signal.sigwaitinfo({signal.SIGINT}).si_pid\n"
            "print('from the launcher' if sender == os.getppid() else f'from {sender}')\n"
            "print('again' if signal.sigtimedwait({signal.SIGINT}, 1) else 'once')")
    process = subprocess.Popen([*LAUNCH, "-n", "2", *python(wait)], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)  # its group: a terminal's foreground
    try:
        ready = [process.stdout.readline() for _ in range(2)]
        assert sorted(ready) == ["[p0] ready\n", "[p1] ready\n"], ready
        os.killpg(process.pid, signal.SIGINT)
        out, _ = process.communicate(timeout=30)
        assert sorted(out.splitlines()) == ["[p0] from the launcher", "[p0] once",
                                            "[p1] from the launcher", "[p1] once"]
    finally:
        end(process.pid)


def test_the_processes_die_with_a_killed_launcher(tmp_path):
    """`kill -9` of the launcher. Before: both processes ran on (a train.py among them
    holding the work directory's lock)."""
    err = tmp_path / "err"
    with err.open("w") as stderr:
        process = subprocess.Popen([*LAUNCH, "-n", "2", *python("import time; time.sleep(60)")],
                                   cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=stderr)
    pids = child_pids(err)
    try:
        process.kill()
        process.wait(timeout=10)
        deadline = time.time() + 10
        while not all(gone(pid) for pid in pids) and time.time() < deadline:
            time.sleep(0.05)
        assert all(gone(pid) for pid in pids), [pid for pid in pids if not gone(pid)]
    finally:
        end(*pids)


@pytest.mark.slow  # imports JAX
def test_the_coordinator_listens_on_127_0_0_1_only():
    """The coordination service takes unauthenticated writes. Before: it listened on
    every interface (`[::]:PORT`), open to anyone who reaches the host."""
    result = launch("-n", "1", *python(
        "import os, jax\n"
        "jax.distributed.initialize(num_processes=1, process_id=0)\n"
        "port = os.environ['JAX_COORDINATOR_ADDRESS'].rsplit(':', 1)[1]\n"
        "for table in ('/proc/net/tcp', '/proc/net/tcp6'):\n"
        "    for row in open(table).read().splitlines()[1:]:\n"
        "        local, state = row.split()[1], row.split()[3]\n"
        "        address, hex_port = local.split(':')\n"
        "        if state == '0A' and int(hex_port, 16) == int(port):\n"
        "            print('listening on', address)\n"
        "jax.distributed.shutdown()"))
    assert result.returncode == 0, result.stderr
    addresses = {line.split()[-1] for line in result.stdout.splitlines()}
    # 127.0.0.1 in /proc/net/tcp's hex, as IPv4 or as IPv4-mapped IPv6 (gRPC's choice)
    assert addresses and addresses <= {"0100007F", "0000000000000000FFFF00000100007F"}, \
        result.stdout
