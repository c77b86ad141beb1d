"""train.py where its surroundings fail it, met as a user meets them (a real train.py
process each): no coordinator for --distributed, another device count on resume, a
damaged or read-only compilation cache, a full disk, checkpoints made read-only. Each
ends in one clear line (or runs on with at most one warning line), never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jax_transformer.commands.launch import free_port
from tests.train.runs import REPO_ROOT, TINY, losses

pytestmark = pytest.mark.slow  # train.py subprocesses
ENV = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
# What jax.distributed.initialize() reads to find its coordinator and peers.
CLUSTER_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                     "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri",
                     "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID")


def train(workdir, *flags, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *TINY, *flags],
                          cwd=REPO_ROOT, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_error_line(result, code: int, *parts: str) -> str:
    """Exit `code`, no traceback, and the last line of stderr the one `error:` line."""
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
    for part in parts:
        assert part in lines[-1], lines[-1]
    return lines[-1]


@pytest.mark.parametrize("address, missing", [
    (None, "found no coordinator address: give --coordinator-address or set "
           "JAX_COORDINATOR_ADDRESS"),
    ("127.0.0.1:1", "found no number of processes: give --num-processes or set "
                    "JAX_NUM_PROCESSES"),
])
def test_distributed_without_a_coordinator_names_what_is_missing(tmp_path, address, missing):
    """Before: `ValueError: coordinator_address should be defined.` (a traceback, exit 1)."""
    env = {k: v for k, v in ENV.items() if k not in CLUSTER_VARIABLES}
    if address:
        env["JAX_COORDINATOR_ADDRESS"] = address
    result = train(tmp_path / "run", "--distributed", "--steps", "1", env=env)
    assert_one_error_line(result, 2, "error: --distributed: jax.distributed.initialize() "
                          + missing, "run without --distributed")


@pytest.mark.parametrize("flag, variable, address", [
    ("--coordinator-address", None, "garbage"),  # Before: IndexError (a traceback)
    ("--coordinator-address", None, "localhost:notaport"),  # Before: a segfault, exit -11
    (None, "JAX_COORDINATOR_ADDRESS", "10.0.0.1:99999"),
])
def test_a_coordinator_address_that_is_not_host_port_names_its_source(
        tmp_path, flag, variable, address):
    """Before: `IndexError: list index out of range` from JAX (garbage), a segmentation
    fault after `Failed to add port to server` (localhost:notaport)."""
    env = {k: v for k, v in ENV.items() if k not in CLUSTER_VARIABLES}
    flags = [flag, address] if flag else []
    if variable:
        env[variable] = address
    result = train(tmp_path / "run", "--distributed", *flags, "--num-processes", "2",
                   "--process-id", "0", env=env, timeout=60)
    assert_one_error_line(result, 2, f"error: {flag or variable} must be HOST:PORT, with a "
                                     f"port from 1 to 65535 (e.g. 10.0.0.1:1234), got "
                                     f"{address!r}")


@pytest.mark.parametrize("seconds", ["inf", "1e12"])
def test_a_peer_timeout_beyond_a_day_is_refused(tmp_path, seconds):
    """Before: it passed the check, then `OverflowError: cannot convert float infinity to
    integer` (inf) or a TypeError from JAX's service (1e12), each a traceback."""
    result = train(tmp_path / "run", "--distributed", "--coordinator-address",
                   f"127.0.0.1:{free_port()}", "--num-processes", "1", "--process-id", "0",
                   "--peer-timeout", seconds, timeout=60)
    assert_one_error_line(result, 2, "error: --peer-timeout must be positive and at most "
                                     f"86400 (seconds, a day), got {float(seconds)}")


