"""The other processes of a distributed run, through JAX's coordination service.

Every process of a `--distributed` run must make the same collective calls, so one
that fails or dies leaves the others waiting: in a collective, until JAX's
heartbeat timeout aborts them with a page of runtime logs, or in the shutdown
barrier for minutes. Here they end within --peer-timeout, each with one line:

    PeerWatch       a thread that beats every BEAT_SECONDS and ends this process when a
                    peer has posted its failure, or stopped beating for --peer-timeout
                    before it posted that it finished
    post_failure    a failing process says so before it leaves (process 0, which serves
                    the coordinator, then waits for the others to read it)
    post_stop       the same for a process a signal stops at once: the others stop too,
                    with the signal's exit code
    failed_peer     the line naming a peer that posted its failure
    barrier         every process reaches a named point (one writes, the others read)
    gather          every process's value of something
    agree           process 0's answer to "stop after this step?", the same on every process
    leave           one line on stderr, then exit at once (no shutdown barrier)

The keys live in the coordination service's key-value store, under KEYS.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

import jax
from jax._src import distributed as jax_distributed  # the coordination service's client

KEYS = "jax_transformer"
BEAT_SECONDS = 1.0
FAILED_EXIT = 1  # a survivor of a peer's failure: the run failed
_ending = threading.Lock()  # one line per process, from whichever thread ends it first


def client():
    """JAX's client of the coordination service (jax.distributed.initialize made it)."""
    return jax_distributed.global_state.client


def processes() -> str:
    return f"process {jax.process_index()} of {jax.process_count()}"


def peers_by_key(directory: str) -> dict[int, str]:
    """{process: value} of the keys under KEYS/`directory`/."""
    return {int(key.rsplit("/", 1)[1]): value
            for key, value in client().key_value_dir_get(f"{KEYS}/{directory}/")}


def failed_peer() -> str | None:
    """The line for a peer that posted its failure, or None (none did, or the coordinator
    cannot be asked)."""
    try:
        failed = {k: v for k, v in peers_by_key("failed").items() if k != jax.process_index()}
    except Exception:  # the coordinator is gone: PeerWatch says so
        return None
    if not failed:
        return None
    peer = min(failed)
    return (f"error: process {peer} failed ({failed[peer]}; its own output says what): "
            f"{processes()} stops too")


def post_failure(summary: str) -> None:
    """Tell the peers this process failed, before it leaves. Process 0 serves the
    coordinator, so it waits (up to a few beats) until every peer has read the news and
    left, rather than take the coordinator down under them."""
    me = jax.process_index()
    try:
        client().key_value_set(f"{KEYS}/failed/{me}", summary, allow_overwrite=True)
        if me == 0:
            wait_for_peers_to_leave()
    except Exception:  # the coordinator is gone: the peers have ended already
        pass


def post_stop(signum: int) -> None:
    """Tell the peers this process stops at once on signal `signum`, saving nothing (a
    signal before training, or sent twice), so that they stop too rather than take it
    for a crash; process 0 waits for them, as post_failure does."""
    me = jax.process_index()
    try:
        client().key_value_set(f"{KEYS}/stopped/{me}", signal.Signals(signum).name,
                               allow_overwrite=True)
        if me != 0:
            client().key_value_set(f"{KEYS}/left/{me}", "1", allow_overwrite=True)
            return
        wait_for_peers_to_leave()
    except Exception:  # the coordinator is gone: the peers have ended already
        pass


def wait_for_peers_to_leave() -> None:
    """Process 0, which serves the coordinator: wait (up to a few beats) until every peer
    has read the news and left."""
    deadline = time.monotonic() + 5 * BEAT_SECONDS
    while time.monotonic() < deadline and not set(range(1, jax.process_count())) <= set(
            peers_by_key("left")):
        time.sleep(BEAT_SECONDS / 10)


def stopped_peer() -> tuple[int, str] | None:
    """(the peer, its signal's name) for a peer that posted it stops at once, or None."""
    try:
        stopped = {k: v for k, v in peers_by_key("stopped").items() if k != jax.process_index()}
    except Exception:  # the coordinator is gone: PeerWatch says so
        return None
    return min(stopped.items()) if stopped else None


def barrier(name: str, timeout_seconds: float = 24 * 3600) -> None:
    """Wait until every process reaches this point (a no-op in a one-process run). A dead
    peer ends the wait through PeerWatch, so the timeout may be long."""
    if jax.process_count() > 1:
        client().wait_at_barrier(f"{KEYS}/{name}", int(timeout_seconds * 1000))


