"""Where a --distributed process learns its place in the run: flags, else JAX's
environment variables (read by train.py: JAX reads only the coordinator's address),
else the cluster; refusals name the flag or variable."""

from __future__ import annotations

import pytest

from jax_transformer.train import distributed
from jax_transformer.train.settings.training import TrainSettings
from transformer_core.errors import TrainError
from tests.train.runs import tiny_settings

ENV = {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAX_NUM_PROCESSES": "4",
       "JAX_PROCESS_ID": "3"}


def test_the_environment_gives_what_no_flag_does():
    given = distributed.coordinates(TrainSettings(distributed=True, process_id=2), ENV)
    assert (given["coordinator_address"], given["num_processes"], given["process_id"]) == (
        "10.0.0.1:1234", 4, 2)
    assert given["process_id_source"] == "--process-id"
    assert given["num_processes_source"] == "JAX_NUM_PROCESSES"


def test_nothing_given_leaves_it_to_the_cluster():
    given = distributed.coordinates(TrainSettings(distributed=True), {})
    assert (given["coordinator_address"], given["num_processes"], given["process_id"]) == (
        None, None, None)


@pytest.mark.parametrize("settings, env, message", [
    ({}, {**ENV, "JAX_NUM_PROCESSES": "two"}, "JAX_NUM_PROCESSES must be a whole number, "
                                               "got 'two'"),
    ({}, {**ENV, "JAX_PROCESS_ID": "4"}, "JAX_PROCESS_ID must be from 0 to 3, got 4"),
    ({"num_processes": 0}, {}, "--num-processes must be at least 1, got 0"),
    ({"process_id": -1}, {}, "--process-id must be from 0 to the number of processes - 1, "
                             "got -1"),
])
def test_a_bad_place_names_where_it_came_from(settings, env, message):
    with pytest.raises(TrainError, match=f"^{message}$"):
        distributed.coordinates(TrainSettings(distributed=True, **settings), env)


def test_a_process_placed_among_several_needs_distributed():
    with pytest.raises(TrainError, match="JAX_NUM_PROCESSES=2 places this process in a run of "
                                         "2 processes: add --distributed"):
        distributed.check_environment(TrainSettings(), {"JAX_NUM_PROCESSES": "2"})
    distributed.check_environment(TrainSettings(), {"JAX_NUM_PROCESSES": "1"})


def test_coordinator_flags_without_distributed_are_refused(tmp_path):
    with pytest.raises(TrainError, match="--num-processes --process-id place this process in "
                                         "a distributed run: add --distributed"):
        tiny_settings(tmp_path, "--num-processes", "2", "--process-id", "0")


# Where the bind-address choice looks names up, and which addresses it takes for this
# host's: documentation addresses (198.51.100.0/24, 2001:db8::/32) and loopback ones; no
# socket is opened on them.
RESOLVES = {"node0": ["198.51.100.10"], "node9": ["198.51.100.99"],
            "localhost": ["127.0.0.1", "::1"],
            "debian-host": ["127.0.1.1"]}  # Debian's /etc/hosts line for the host's name
THIS_HOSTS = {"198.51.100.10", "2001:db8::10", "127.0.0.1", "127.0.1.1", "::1"}


def resolve(host: str) -> list[str]:
    if distributed.loopback(host) or ":" in host or host[0].isdigit():
        return [host]  # an address resolves to itself
    if host not in RESOLVES:
        raise OSError(-2, "Name or service not known")
    return RESOLVES[host]


def bind(address: str | None, process_id: int | None = 0, all_interfaces: bool = False,
         environ: dict | None = None, warnings: list | None = None) -> str | None:
    given = {"coordinator_address": address, "coordinator_address_source": "--coordinator-address",
             "process_id": process_id}
    return distributed.bind_address(given, all_interfaces, environ or {}, addresses=resolve,
                                    ours=THIS_HOSTS.__contains__,
                                    warn=(warnings if warnings is not None else []).append)


@pytest.mark.parametrize("address", ["198.51.100.10:1234", "node0:1234", "[2001:db8::10]:1234",
                                     "127.0.0.1:1234", "localhost:1234", "[::1]:1234"])
