"""Several processes as one run (train.py --distributed): joining JAX's multi-controller
runtime, and ending together when one process fails or dies (train.runtime.peers).

    check_environment(settings)  refuse JAX_NUM_PROCESSES > 1 without --distributed
    initialize(settings)         jax.distributed.initialize() with the coordinator's
                                 settings (flags, else JAX_* variables, else the cluster's)
                                 and timeouts that let train.runtime.peers act first
    bind_address(given, ...)     where process 0's coordinator listens: the address given,
                                 every interface only when asked
    together(settings, hint)     around the run: watch the peers; an error ends every
                                 process at once, shown once
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable, Iterator, Mapping

import jax

from jax_transformer.train.checkpoints import CHECKPOINTS, complete_steps
from jax_transformer.train.runtime import peers, signals
from jax_transformer.train.settings.fields import flag
from jax_transformer.train.settings.training import TrainSettings
from transformer_core.errors import InputError, RunFailed, TrainError

# The coordinator's settings: the flag's field -> the environment variable read without it.
# jax.distributed.initialize() reads only the first itself.
ENVIRONMENT = {"coordinator_address": "JAX_COORDINATOR_ADDRESS",
               "num_processes": "JAX_NUM_PROCESSES", "process_id": "JAX_PROCESS_ID"}
CLUSTERS = "a cluster JAX detects (Cloud TPU, SLURM, Open MPI)"
# jax.distributed.initialize()'s ValueError when a setting is missing -> the setting, named.
MISSING_DISTRIBUTED = {
    "coordinator_address should be defined": ("coordinator_address", "coordinator address"),
    "Number of processes must be defined": ("num_processes", "number of processes"),
    "process id of the current process must be defined": ("process_id", "process id")}
# JAX's own heartbeat ends a silent peer's run this long after train.runtime.peers would have
# (and JAX's way is a page of runtime logs and an abort).
HEARTBEAT_MARGIN_SECONDS = 10
# Joining: say what a process waits for after this long; JAX's initialization timeout (it
# aborts the process with a stack trace) comes this long after --join-timeout's end.
JOIN_NOTICE_SECONDS, JOIN_MARGIN_SECONDS = 3, 30
ALL_INTERFACES = "[::]"  # JAX's default host to bind to: every interface, IPv6 and IPv4


def coordinates(settings: TrainSettings,
                environ: Mapping[str, str] = os.environ) -> dict[str, str | int | None]:
    """The coordinator's settings this process was given: each flag, else its JAX_*
    variable, else None (JAX then asks the cluster). Numbers are checked."""
    given = {}
    for name, variable in ENVIRONMENT.items():
        value, source = getattr(settings, name), flag(name)
        if value is None and environ.get(variable):
            value, source = environ[variable], variable
            if name != "coordinator_address":
                try:
                    value = int(value)
                except ValueError:
                    raise TrainError(f"{variable} must be a whole number, got "
                                     f"{value!r}") from None
        given[name] = value
        given[f"{name}_source"] = source
    if given["coordinator_address"] is not None:
        host_and_port(given["coordinator_address"], given["coordinator_address_source"])
    count, index = given["num_processes"], given["process_id"]
    if count is not None and count < 1:
        raise TrainError(f"{given['num_processes_source']} must be at least 1, got {count}")
    if index is not None and not (0 <= index and (count is None or index < count)):
        raise TrainError(f"{given['process_id_source']} must be from 0 to "
                         f"{'the number of processes - 1' if count is None else count - 1}, "
                         f"got {index}")
    return given


def host_and_port(address: str, source: str) -> tuple[str, int]:
    """HOST:PORT's host (an IPv6 one without its brackets) and port, checked: JAX takes
    anything, and fails on a bad one with an IndexError or a segmentation fault."""
    host, colon, port = address.rpartition(":")
    if not (colon and host.strip("[]") and port.isdigit() and 1 <= int(port) <= 65535):
        raise TrainError(f"{source} must be HOST:PORT, with a port from 1 to 65535 "
                         f"(e.g. 10.0.0.1:1234), got {address!r}")
    return host.strip("[]"), int(port)


def host_addresses(host: str) -> list[str]:
    """The IP addresses `host` (a name, or an address) resolves to on this host."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def this_hosts(ip: str) -> bool:
    """Whether `ip` is an address of this host: a socket binds to it (nothing is
    connected, no packet is sent). 0.0.0.0 and :: stand for every address, so neither is."""
    if ipaddress.ip_address(ip.split("%")[0]).is_unspecified:
        return False
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