def gather(name: str, value: str) -> list[str]:
    """Every process's `value`, in process order (every process calls it)."""
    if jax.process_count() == 1:
        return [value]
    client().key_value_set(f"{KEYS}/{name}/{jax.process_index()}", value,
                           allow_overwrite=True)
    barrier(name)
    return [value for _, value in sorted(peers_by_key(name).items())]


def agree(step: int, request: str | None, keep: int = 1000) -> str | None:
    """Process 0's answer, the same on every process, to "stop after `step`?": the first
    of the stop requests (a signal's name, or "time") that have reached it, posted here by
    any process (`request`), or None to go on. Hosts run within a few steps of each
    other (every step is a collective), so the answers of the last `keep` steps kept in
    the store are enough."""
    me, store = jax.process_index(), client()
    if request is not None:
        store.key_value_set(f"{KEYS}/stop/{me}", request, allow_overwrite=True)
    key = f"{KEYS}/after/{step}"
    if me != 0:
        return store.blocking_key_value_get(key, 24 * 3600 * 1000) or None
    requests = sorted(peers_by_key("stop").values())  # signal names sort before "time"
    store.key_value_set(key, requests[0] if requests else "", allow_overwrite=True)
    if step >= keep:
        store.key_value_delete(f"{KEYS}/after/{step - keep}")
    return requests[0] if requests else None


class PeerWatch(threading.Thread):
    """Beats for this process and watches the others' beats: a peer that posted its
    failure, a peer silent for `timeout` seconds that has not posted that it finished
    (`finish`), or a coordinator that no longer answers ends this process with one line
    (`leave`). `resume_hint()` adds where the run can resume from."""

    def __init__(self, timeout: float, resume_hint: Callable[[], str]):
        super().__init__(name="peer-watch", daemon=True)
        self.timeout, self.resume_hint = timeout, resume_hint
        self.stopped = threading.Event()

    def run(self) -> None:
        me, started = jax.process_index(), time.monotonic()
        heard: dict[int, tuple[str, float]] = {}  # peer -> (its last beat, when it changed)
        beat = 0
        while not self.stopped.wait(BEAT_SECONDS):
            beat += 1
            try:
                client().key_value_set(f"{KEYS}/alive/{me}", str(beat), allow_overwrite=True)
                beats = peers_by_key("alive")
                finished = peers_by_key("finished")
            except Exception as error:
                if not self.stopped.is_set():
                    self.end(f"lost the coordinator, process 0 ({first_line(error)}): it "
                             "ended, was killed or its host is unreachable")
                return
            failure, stopped = failed_peer(), stopped_peer()
            if failure is not None:
                leave(failure)
            if stopped is not None:
                peer, name = stopped
                leave(f"{name}: process {peer} was stopped at once, without saving: "
                      f"{processes()} stops too; {self.resume_hint()}",
                      128 + signal.Signals[name])
            now = time.monotonic()
            for peer in range(jax.process_count()):
                last, since = heard.get(peer, (None, started))
                if beats.get(peer) != last:
                    heard[peer] = beats.get(peer), now
                elif peer != me and peer not in finished and now - since > self.timeout:
                    self.end(f"process {peer} stopped answering {self.timeout:g} s ago "
                             "(killed, crashed, or its host lost)")

    def stop(self) -> None:
        self.stopped.set()

    def finish(self) -> None:
        """Stop beating, first telling the peers that this process finished its work: the
        ones still writing their files must not take its silence for a death."""
        try:
            client().key_value_set(f"{KEYS}/finished/{jax.process_index()}", "1",
                                   allow_overwrite=True)
        except Exception:  # the coordinator is gone: no peer is left to tell
            pass
        self.stop()

    def end(self, what: str) -> None:
        leave(f"error: {what}: {processes()} stops too; {self.resume_hint()}")


def leave(line: str, code: int = FAILED_EXIT) -> None:
    """Say this process has read a peer's failure (process 0 waits for that before it
    takes the coordinator down), write `line` on stderr and exit at once with `code`,
    skipping the shutdown barrier (it would wait for peers that are gone). A second
    caller, on another thread, waits for the first."""
    _ending.acquire()
    try:
        client().key_value_set(f"{KEYS}/left/{jax.process_index()}", "1", allow_overwrite=True)
    except Exception:  # the coordinator is gone already
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), f"{line}\n".encode())
    os._exit(code)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