def listening(port: int) -> set[str]:
    """The addresses a socket listens on at `port`, as /proc/net/tcp{,6} write them."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_joining_says_what_it_waits_for_and_gives_up_at_the_join_timeout(tmp_path):
    """Process 0 of 2, whose peer never comes, on 127.0.0.1. Before: silent for JAX's
    300 s start-up timeout, then an abort with a stack trace; and its coordinator
    listened on every interface (`[::]:PORT`)."""
    port = free_port()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "train.py", "--workdir", str(tmp_path / "run"), *TINY, "--distributed",
         "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
         "--process-id", "0", "--join-timeout", "8"], cwd=REPO_ROOT, env=ENV,
        stderr=subprocess.PIPE, text=True)
    try:
        waiting = process.stderr.readline()
        assert waiting == ("--distributed: waiting for the other processes of the run to "
                           f"connect to its coordinator at 127.0.0.1:{port}, for up to 8 s "
                           "(--join-timeout)\n"), waiting
        assert time.monotonic() - started < 30
        # 127.0.0.1 in /proc/net/tcp's hex, as IPv4 or as IPv4-mapped IPv6 (gRPC's choice)
        assert listening(port) <= {"0100007F", "0000000000000000FFFF00000100007F"}
        assert listening(port)
        rest = process.communicate(timeout=60)[1]
    finally:
        process.kill()
    assert_one_error_line(subprocess.CompletedProcess(process.args, process.returncode, "",
                                                      waiting + rest), 2,
                          "error: --distributed: gave up waiting for the other processes of "
                          "the run to connect to its coordinator at 127.0.0.1:", "after 8 s "
                          "(--join-timeout): are all processes started")


def test_a_process_whose_coordinator_never_comes_gives_up_at_the_join_timeout(tmp_path):
    """Process 1 of 2, nothing at 127.0.0.1:1. Before: silent for 300 s, then `F... Terminating
    process because the JAX distributed service detected fatal errors ... DEADLINE_EXCEEDED`
    and a stack trace (exit 134)."""
    started = time.monotonic()
    result = train(tmp_path / "run", "--distributed", "--coordinator-address", "127.0.0.1:1",
                   "--num-processes", "2", "--process-id", "1", "--join-timeout", "4",
                   timeout=60)
    assert time.monotonic() - started < 40
    assert result.stderr.startswith("--distributed: waiting for process 0's coordinator at "
                                    "127.0.0.1:1 (and through it, the run's other processes), "
                                    "for up to 4 s (--join-timeout)\n"), result.stderr
    assert_one_error_line(result, 2, "error: --distributed: gave up waiting for process 0's "
                                     "coordinator at 127.0.0.1:1")


@pytest.mark.parametrize("variable, value, says", [
    ("JAX_NUM_CPU_DEVICES", "abc", "is not a value JAX takes"),
    ("JAX_ENABLE_X64", "maybe", "is not a value JAX takes"),
    ("JAX_PLATFORMS", "bogus", "names platforms JAX cannot start here"),  # RuntimeError
    pytest.param("JAX_PLATFORMS", "cuda", "names platforms JAX cannot start here", marks=pytest.mark.skipif(
        Path("/proc/driver/nvidia").exists(), reason="an NVIDIA GPU serves cuda here")),
])
def test_a_jax_variable_jax_cannot_use_is_one_line_naming_it(tmp_path, variable, value, says):
    """Before: a traceback through JAX's import or backends, exit 1: `ValueError: Invalid
    value "abc" for JAX flag jax_num_cpu_devices`, `ValueError: invalid truth value 'maybe'
    for environment 'JAX_ENABLE_X64'`, `RuntimeError: Unable to initialize backend
    'bogus'`, a bare `AssertionError` (cuda on a machine without a GPU)."""
    result = train(tmp_path / "run", "--steps", "1", env={**ENV, variable: value}, timeout=120)
    assert_one_error_line(result, 2, f"error: {variable}={value}", says)


def cache_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "compilation cache" in line or "--compile-cache" in line]


def test_a_damaged_compile_cache_entry_is_replaced_with_one_warning(tmp_path):
    """Before: every later run warned `UserWarning: Error reading persistent compilation
    cache entry for 'jit__train_step'` (two lines) and compiled it again, for ever."""
    cache = tmp_path / "cache"
    assert train(tmp_path / "first", "--steps", "1", "--compile-cache", cache).returncode == 0
    [entry] = cache.glob("jit__train_step-*-cache")
    os.truncate(entry, entry.stat().st_size // 2)
    damaged = train(tmp_path / "second", "--steps", "1", "--compile-cache", cache)
    assert damaged.returncode == 0, damaged.stderr[-3000:]
    assert cache_lines(damaged.stderr) == [
        f"warning: --compile-cache {cache}: removed 1 damaged entry for jit__train_step "
        "(error: Error -5 while decompressing data: incomplete or truncated stream); this run "
        "compiles it and keeps it afresh"], damaged.stderr
    assert "1 program compiled" in damaged.stderr
    again = train(tmp_path / "third", "--steps", "1", "--compile-cache", cache)
    assert again.returncode == 0 and cache_lines(again.stderr) == [], again.stderr[-3000:]
    assert "0 programs compiled, 2 loaded from the cache" in again.stderr


def test_a_default_compile_cache_that_cannot_be_made_is_no_cache_and_one_warning(tmp_path):
    """HOME=/dev/null (a service account's), no --compile-cache given. Before: `error:
    --compile-cache /dev/null/.cache/jax_transformer/xla cannot be created (Not a
    directory)`, exit 2, naming a flag the user never gave."""
    env = {k: v for k, v in ENV.items() if k not in ("XDG_CACHE_HOME",
                                                     "JAX_COMPILATION_CACHE_DIR")}
    result = train(tmp_path / "run", "--steps", "1", env={**env, "HOME": "/dev/null"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert cache_lines(result.stderr) == [
        "warning: the compilation cache /dev/null/.cache/jax_transformer/xla (the default, "
        "under HOME) cannot be created (Not a directory): every program is compiled afresh "
        "and none is kept (--compile-cache DIR chooses another directory, --no-compile-cache "
        "turns the cache off)"], result.stderr
    assert "no cache)" in result.stderr  # compiling N programs ahead of time (no cache)


@pytest.fixture
def read_only_directory(tmp_path):
    """An empty directory no one can write to: a read-only bind mount as root (root
    writes through permissions), the permissions otherwise."""
    directory = tmp_path / "read-only"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
        return
    mount = subprocess.run(f"mount --bind {directory} {directory} && "
                           f"mount -o remount,bind,ro {directory}", shell=True,
                           capture_output=True, text=True)
    if mount.returncode != 0:
        subprocess.run(["umount", str(directory)], capture_output=True)
        pytest.skip(f"a read-only directory needs a read-only bind mount as root, and mount "
                    f"is not permitted here: {mount.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_read_only_compile_cache_is_one_warning_line(tmp_path, read_only_directory):
    """Before: ~150 `UserWarning: Error writing persistent compilation cache entry`
    pairs of lines, one per program."""
    result = train(tmp_path / "run", "--steps", "1", "--compile-cache", read_only_directory)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = cache_lines(result.stderr)
    assert len(lines) == 1, f"{len(lines)} lines about the cache:\n" + "\n".join(lines[:6])
    prefix = f"warning: --compile-cache {read_only_directory} is not writable ("
    assert lines[0].startswith(prefix), lines[0]
    assert lines[0].endswith("): programs found there are loaded, new ones are compiled and "
                             "not kept"), lines[0]
    assert "UserWarning" not in result.stderr


def test_a_file_as_compile_cache_names_the_flag(tmp_path):
    """Before: `error: [Errno 17] File exists: '...'`, naming no flag."""
    (tmp_path / "FILE").touch()
    result = train(tmp_path / "run", "--steps", "1", "--compile-cache", tmp_path / "FILE")
    assert_one_error_line(result, 2, f"error: --compile-cache {tmp_path / 'FILE'} is a file, "
                                     "not a directory")


def test_resuming_on_another_device_count_names_the_device_count(tmp_path):
    """Before: `error: the training data differ from those of checkpoint 2: ... saved for
    batch shapes [[43, 48, 32]], these settings give [[42, 48, 32]] ... Was the built-in
    corpus (its flags) changed?`: the data were the same, the rows were rounded to 3
    devices. Checkpoints saved before the data position recorded its multiple are
    recognised too."""
    workdir = tmp_path / "run"
    flags = ["--max-tokens", "2064", "--steps", "2"]  # 43 rows of 48 on 1 device, 42 on 3
    first = train(workdir, *flags, env={**ENV, "JAX_NUM_CPU_DEVICES": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    flags[-1] = "4"
    three_devices = {**ENV, "JAX_NUM_CPU_DEVICES": "3"}
    assert_one_error_line(
        train(workdir, *flags, env=three_devices), 2,
        "error: checkpoint 2 was saved by a run on 1 device(s): batch rows are rounded down to "
        "a multiple of the device count, so its batches of 43 rows are not this run's 42 rows "
        "on 3 device(s), and its data position does not carry over; resume on 1 device(s) "
        "(--cpu-devices 1), or use a new --workdir")
    position = workdir / "checkpoints" / "2" / "data" / "metadata"
    state = json.loads(position.read_text())
    position.write_text(json.dumps({k: v for k, v in state.items() if k != "batch_multiple"}))
    assert_one_error_line(
        train(workdir, *flags, env=three_devices), 2,
        "error: checkpoint 2 was saved by a run on another number of devices: ",
        "resume on the device count it was saved on, or use a new --workdir")


def test_a_checkpoint_resumes_on_a_device_count_dividing_its_own(tmp_path):
    """--cpu-devices 2, then a resume with --cpu-devices 1 (which its help says a resume
    may change): the same batches, so the losses follow the uninterrupted run's. Before:
    `error: checkpoint 2 was saved by a run on 2 devices: ... resume on 2 devices`."""
    flags = ["--max-tokens", "2064", "--steps", "4"]  # 43 rows of 48 on 1 device, 42 on 2
    whole = train(tmp_path / "whole", *flags, "--cpu-devices", "2")
    assert whole.returncode == 0, whole.stderr[-3000:]
    workdir = tmp_path / "run"
    first = train(workdir, *flags[:-1], "2", "--cpu-devices", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = train(workdir, *flags, "--cpu-devices", "1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from step 2" in resumed.stderr
    assert ("data: batch rows a multiple of 2, as the checkpoint's (saved on 2 devices; here "
            "1), so its data position carries over") in resumed.stderr
    expected, got = losses(tmp_path / "whole"), losses(workdir)
    assert [step for step, _ in got] == [step for step, _ in expected] == [1, 2, 3, 4]
    for (step, a), (_, b) in zip(got, expected):  # the gradient sums run in another order
        assert abs(a - b) <= 1e-6 * abs(b), (step, a, b)


@pytest.fixture
def small_disk(tmp_path):
    """A 1,400 KiB filesystem (tmpfs) at tmp_path/disk, which train.py fills part way;
    `grow()` makes room. Mounting needs root: skipped where mount is not permitted.

    Measured in tmpfs pages: the prepared data and tokenizer take ~400 KiB before the first
    checkpoint, and one TINY checkpoint 570 to 650 KiB (orbax's files vary run to run), so
    the first checkpoint fits with ~300 KiB to spare and the run (all three checkpoints
    and the export, ~2.4 MiB) never does. At 1 MiB the first checkpoint fitted only
    sometimes."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1400K", "tmpfs", str(disk)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip("a full disk is a small tmpfs, and mounting one needs root (mount "
                    f"failed: {mount.stderr.strip() or mount.returncode})")

    def grow():
        subprocess.run(["mount", "-o", "remount,size=64M", str(disk)], check=True)

    try:
        yield disk, grow
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_line_and_the_run_resumes_once_there_is_room(small_disk):
    """Before: 100 to 1,100 lines of stderr and up to 115 tracebacks (orbax's background
    threads, asyncio's unretrieved tasks, `Event loop is closed`, tensorboardX at exit),
    the one `error: [Errno 28] No space left on device` line buried among them (or, when
    tensorstore's RESOURCE_EXHAUSTED came last, no error line and exit 1 by traceback)."""
    disk, grow = small_disk
    workdir = disk / "wd"
    full = train(workdir, "--steps", "10")
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps, f"no checkpoint fitted on the disk: {full.stderr[-2000:]}"
    assert_one_error_line(
        full, 1, f"error: the disk is full: no space left on the device holding {workdir}; the "
                 f"newest complete checkpoint, step {steps[-1]} in {workdir / 'checkpoints'}, "
                 "is intact: free space, then run the same command to resume from it")
    assert len(full.stderr.splitlines()) < 15, full.stderr  # the run's own lines, and this one
    grow()
    resumed = train(workdir, "--steps", "10")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {steps[-1]} " in resumed.stderr
    assert not list((workdir / "checkpoints").glob("*tmp*"))  # the unfinished save is gone
    assert sorted(p.name for p in (workdir / "export").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.model"]


@pytest.fixture
def frozen(tmp_path):
    """`frozen(directory)`: a context in which `directory` is immutable (`chattr +i`: no
    entry is made, removed or renamed in it, by root either), undone on leaving it.
    Skipped where chattr cannot set the flag (not root, a filesystem without it)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    tried = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"an immutable directory needs chattr +i as root on a filesystem that "
                    f"keeps the flag: {tried.stderr.strip() or tried.returncode}")
    subprocess.run(["chattr", "-i", str(probe)], check=True)

    @contextlib.contextmanager
    def frozen(directory: Path):
        subprocess.run(["chattr", "+i", str(directory)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(directory)], check=True)

    return frozen


def test_checkpoints_made_read_only_mid_run_end_it_with_one_line_and_resume(tmp_path, frozen):
    """WORKDIR/checkpoints made immutable once step 4 is saved. Before: three orbax
    tracebacks, `error: [Errno 1] Operation not permitted: '.../8.orbax-checkpoint-tmp'`,
    then no exit for orbax's coordination timeout (300 s): the threads that would write
    step 8's arrays wait for the directory its failed creation never signals."""
    workdir = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "train.py", "--workdir", str(workdir), *TINY, "--steps", "1000"],
        cwd=REPO_ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (workdir / "checkpoints" / "4").is_dir():
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint 4 after 240 s"
            time.sleep(0.05)
        with frozen(workdir / "checkpoints"):
            try:
                stderr = process.communicate(timeout=60)[1]
            except subprocess.TimeoutExpired:
                pytest.fail("train.py still runs 60 s after its checkpoints were made "
                            "read-only")
    finally:
        process.kill()
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and steps[-1] >= 4, steps
    assert_one_error_line(
        subprocess.CompletedProcess(process.args, process.returncode, "", stderr), 1,
        "error: writing a checkpoint was refused: Operation not permitted: "
        f"{workdir / 'checkpoints'}/", "(is the work directory read-only?); the newest "
        f"complete checkpoint, step {steps[-1]} in {workdir / 'checkpoints'}, is intact: make "
        f"{workdir} writable, then run the same command to resume from it")
    resumed = train(workdir, "--steps", str(steps[-1] + 2))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from step {steps[-1]} " in resumed.stderr