def loopback(host: str) -> bool:
    """Whether `host` is a loopback IP address (127.0.0.0/8, ::1); False for a name."""
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def print_warning(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bind_address(given: Mapping, all_interfaces: bool,
                 environ: Mapping[str, str] = os.environ,
                 addresses: Callable[[str], list[str]] = host_addresses,
                 ours: Callable[[str], bool] = this_hosts,
                 warn: Callable[[str], None] = print_warning) -> str | None:
    """Where process 0's coordinator listens, given this process's `coordinates`: every
    interface (`[::]:PORT`) only when asked (`all_interfaces`,
    --coordinator-bind-all-interfaces), else JAX_COORDINATOR_BIND_ADDRESS, else the
    coordinator address as given. On process 0 its host must resolve (`addresses`) to
    one of this host's addresses (`ours`), or a TrainError says so (JAX would fail with
    `Failed to start RPC server`); a name that resolves to loopback addresses only
    (Debian's `127.0.1.1 HOSTNAME`) draws a warning (`warn`), since other hosts cannot
    connect there. None, JAX's choice (every interface), where the cluster gives the
    address."""
    address, source = given["coordinator_address"], given["coordinator_address_source"]
    if address is None:
        return None
    host, port = host_and_port(address, source)
    if all_interfaces:
        return f"{ALL_INTERFACES}:{port}"
    if environ.get("JAX_COORDINATOR_BIND_ADDRESS"):
        return environ["JAX_COORDINATOR_BIND_ADDRESS"]
    if given["process_id"] != 0:  # only process 0 listens (or, unnumbered, may)
        return address
    try:
        found = addresses(host)
    except OSError as e:
        raise TrainError(f"{source} {address}: {host} does not resolve on process 0's host "
                         f"({e.strerror or e})") from None
    everywhere = flag("coordinator_bind_all_interfaces")
    if not any(ours(ip) for ip in found):
        resolved = "" if found == [host] else f" (it resolves to {', '.join(found)})"
        raise TrainError(f"{source} {address}: process 0 serves the coordinator there, but "
                         f"{host} is not an address of its host{resolved}: give one of "
                         "this host's addresses, or choose where it listens with "
                         f"JAX_COORDINATOR_BIND_ADDRESS or {everywhere}")
    if host != "localhost" and not loopback(host) and all(loopback(ip) for ip in found):
        warn(f"warning: {source} {address}: {host} resolves to {', '.join(found)} here, a "
             "loopback address: the coordinator listens there, where only this host's "
             "processes can connect; for processes on other hosts, give this host's network "
             f"address (or {everywhere})")
    return address


def check_environment(settings: TrainSettings, environ: Mapping[str, str] = os.environ) -> None:
    """A process the environment places among several (a launcher, a job script) needs
    --distributed: without it, each would train alone in the same work directory."""
    count = environ.get("JAX_NUM_PROCESSES", "")
    if not settings.distributed and count.isdigit() and int(count) > 1:
        raise TrainError(f"JAX_NUM_PROCESSES={count} places this process in a run of "
                         f"{count} processes: add --distributed (or unset it)")


def initialize(settings: TrainSettings) -> None:
    """Join the run: jax.distributed.initialize() with this process's coordinates and a
    heartbeat timeout HEARTBEAT_MARGIN_SECONDS past --peer-timeout; process 0's
    coordinator listens where bind_address says. A setting it cannot find, or a
    coordinator it cannot reach, is a TrainError naming the flag; joining is watched
    (watch_joining)."""
    given = coordinates(settings)
    address, joined = given["coordinator_address"], threading.Event()
    bind = bind_address(given, settings.coordinator_bind_all_interfaces)
    threading.Thread(target=watch_joining, daemon=True, name="join-watch",
                     args=(joining(given), settings.join_timeout, joined)).start()
    try:
        jax.distributed.initialize(
            coordinator_address=address, coordinator_bind_address=bind,
            num_processes=given["num_processes"], process_id=given["process_id"],
            initialization_timeout=math.ceil(settings.join_timeout) + JOIN_MARGIN_SECONDS,
            heartbeat_timeout_seconds=int(settings.peer_timeout) + HEARTBEAT_MARGIN_SECONDS)
    except ValueError as e:
        missing = next((name for text, name in MISSING_DISTRIBUTED.items() if text in str(e)),
                       None)
        if missing is None:
            raise
        name, what = missing
        raise TrainError(f"--distributed: jax.distributed.initialize() found no {what}: give "
                         f"{flag(name)} or set {ENVIRONMENT[name]}, or run on {CLUSTERS}; on "
                         "one host, run without --distributed") from None
    except jax.errors.JaxRuntimeError as e:
        raise TrainError(f"--distributed: could not join the run's coordinator at "
                         f"{address or 'the cluster’s address'} "
                         f"({peers.first_line(e)}); are all processes started, and is process "
                         "0 reachable there?") from None
    finally:
        joined.set()


def joining(given: Mapping) -> str:
    """What a process that has not joined yet waits for."""
    at = f" at {given['coordinator_address']}" if given["coordinator_address"] else ""
    if given["process_id"] == 0:
        return f"the other processes of the run to connect to its coordinator{at}"
    return f"process 0's coordinator{at} (and through it, the run's other processes)"


def watch_joining(what: str, timeout: float, joined: threading.Event) -> None:
    """After JOIN_NOTICE_SECONDS, say what this process waits for; after `timeout`, end it
    with one line (JAX's own timeout aborts with a stack trace, so it is set later)."""
    if joined.wait(min(JOIN_NOTICE_SECONDS, timeout)):
        return
    print(f"--distributed: waiting for {what}, for up to {timeout:g} s (--join-timeout)",
          file=sys.stderr, flush=True)
    if not joined.wait(max(timeout - JOIN_NOTICE_SECONDS, 0)):
        sys.stdout.flush()
        os.write(sys.stderr.fileno(), (
            f"error: --distributed: gave up waiting for {what} after {timeout:g} s "
            "(--join-timeout): are all processes started, with the same --num-processes "
            "and coordinator address, and is process 0 reachable there?\n").encode())
        os._exit(2)


@contextlib.contextmanager
def together(settings: TrainSettings, resume_hint: Callable[[], str]) -> Iterator[None]:
    """Run the block on every process; a PeerWatch ends this one when a peer fails, dies
    or is stopped at once by a signal (as this one tells them, peers.post_stop). An
    error here is posted for the peers and re-raised, for the command to show
    and exit at once (its traceback printed first if it is a bug, not bad input); an
    error from a collective a vanished peer broke waits for the watch's verdict."""
    watch = peers.PeerWatch(settings.peer_timeout, resume_hint)
    watch.start()
    signals.BEFORE_EXIT_AT_ONCE.append(peers.post_stop)  # a stop at once stops them too
    try:
        yield
    except signals.Interrupted:  # every process stopped after the same step
        watch.finish()
        raise
    except BaseException as error:
        failure = peers.failed_peer()
        if failure is not None:
            peers.leave(failure)
        if isinstance(error, jax.errors.JaxRuntimeError):  # a peer gone without a word?
            time.sleep(settings.peer_timeout + 2 * peers.BEAT_SECONDS)  # the watch ends it
        watch.stop()
        expected = isinstance(error, (InputError, RunFailed, OSError))
        peers.post_failure("bad input" if isinstance(error, (InputError, OSError)) else
                           "the run failed" if isinstance(error, RunFailed) else
                           "an unexpected error")
        if expected:
            raise
        traceback.print_exc()
        raise RunFailed(f"{peers.processes()} failed: {type(error).__name__}: "
                        f"{peers.first_line(error)} (traceback above)") from None
    finally:
        if peers.post_stop in signals.BEFORE_EXIT_AT_ONCE:
            signals.BEFORE_EXIT_AT_ONCE.remove(peers.post_stop)
    watch.finish()


def resume_hint(workdir: Path) -> str:
    """Where a run stopped by a lost process resumes from."""
    steps = complete_steps(workdir)
    if not steps:
        return "no checkpoint was saved yet"
    return (f"the newest complete checkpoint is step {steps[-1]} in {workdir / CHECKPOINTS}: "
            "start the same command on every process to resume from it")
