"""Where a --distributed process learns its place in the run: flags, else JAX's
environment variables (read by train.py: JAX reads only the coordinator's address),
else the cluster; refusals name the flag or variable."""

from __future__ import annotations

import pytest

from jax_transformer.train import distributed
from jax_transformer.train.settings import TrainSettings
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
