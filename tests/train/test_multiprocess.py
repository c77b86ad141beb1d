"""train.py as two cooperating processes (2 CPU devices each) on JAX's distributed
runtime, started by jaxformer-launch on 127.0.0.1, against one process on 4 devices:
the same losses, one set of files, agreed stops, lost and failing processes, and
checkpoints that move between the two topologies."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from num2words import num2words

from jax_transformer.commands import prepare as prepare_command
from tests.train.runs import REPO_ROOT, TINY, losses, resumable_copy

pytestmark = pytest.mark.slow  # several train.py processes per test
ENV = {**os.environ, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
STEPS = 8
FLAGS = [*TINY, "--num-train", "600", "--checkpoint-every", "2", "--eval-every", "4",
         "--steps", str(STEPS)]
PEER_TIMEOUT = 5  # --peer-timeout: how long a silent process may take to be noticed
# Loss of a 2-process x 2-device run against a 1-process x 4-device run on the same
# global batches, relative: the gradient sums run in another order. Measured: at most
# 8.1e-8 over 8 steps.
CROSS_TOPOLOGY = 1e-6


def one_process(workdir: Path, *flags: str) -> subprocess.CompletedProcess:
    """train.py alone on 4 CPU devices."""
    env = {**ENV, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "4"}
    return subprocess.run([sys.executable, "train.py", "--workdir", str(workdir), *FLAGS,
                           *flags], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


class Launch:
    """jaxformer-launch running 2 train.py processes of 2 CPU devices each; its output
    goes to files, read as it comes."""

    def __init__(self, workdir: Path, *flags: str):
        """A flag's "{process}" becomes each process's JAX_PROCESS_ID (through a shell)."""
        self.out, self.err = workdir.with_suffix(".out"), workdir.with_suffix(".err")
        command = [sys.executable, "train.py", "--distributed", "--workdir", str(workdir),
                   *FLAGS, "--peer-timeout", str(PEER_TIMEOUT), *flags]
        if any("{process}" in flag for flag in flags):
            command = ["sh", "-c", "exec " + " ".join(
                shlex.quote(arg).replace("{process}", "'\"$JAX_PROCESS_ID\"'")
                for arg in command)]
        with self.out.open("w") as out, self.err.open("w") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "jax_transformer.commands.launch", "-n", "2",
                 "--cpu-devices", "2", "--", *command], cwd=REPO_ROOT, env=ENV, stdout=out,
                stderr=err)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def lines(self, process: int) -> list[str]:
        prefix = f"[p{process}] "
        return [line[len(prefix):] for line in self.stderr.splitlines()
                if line.startswith(prefix) and "[Gloo]" not in line]

    def pid(self, process: int) -> int:
        return int(self.wait_for(f"[launch] process {process}: pid ").rsplit(" ", 1)[1])

    def wait_for(self, text: str, timeout: float = 240) -> str:
        deadline = time.time() + timeout
        while True:
            found = [line for line in self.stderr.splitlines() if text in line]
            if found:
                return found[0]
            assert self.process.poll() is None, f"ended before {text!r}:\n{self.stderr}"
            assert time.time() < deadline, f"no {text!r} after {timeout} s:\n{self.stderr}"
            time.sleep(0.05)

    def wait_for_step(self, workdir: Path, step: int, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while not any(s >= step for s, _ in losses_so_far(workdir)):
            assert self.process.poll() is None, f"ended before step {step}:\n{self.stderr}"
            assert time.time() < deadline, f"no step {step} after {timeout} s:\n{self.stderr}"
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> int:
        return self.process.wait(timeout=timeout)


def losses_so_far(workdir: Path) -> list[tuple[int, float]]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    return [(r["step"], r["loss"]) for r in
            (json.loads(line) for line in path.read_text().splitlines() if line.endswith("}"))
            if "loss" in r]


def assert_close(got: list[tuple[int, float]], expected: list[tuple[int, float]]) -> None:
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (step, a), (_, b) in zip(got, expected):
        assert abs(a - b) <= CROSS_TOPOLOGY * abs(b), (step, a, b)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Uninterrupted runs of STEPS steps: "two" (2 processes x 2 devices, launched) and
    "one" (1 process x 4 devices)."""
    root = tmp_path_factory.mktemp("multiprocess")
    launch = Launch(root / "two")
    assert launch.finish() == 0, launch.stderr
    one = one_process(root / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    return {"two": root / "two", "one": root / "one", "two_stderr": launch.stderr}


def test_two_processes_train_as_one_process_on_four_devices(runs):
    two, one = runs["two"], runs["one"]
    assert len(losses(two)) == STEPS
    assert_close(losses(two), losses(one))
    training = json.loads((two / "eval.json").read_text())["training"]
    assert training["processes"] == 2 and training["devices"] == 4
    digests = training["state_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]  # bit for bit on both processes
    # One writer each: process 0 wrote the tokenizer the one-process run trained, one line
    # per step and no half-written files.
    assert (two / "tokenizer.model").read_bytes() == (one / "tokenizer.model").read_bytes()
    assert [step for step, _ in losses_so_far(two)] == list(range(1, STEPS + 1))
    assert sorted(p.name for p in (two / "export").iterdir()) == sorted(
        p.name for p in (one / "export").iterdir())
    assert not list(two.glob(".*tmp*")) and not list(two.glob("*.tmp"))
    output = runs["two_stderr"]
    assert output.count("tokenizer: ") == 1 and output.count("exported ") == 1
    # Process 0 read the corpus once; each process encoded its share of every split.
    manifest = json.loads((two / "data" / "manifest.json").read_text())
    assert {entry["parts"] for entry in manifest["splits"].values()} == {2}
    assert output.count("data: preparing") == 1


def test_sigterm_to_one_process_stops_both_after_the_same_step(runs, tmp_path):
    workdir = tmp_path / "run"
    launch = Launch(workdir)
    launch.wait_for_step(workdir, 3)
    os.kill(launch.pid(1), signal.SIGTERM)
    assert launch.finish() == 143, launch.stderr
    last = [launch.lines(p)[-1] for p in (0, 1)]
    assert all(line.startswith("SIGTERM: saved step ") for line in last), last
    assert last[0] == last[1], last  # the same step, saved once by both
    resumed = Launch(workdir)
    assert resumed.finish() == 0, resumed.stderr
    assert losses(workdir) == losses(runs["two"])  # exactly


def test_sigint_to_a_process_still_compiling_stops_both_resumably(tmp_path):
    """SIGINT before training (here while process 0 compiles) stops that process at once,
    saving nothing. Before: the other was left to a lost coordinator, and died with
    JAX's fatal check (`Terminating process because the JAX distributed service detected
    fatal errors`, a stack trace, exit 134) or `error: lost the coordinator` (exit 1)."""
    workdir = tmp_path / "run"
    launch = Launch(workdir)
    launch.wait_for("[p0] compiling ")
    os.kill(launch.pid(0), signal.SIGINT)
    assert launch.finish() == 130, launch.stderr
    assert launch.lines(0)[-1] == ("SIGINT: stopped while compiling, before step 1; saved "
                                   "checkpoints are intact; run the same command to resume")
    assert launch.lines(1)[-1] == ("SIGINT: process 0 was stopped at once, without saving: "
                                   "process 1 of 2 stops too; no checkpoint was saved yet")
    assert "Traceback" not in launch.stderr and "Check failure" not in launch.stderr
    resumed = Launch(workdir)
    assert resumed.finish() == 0, resumed.stderr
    assert [step for step, _ in losses(workdir)] == list(range(1, STEPS + 1))


def test_a_killed_process_ends_the_other_with_one_line_and_a_resumable_checkpoint(
        runs, tmp_path):
    """The checkpoint two processes saved resumes on one process (4 devices)."""
    workdir = tmp_path / "run"
    launch = Launch(workdir)
    launch.wait_for_step(workdir, 3)
    os.kill(launch.pid(1), signal.SIGKILL)
    killed = time.time()
    assert launch.finish() == 137, launch.stderr
    ended = time.time() - killed
    assert ended < PEER_TIMEOUT + 5, ended
    last = launch.lines(0)[-1]
    assert last.startswith("error: process 1 stopped answering"), launch.stderr
    assert "resume" in last and "Traceback" not in launch.stderr
    resumed = one_process(workdir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_close(losses(workdir), losses(runs["two"]))


def test_a_one_process_checkpoint_resumes_on_two_processes(runs, tmp_path):
    workdir = resumable_copy(runs["one"], tmp_path / "run", 4)
    launch = Launch(workdir)
    assert launch.finish() == 0, launch.stderr
    assert "resumed from step 4" in launch.stderr
    assert_close(losses(workdir), losses(runs["one"]))


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted --fsdp 4 run, its 4 shards on 2 processes x 2 devices."""
    root = tmp_path_factory.mktemp("multiprocess_fsdp")
    launch = Launch(root / "two", "--fsdp", "4")
    assert launch.finish() == 0, launch.stderr
    return {"two": root / "two"}


def test_fsdp_over_two_processes_trains_as_one_process(fsdp_runs, runs):
    """Each parameter split across both processes' devices: the losses of one process on
    4 devices with the state whole (--fsdp computes what data parallelism does), and
    every process gathers the same whole state (digests) and exports it."""
    two, one = fsdp_runs["two"], runs["one"]
    assert_close(losses(two), losses(one))
    digests = json.loads((two / "eval.json").read_text())["training"]["state_digests"]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert sorted(p.name for p in (two / "export").iterdir()) == sorted(
        p.name for p in (one / "export").iterdir())


def test_sigterm_stops_an_fsdp_run_on_two_processes_and_it_resumes_exactly(fsdp_runs,
                                                                             tmp_path):
    workdir = tmp_path / "run"
    launch = Launch(workdir, "--fsdp", "4")
    launch.wait_for_step(workdir, 3)
    os.kill(launch.pid(1), signal.SIGTERM)
    assert launch.finish() == 143, launch.stderr
    resumed = Launch(workdir, "--fsdp", "4")
    assert resumed.finish() == 0, resumed.stderr
    assert losses(workdir) == losses(fsdp_runs["two"])  # exactly


def test_a_time_budget_spent_on_one_process_stops_both(runs, tmp_path):
    """Process 0's --time-budget is spent before the resumed run's first step; process 1,
    with hours left, stops after the same (no) step, and both export and evaluate."""
    workdir = resumable_copy(runs["two"], tmp_path / "run", 4)
    launch = Launch(workdir, "--time-budget", "{process}0000.001")  # 0.001 s and 10000 s
    assert launch.finish() == 0, launch.stderr
    assert "--time-budget 0.001 s ran out before this run's first step" in launch.stderr
    assert launch.out.read_text().count('"step": 4,') == 2  # each process's summary
    assert json.loads((workdir / "eval.json").read_text())["training"]["stopped_by"] == \
        "time_budget"


def test_an_error_in_one_process_ends_both_and_is_shown_once(tmp_path):
    """Each process reads its own copy of a prepared corpus (as hosts may), and the
    corpus file of process 1's copy changed since it was prepared."""
    for process in (0, 1):
        folder = tmp_path / str(process)
        folder.mkdir()
        for lang, path in (("en", "train.en"), ("de", "train.de")):
            (folder / path).write_text("".join(f"{num2words(n, lang=lang)}\n"
                                               for n in range(1, 400)))
        assert prepare_command.main([
            "--output", str(folder / "prepared"), *FLAGS[:FLAGS.index("--d-model")],
            "--num-train", "600", "--src-path", str(folder / "train.en"), "--tgt-path",
            str(folder / "train.de"), "--quiet"]) == 0
    with (tmp_path / "1" / "train.en").open("a") as f:
        f.write("four hundred\n")
    workdir = tmp_path / "run"
    started = time.time()
    launch = Launch(workdir, "--data", str(tmp_path / "{process}" / "prepared"))
    assert launch.finish() == 2, launch.stderr
    assert time.time() - started < 120
    errors = [line for line in launch.stderr.splitlines() if "/1/train.en" in line]
    assert len(errors) == 1 and errors[0].startswith("[p1] error: "), launch.stderr
    assert launch.lines(1)[-1] == errors[0][len("[p1] "):]
    assert launch.lines(0)[-1].startswith("error: process 1 failed (bad input"), launch.stderr
    assert "Traceback" not in launch.stderr
