"""jaxformer-launch: run N processes of one command on this machine as one distributed
JAX job, for development and tests (on a cluster, its scheduler starts the processes:
docs/distributed.md).

    jaxformer-launch -n 2 --cpu-devices 2 -- python train.py --distributed --workdir runs/two

Each process gets JAX_COORDINATOR_ADDRESS (127.0.0.1 and a free port),
JAX_NUM_PROCESSES and JAX_PROCESS_ID; --cpu-devices K also sets JAX_PLATFORMS=cpu and
JAX_NUM_CPU_DEVICES=K (otherwise the environment's pass through). Their output comes
through line by line, each line prefixed with [pK]. SIGINT and SIGTERM are passed to
every process. Once one exits with a failure, the others get --grace seconds to end on
their own (train.py's do, within its --peer-timeout) and are then killed. The exit code
is the first failure's (128 + N for a process a signal ended), or 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Sequence

from jax_transformer.commands import exit_codes, parsing
from transformer_core.errors import InputError

GRACE_SECONDS = 60.0


class LaunchError(InputError):
    """The launcher was asked for something it cannot do."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no one listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def process_environment(index: int, count: int, port: int, cpu_devices: int | None) -> dict:
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
           "JAX_NUM_PROCESSES": str(count), "JAX_PROCESS_ID": str(index)}
    if cpu_devices is not None:
        env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(cpu_devices))
    return env


def relay(source: BinaryIO, prefix: bytes, sink: BinaryIO, lock: threading.Lock) -> None:
    """Copy `source` to `sink` a line at a time, each line prefixed."""
    for line in iter(source.readline, b""):
        with lock:
            sink.write(prefix + line if line.endswith(b"\n") else prefix + line + b"\n")
            sink.flush()


def exit_code(returncode: int) -> int:
    """A child's exit status as a shell reports it: 128 + N for signal N."""
    return 128 - returncode if returncode < 0 else returncode


def say(line: str) -> None:
    print(f"[launch] {line}", file=sys.stderr, flush=True)


def launch(command: Sequence[str], count: int, cpu_devices: int | None = None,
           grace: float = GRACE_SECONDS) -> int:
    """Run `count` processes of `command` as one job; returns the exit code."""
    port, lock = free_port(), threading.Lock()
    children, relays = [], []
    for index in range(count):
        try:
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=process_environment(index, count, port, cpu_devices))
        except OSError as e:
            for started in children:
                started.kill()
            raise LaunchError(f"cannot start {command[0]}: {e.strerror}") from None
        children.append(child)
        say(f"process {index}: pid {child.pid}")
        for source, sink in ((child.stdout, sys.stdout.buffer), (child.stderr, sys.stderr.buffer)):
            relays.append(threading.Thread(target=relay, daemon=True,
                                           args=(source, f"[p{index}] ".encode(), sink, lock)))
            relays[-1].start()

    def forward(signum, frame):
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward)
                for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        first_failure, deadline = None, None
        while any(child.poll() is None for child in children):
            for index, child in enumerate(children):
                if first_failure is None and child.poll() not in (None, 0):
                    first_failure = exit_code(child.returncode)
                    deadline = time.monotonic() + grace
                    say(f"process {index} exited with code {first_failure}; the others get "
                        f"{grace:g} s to end")
            if deadline is not None and time.monotonic() > deadline:
                for index, child in enumerate(children):
                    if child.poll() is None:
                        say(f"process {index} is still running {grace:g} s later: killed")
                        child.kill()
            time.sleep(0.05)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for thread in relays:
            thread.join()
    if first_failure is None:  # a failure seen only once every process had ended
        first_failure = next((exit_code(c.returncode) for c in children if c.returncode), None)
    return first_failure or 0


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
