"""Torch plugin: node counts, PET_* env, nproc resolution, ports (spec §4.2, §8.1)."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import (container, container_of, env_of, find, job, parallelism, torch_runtime,
                                        trainjob)
from trainyard.pipeline import plan, validate_trainjob

RANK = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}


def torch_plan(trainer: dict[str, Any] | None, runtime: dict[str, Any] | None = None, **spec: Any) -> dict:
    job_doc = trainjob(**({"trainer": trainer} if trainer is not None else {}), **spec)
    result = plan(job_doc, runtime or torch_runtime([job("node", container("node"), ancestor="trainer")]))
    return find(result.objects, "JobSet")


@pytest.mark.parametrize("resources, nproc, expected", [
    pytest.param(None, "auto", "1", id="auto-no-resources-gives-1"),
    pytest.param({"requests": {"cpu": "4"}}, "auto", "4", id="auto-cpu-request-4"),
    pytest.param({}, "auto", "1", id="auto-empty-resources-block"),
    pytest.param({"limits": {"cpu": "2.5"}}, "auto", "3", id="auto-fractional-cpu-rounds-up"),
    pytest.param({"limits": {"cpu": "2500m"}}, "auto", "3", id="auto-millicores-round-up"),
    pytest.param({"limits": {"cpu": "0.7"}}, "auto", "1", id="auto-below-one-cpu"),
    pytest.param({"limits": {"example.com/gpu": 2}}, "auto", "auto", id="auto-with-gpu-stays-auto"),
    pytest.param({"limits": {"cpu": "8"}}, 3, "3", id="explicit-int-preserved"),
    pytest.param({"limits": {"cpu": "6", "example.com/gpu": 2}}, "cpu", "6", id="cpu-wins-over-gpu"),
    pytest.param({"limits": {"cpu": "3.7"}}, "cpu", "4", id="cpu-fractional"),
    pytest.param({"limits": {"nvidia.com/gpu": 8}}, "gpu", "gpu", id="gpu-stays-gpu"),
    pytest.param({}, "gpu", "gpu", id="gpu-without-gpus-stays-gpu"),
    pytest.param({"requests": {"cpu": "0"}, "limits": {"cpu": "5"}}, "cpu", "5", id="zero-request-falls-back-to-limit"),
    pytest.param({"requests": {"amd.com/gpu": 0}, "limits": {"amd.com/gpu": 4}}, "auto", "auto",
                 id="zero-gpu-request-uses-gpu-limit"),
])
def test_num_proc_per_node_resolution(resources: Any, nproc: Any, expected: str) -> None:
    trainer: dict[str, Any] = {"numProcPerNode": nproc}
    if resources is not None:
        trainer["resourcesPerNode"] = resources
    env = env_of(container_of(torch_plan(trainer), "node"))
    assert env["PET_NPROC_PER_NODE"] == expected


def test_trainjob_num_nodes_wins_over_runtime_and_sets_distributed_env() -> None:
    jobset = torch_plan({"numNodes": 2})
    node = container_of(jobset, "node")
    assert parallelism(jobset, "node") == 2
    assert env_of(node) == {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": RANK,
                            "PET_MASTER_ADDR": "test-job-node-0-0.test-job", "PET_MASTER_PORT": "29500"}
    assert node["ports"] == [{"containerPort": 29500}]


def test_runtime_num_nodes_used_when_trainjob_does_not_set_it() -> None:
    runtime = torch_runtime([job("node", container("node"), ancestor="trainer", parallelism=7)], num_nodes=100)
    jobset = torch_plan({}, runtime)
    assert parallelism(jobset, "node") == 100  # mlPolicy.numNodes beats parallelism for the trainer job
    assert env_of(container_of(jobset, "node"))["PET_NNODES"] == "100"


def test_env_order_runtime_first_then_trainjob_then_pet() -> None:
    runtime = torch_runtime([job("node", container("node", env=[{"name": "TRAIN_JOB", "value": "original"},
                                                                   {"name": "RUNTIME", "value": "test:runtime"}],
                                                        resources={"requests": {"cpu": 1}}),
                                 ancestor="trainer")], num_nodes=100)
    jobset = torch_plan({"env": [{"name": "TRAIN_JOB", "value": "override"},
                                 {"name": "TRAIN_JOB_CUSTOM", "value": "test:trainjob"}],
                         "image": "ti", "command": ["c"], "args": ["a"]}, runtime)
    node = container_of(jobset, "node")
    assert [e["name"] for e in node["env"]] == ["TRAIN_JOB", "RUNTIME", "TRAIN_JOB_CUSTOM", "PET_NNODES",
                                               "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                                               "PET_MASTER_PORT"]
    assert env_of(node)["TRAIN_JOB"] == "override" and env_of(node)["PET_NPROC_PER_NODE"] == "1"
    assert (node["image"], node["command"], node["args"]) == ("ti", ["c"], ["a"])


def test_no_trainer_section_injects_nothing() -> None:
    jobset = torch_plan(None)
    node = container_of(jobset, "node")
    assert "env" not in node and "ports" not in node
    assert parallelism(jobset, "node") == 1


def test_zero_nodes_passes_through() -> None:
    jobset = torch_plan({"numNodes": 0})
    assert parallelism(jobset, "node") == 0
    assert env_of(container_of(jobset, "node"))["PET_NNODES"] == "0"


def test_master_address_uses_literal_node_even_for_other_job_names_and_subdomains() -> None:
    runtime = torch_runtime([job("trainer-job", container("node"), ancestor="trainer")],
                            jobset_spec={"network": {"subdomain": "custom"}})
    jobset = torch_plan({"numNodes": 1}, runtime)
    assert env_of(container_of(jobset, "trainer-job"))["PET_MASTER_ADDR"] == "test-job-node-0-0.test-job"


def test_existing_unnamed_port_is_kept_beside_29500() -> None:
    # Deliberate deviation: upstream would replace the unnamed 8080 by 29500.
    runtime = torch_runtime([job("node", container("node", ports=[{"containerPort": 8080}]), ancestor="trainer")])
    node = container_of(torch_plan({}, runtime), "node")
    assert node["ports"] == [{"containerPort": 8080}, {"containerPort": 29500}]


def test_runtime_port_29500_is_not_duplicated() -> None:
    runtime = torch_runtime([job("node", container("node", ports=[{"containerPort": 29500, "name": "c10d"}]),
                                 ancestor="trainer")])
    assert container_of(torch_plan({}, runtime), "node")["ports"] == [{"containerPort": 29500}]


@pytest.mark.parametrize("command", [["tune", "run", "x"], ["tune"], ["torchrun"]])
def test_only_exact_tune_run_enables_torchtune(command: list[str]) -> None:
    node = container_of(torch_plan({"command": command}), "node")
    assert node["command"] == command
    assert env_of(node)["PET_MASTER_PORT"] == "29500"


def test_env_value_from_keeps_only_upstream_fields() -> None:
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
           {"name": "EMPTY", "value": ""}]
    node = container_of(torch_plan({"env": env}), "node")
    assert node["env"][:2] == [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                               {"name": "EMPTY", "value": ""}]


@pytest.mark.parametrize("trainer, expected", [
    pytest.param({}, [], id="no-nproc-no-checks"),
    pytest.param({"numProcPerNode": "npu"},
                 ['spec.trainer.numProcPerNode: Invalid value: "npu": must have an int value or [auto cpu gpu]'],
                 id="invalid-string"),
    # v2.1.0 let this pass (checks only ran with numProcPerNode set); v2.3.0 checks every trainer.
    pytest.param({"env": [{"name": "PET_NODE_RANK", "value": "1"}]},
                 ['spec.trainer.env: Invalid value: [{"name":"PET_NODE_RANK","value":"1"}]: '
                  "must not have reserved envs, invalid envs configured: [PET_NODE_RANK]"],
                 id="reserved-env-without-nproc-rejected-as-v2.3"),
    pytest.param({"numProcPerNode": "auto", "env": [{"name": "PET_NPROC_PER_NODE", "value": "1"}]},
                 ["spec.trainer.env: Invalid value: [{\"name\":\"PET_NPROC_PER_NODE\",\"value\":\"1\"}]: "
                  "must not have reserved envs, invalid envs configured: [PET_NPROC_PER_NODE]"],
                 id="reserved-env"),
    pytest.param({"numProcPerNode": 4, "env": [{"name": "PET_NODE_RANK"}, {"name": "PET_MASTER_ADDR"}]},
                 ['spec.trainer.env: Invalid value: [{"name":"PET_NODE_RANK"},{"name":"PET_MASTER_ADDR"}]: '
                  "must not have reserved envs, invalid envs configured: [PET_MASTER_ADDR PET_NODE_RANK]"],
                 id="reserved-envs-sorted"),
    pytest.param({"numProcPerNode": -3}, [], id="negative-int-not-checked"),
])
def test_torch_admission(trainer: dict[str, Any], expected: list[str]) -> None:
    runtime = torch_runtime([job("node", container("node"), ancestor="trainer")])
    result = validate_trainjob(trainjob(trainer=trainer), runtime=runtime)
    assert result.texts() == expected
    assert result.allowed == (not expected)
