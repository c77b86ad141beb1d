"""jaxformer-launch: run N processes of one command on this machine as one distributed
JAX job, for development and tests (on a cluster, its scheduler starts the processes:
docs/distributed.md).

    jaxformer-launch -n 2 --cpu-devices 2 -- python train.py --distributed --workdir runs/two

Each process gets JAX_COORDINATOR_ADDRESS (127.0.0.1 and a free port; the coordinator
listens there only: JAX_COORDINATOR_BIND_ADDRESS), JAX_NUM_PROCESSES and JAX_PROCESS_ID;
--cpu-devices K also sets JAX_PLATFORMS=cpu and JAX_NUM_CPU_DEVICES=K (otherwise the
environment's pass through). Their output comes through line by line, each line
prefixed with [pK]; their stdin is /dev/null. Each runs in a process group of its own,
so SIGINT and SIGTERM reach it once, passed on by the launcher (Ctrl-C too), and it is
killed when the launcher dies, even by SIGKILL. Once one exits with a failure, or the
launcher's output is closed (`| head -1`: they get SIGTERM), the others get --grace
seconds to end on their own (train.py's do, within its --peer-timeout) and are then
killed. The exit code is the first failure's (128 + N for a process a signal ended),
141 after a closed output, or 0.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Sequence

from jax_transformer.commands import exit_codes, parsing
from transformer_core.errors import InputError

GRACE_SECONDS = 60.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


class LaunchError(InputError):
    """The launcher was asked for something it cannot do."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_environment(index: int, count: int, port: int, cpu_devices: int | None) -> dict:
    """The coordinator serves, and listens, on 127.0.0.1 only: its key-value store takes
    writes from whoever reaches it, without authentication."""
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
           "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
           "JAX_NUM_PROCESSES": str(count), "JAX_PROCESS_ID": str(index)}
    if cpu_devices is not None:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(cpu_devices))
    return env


def die_with(launcher: int) -> Callable[[], None]:
    """A child's preexec_fn: SIGKILL when the launcher dies, however it dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). Children are started before any thread is."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != launcher:  # it died before the call
                os._exit(128 + signal.SIGKILL)
    return preexec


def start(command: Sequence[str], count: int, cpu_devices: int | None) -> list:
    """The processes, each in a process group of its own: a signal to the launcher's group
    (Ctrl-C) reaches them once, forwarded, not also from the terminal."""
    port, children = free_port(), []
    for index in range(count):
        try:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, process_group=0,
                                     preexec_fn=die_with(os.getpid()),
                                     env=process_environment(index, count, port, cpu_devices))
        except OSError as e:
            for started in children:
                started.kill()
            raise LaunchError(f"cannot start {command[0]}: {e.strerror}") from None
        children.append(child)
        say(f"process {index}: pid {child.pid}")
    return children


def relay(source: BinaryIO, prefix: bytes, sink: BinaryIO, lock: threading.Lock,
          closed: threading.Event) -> None:
    """Copy `source` to `sink` a line at a time, each line prefixed. Once `sink` is
    closed (`| head -1`), set `closed` and read on, so the process never blocks on a
    full pipe."""
    for line in iter(source.readline, b""):
        if closed.is_set():
            continue
        with lock:
            try:
                sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
                sink.flush()
            except BrokenPipeError:
                closed.set()


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


def say(line: str) -> None:
    try:
        print(f"[launch] {line}", file=sys.stderr, flush=True)
    except BrokenPipeError:  # the relays found it closed too: the job is ending
        pass


def launch(command: Sequence[str], count: int, cpu_devices: int | None = None,
           grace: float = GRACE_SECONDS) -> int:
    """Run `count` processes of `command` as one job; returns the exit code (128 +
    SIGPIPE once its output is closed: the processes get SIGTERM, then --grace)."""
    children = start(command, count, cpu_devices)
    lock, closed, relays = threading.Lock(), threading.Event(), []
    for index, child in enumerate(children):
        for source, sink in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer)):
            relays.append(threading.Thread(target=relay, daemon=True, args=(
                source, f"[p{index}] ".encode(), sink, lock, closed)))
            relays[-1].start()

    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        first_failure = watch(children, grace, closed)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for thread in relays:
            thread.join()
    if closed.is_set():
        raise BrokenPipeError  # exit_codes ends quietly
    if first_failure is None:  # a failure seen only once every process had ended
        first_failure = next((exit_code(c.returncode) for c in children if c.returncode), None)
    return first_failure or 0


def watch(children: list, grace: float, closed: threading.Event) -> int | None:
    """Wait for the processes; once one fails, or the output is closed, the others get
    `grace` seconds to end, then are killed. Returns the first failure's code."""
    first_failure, deadline = None, None
    while any(child.poll() is None for child in children):
        if closed.is_set() and deadline is None:
            deadline = time.monotonic() + grace
            for child in children:
                if child.poll() is None:
                    child.terminate()
        for index, child in enumerate(children):
            if first_failure is None and child.poll() not in (None, 0):
                first_failure = exit_code(child.returncode)
                if deadline is None:
                    deadline = time.monotonic() + grace
                    say(f"process {index} exited with code {first_failure}; the others get "
                        f"{grace:g} s to end")
        if deadline is not None and time.monotonic() > deadline:
            for index, child in enumerate(children):
                if child.poll() is None:
                    say(f"process {index} is still running {grace:g} s later: killed")
                    child.kill()
        time.sleep(0.05)
    return first_failure


def build_parser() -> argparse.ArgumentParser:
    p = parsing.ArgumentParser(prog="jaxformer-launch", description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--num-processes", type=int, required=True, metavar="N",
                   help="processes to start")
    p.add_argument("--cpu-devices", type=int, metavar="K",
                   help="run each process on K CPU devices (JAX_PLATFORMS=cpu, "
                        "JAX_NUM_CPU_DEVICES=K)")
    p.add_argument("--grace", type=float, default=GRACE_SECONDS, metavar="SECONDS",
                   help="after a process fails, how long the others may take to end "
                        "(default: %(default)g)")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the command each process runs, after --")
    return p


def main(argv=None) -> int:
    return exit_codes.run(run, argv)


def run(argv=None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise LaunchError("no command to run: give it after --, e.g. jaxformer-launch -n 2 "
                          "-- python train.py --distributed")
    if args.num_processes < 1:
        raise LaunchError(f"--num-processes must be at least 1, got {args.num_processes}")
    if args.cpu_devices is not None and args.cpu_devices < 1:
        raise LaunchError(f"--cpu-devices must be at least 1, got {args.cpu_devices}")
    if args.grace < 0:
        raise LaunchError(f"--grace must be 0 or more, got {args.grace}")
    return launch(command, args.num_processes, args.cpu_devices, args.grace)


if __name__ == "__main__":
    sys.exit(main())