def test_the_coordinator_listens_on_the_address_it_is_given(address):
    """Before: on every interface ([::]:1234, JAX's default) unless the address was
    127.0.0.1, localhost or ::1."""
    assert bind(address) == address


def test_every_interface_only_when_asked():
    assert bind("198.51.100.10:1234", all_interfaces=True) == "[::]:1234"
    assert bind("198.51.100.10:1234", all_interfaces=True, environ={
        "JAX_COORDINATOR_BIND_ADDRESS": "198.51.100.10:1234"}) == "[::]:1234"  # the flag wins
    assert bind("node0:1234", environ={"JAX_COORDINATOR_BIND_ADDRESS": "[::]:1234"}) == (
        "[::]:1234")  # JAX's own variable, set by the user
    assert bind(None) is None  # the cluster's address: JAX's choice


def test_processes_other_than_0_take_the_address_as_given_unresolved():
    def never(host):
        raise AssertionError(f"{host} looked up on a process that does not listen")
    given = {"coordinator_address": "node9:1234",
             "coordinator_address_source": "--coordinator-address", "process_id": 1}
    assert distributed.bind_address(given, False, {}, addresses=never, ours=never) == "node9:1234"
    # a process without a number may be process 0: JAX's error stays possible
    assert bind("198.51.100.99:1234", process_id=None) == "198.51.100.99:1234"


@pytest.mark.parametrize("address, message", [
    ("198.51.100.99:1234", "--coordinator-address 198.51.100.99:1234: process 0 serves the "
                           "coordinator there, but 198.51.100.99 is not an address of its "
                           "host: give one of this host's addresses, or choose where it "
                           "listens with JAX_COORDINATOR_BIND_ADDRESS or "
                           "--coordinator-bind-all-interfaces"),
    ("node9:1234", "--coordinator-address node9:1234: process 0 serves the coordinator there, "
                   "but node9 is not an address of its host (it resolves to 198.51.100.99): "),
    ("nowhere:1234", "--coordinator-address nowhere:1234: nowhere does not resolve on "
                     "process 0's host (Name or service not known)"),
])
def test_process_0_given_another_hosts_address_is_refused(address, message):
    """Before: JAX bound every interface (a name) or failed with `JaxRuntimeError: UNKNOWN:
    Failed to start RPC server` (an address given as JAX_COORDINATOR_BIND_ADDRESS)."""
    with pytest.raises(TrainError) as refused:
        bind(address)
    assert str(refused.value).startswith(message)


def test_a_name_that_resolves_to_loopback_only_is_a_warning():
    warnings = []
    assert bind("debian-host:1234", warnings=warnings) == "debian-host:1234"
    assert warnings == [
        "warning: --coordinator-address debian-host:1234: debian-host resolves to 127.0.1.1 "
        "here, a loopback address: the coordinator listens there, where only this host's "
        "processes can connect; for processes on other hosts, give this host's network address "
        "(or --coordinator-bind-all-interfaces)"]
    bind("localhost:1234", warnings=warnings)
    assert len(warnings) == 1


def test_this_hosts_addresses_are_the_ones_a_socket_binds_to():
    """Nothing is connected: a bind to 240.0.0.1 (reserved, no host's address) fails."""
    assert distributed.this_hosts("127.0.0.1")
    assert not distributed.this_hosts("240.0.0.1")
    assert not distributed.this_hosts("0.0.0.0") and not distributed.this_hosts("::")  # all
    assert distributed.host_addresses("127.0.0.1") == ["127.0.0.1"]
    assert distributed.loopback("127.0.1.1") and distributed.loopback("::1")
    assert not distributed.loopback("198.51.100.10") and not distributed.loopback("localhost")


def test_binding_every_interface_is_a_flag_of_distributed_runs(tmp_path):
    settings = tiny_settings(tmp_path, "--distributed", "--coordinator-bind-all-interfaces")
    assert settings.train.coordinator_bind_all_interfaces
    with pytest.raises(TrainError, match="--coordinator-bind-all-interfaces place this process "
                                         "in a distributed run: add --distributed"):
        tiny_settings(tmp_path, "--coordinator-bind-all-interfaces")
