"""PeerWatch against a stand-in for JAX's coordination service: a silent peer ends
this process, a peer that said it finished does not (process 0 plots and writes
eval.json after the others are done)."""

from __future__ import annotations

import time

import pytest

from jax_transformer.train.runtime import peers


class KeyValueStore:
    """The two calls of JAX's coordination-service client that PeerWatch makes."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None:
        self.values[key] = value

    def key_value_dir_get(self, directory: str) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.values.items() if k.startswith(directory)]


@pytest.fixture
def two_processes(monkeypatch):
    """This is process 0 of 2; `leave` records its line instead of exiting."""
    store, left = KeyValueStore(), []
    monkeypatch.setattr(peers, "client", lambda: store)
    monkeypatch.setattr(peers.jax, "process_index", lambda: 0)
    monkeypatch.setattr(peers.jax, "process_count", lambda: 2)
    monkeypatch.setattr(peers, "BEAT_SECONDS", 0.02)
    monkeypatch.setattr(peers, "leave", left.append)
    return store, left


def watch_for(seconds: float, timeout: float = 0.2) -> None:
    watch = peers.PeerWatch(timeout, resume_hint=lambda: "no checkpoint was saved yet")
    watch.start()
    time.sleep(seconds)
    watch.stop()
    watch.join()


def test_a_silent_peer_ends_this_process(two_processes):
    store, left = two_processes
    watch_for(1.0)
    assert left and "process 1 stopped answering 0.2 s ago" in left[0]
    assert store.values["jax_transformer/alive/0"]  # this process beat


def test_a_peer_that_finished_may_fall_silent(two_processes):
    store, left = two_processes
    store.key_value_set("jax_transformer/finished/1", "1")
    watch_for(1.0)
    assert left == []


def test_finish_says_so_and_stops_beating(two_processes):
    store, _ = two_processes
    watch = peers.PeerWatch(0.2, resume_hint=lambda: "")
    watch.start()
    watch.finish()
    watch.join(timeout=1)
    assert not watch.is_alive() and store.values["jax_transformer/finished/0"] == "1"
