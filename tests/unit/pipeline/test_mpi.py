"""MPI plugin: counts, slots, SSH Secret, hostfile, OpenMPI env, checks (spec §4.4, §8.2)."""
from __future__ import annotations

import base64
from typing import Any

import pytest

from fixtures.pipeline_builders import (container, container_of, env_of, find, fixed_ssh_key, job, parallelism,
                                        pod_spec, runtime, trainjob)
from trainyard.pipeline import ObservedState, PlanningError, plan, validate_trainjob

OMPI = ["OMPI_MCA_orte_default_hostfile", "OMPI_MCA_orte_keep_fqdn_hostnames", "OMPI_MCA_orte_set_default_slots",
        "OMPI_MCA_plm_rsh_args"]


def mpi_runtime(jobs: list[dict[str, Any]] | None = None, num_nodes: int | None = None, **mpi: Any) -> dict:
    policy: dict[str, Any] = {"mpi": mpi}
    if num_nodes is not None:
        policy["numNodes"] = num_nodes
    jobs = jobs if jobs is not None else [job("launcher", container("node")),
                                          job("node", container("node"), ancestor="trainer")]
    return runtime(jobs, ml_policy=policy)


def mpi_plan(trainer: dict[str, Any] | None, rt: dict[str, Any], observed: Any = ()) -> dict[str, dict]:
    job_doc = trainjob(**({"trainer": trainer} if trainer is not None else {}))
    objects = plan(job_doc, rt, observed, new_ssh_key=fixed_ssh_key).objects
    return {obj["kind"]: obj for obj in objects}


def test_num_nodes_respected_and_volumes_mounted() -> None:
    out = mpi_plan({"numNodes": 2}, mpi_runtime())
    jobset = out["JobSet"]
    assert parallelism(jobset, "node") == 2 and parallelism(jobset, "launcher") == 1
    assert [v["name"] for v in pod_spec(jobset, "launcher")["volumes"]] == ["mpi-ssh-auth", "mpi-hostfile"]
    assert [v["name"] for v in pod_spec(jobset, "node")["volumes"]] == ["mpi-ssh-auth"]
    assert pod_spec(jobset, "launcher")["volumes"][1]["configMap"] == {
        "name": "test-job-mpi-hostfile", "items": [{"key": "hostfile", "path": "hostfile", "mode": 292}]}
    # v2.3.0's file modes: 0640 for the private key, 0644 for the public ones, 0400 otherwise.
    assert pod_spec(jobset, "node")["volumes"][0]["secret"]["items"] == [
        {"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
        {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
        {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644}]
    assert pod_spec(jobset, "node")["volumes"][0]["secret"]["defaultMode"] == 0o400
    assert container_of(jobset, "launcher")["volumeMounts"] == [
        {"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}, {"name": "mpi-hostfile", "mountPath": "/etc/mpi"}]
    assert container_of(jobset, "node")["volumeMounts"] == [{"name": "mpi-ssh-auth", "mountPath": "/root/.ssh"}]
    assert out["ConfigMap"]["data"]["hostfile"] == ("test-job-node-0-0.test-job slots=1\n"
                                                   "test-job-node-0-1.test-job slots=1\n")


def test_secret_shape() -> None:
    secret = mpi_plan({"numNodes": 2}, mpi_runtime())["Secret"]
    assert secret["metadata"]["name"] == "test-job-mpi-ssh-auth"
    assert secret["type"] == "kubernetes.io/ssh-auth" and secret["immutable"] is True
    assert base64.b64decode(secret["data"]["ssh-publickey"]) == b"ecdsa-sha2-nistp521 fixed\n"
    assert secret["metadata"]["ownerReferences"][0]["controller"] is True


def test_real_key_is_ecdsa_p521_pem() -> None:
    job_doc = trainjob(trainer={"numNodes": 1})
    secret = find(plan(job_doc, mpi_runtime()).objects, "Secret")
    private = base64.b64decode(secret["data"]["ssh-privatekey"]).decode()
    public = base64.b64decode(secret["data"]["ssh-publickey"]).decode()
    assert private.startswith("-----BEGIN EC PRIVATE KEY-----")
    assert public.startswith("ecdsa-sha2-nistp521 ") and public.endswith("\n")


@pytest.mark.parametrize("trainer, runtime_slots, expected", [
    pytest.param({"numNodes": 2, "numProcPerNode": 2}, 1, "2", id="trainjob-nproc-wins"),
    pytest.param({"resourcesPerNode": {"requests": {"custom.com/gpu": 5}}}, 1, "5", id="gpus-when-runtime-is-1"),
    pytest.param({"resourcesPerNode": {"requests": {"custom.com/gpu": 5}}}, 3, "3", id="runtime-slots-not-1"),
    pytest.param({"resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}}}, 1, "1", id="one-gpu-keeps-1"),
])
def test_slots(trainer: dict[str, Any], runtime_slots: int, expected: str) -> None:
    out = mpi_plan(trainer, mpi_runtime(numProcPerNode=runtime_slots))
    assert env_of(container_of(out["JobSet"], "launcher"))["OMPI_MCA_orte_set_default_slots"] == expected
    assert out["ConfigMap"]["data"]["hostfile"].endswith(f"slots={expected}\n")


def test_run_launcher_as_node_counts_hosts_and_env() -> None:
    out = mpi_plan({"numNodes": 10}, mpi_runtime(runLauncherAsNode=True))
    jobset = out["JobSet"]
    assert parallelism(jobset, "node") == 9
    launcher = container_of(jobset, "launcher")
    assert [e["name"] for e in launcher["env"]] == OMPI
    assert env_of(launcher)["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env_of(launcher)["OMPI_MCA_plm_rsh_args"] == "-o ConnectionAttempts=10"
    lines = out["ConfigMap"]["data"]["hostfile"].splitlines()
    assert lines[0] == "test-job-launcher-0-0.test-job slots=1" and len(lines) == 10


def test_existing_secret_is_reused() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret",
              "metadata": {"name": "test-job-mpi-ssh-auth", "namespace": "default"}}
    out = mpi_plan({"numNodes": 2}, mpi_runtime(), [secret])
    assert set(out) == {"ConfigMap", "JobSet"}


def test_secret_read_error_aborts_planning() -> None:
    state = ObservedState.of(read_errors={("v1", "Secret", "default", "test-job-mpi-ssh-auth"): "boom"})
    with pytest.raises(PlanningError, match="boom"):
        plan(trainjob(trainer={"numNodes": 2}), mpi_runtime(), state, new_ssh_key=fixed_ssh_key)


def test_deepspeed_shape_resources_and_env_reach_node_job() -> None:
    jobs = [job("launcher", container("node"), ancestor="trainer"),
            job("node", container("node", image="test:openssh", command=["/usr/sbin/sshd"], args=["-De"]),
                ancestor="user-specified")]
    rt = mpi_runtime(jobs, num_nodes=1, runLauncherAsNode=True)
    trainer = {"numNodes": 100, "image": "test:trainjob", "command": ["trainjob"], "args": ["trainjob"],
               "resourcesPerNode": {"requests": {"cpu": 1, "memory": "4Gi"}}, "env": [{"name": "A", "value": "1"}]}
    jobset = mpi_plan(trainer, rt)["JobSet"]
    launcher, node = container_of(jobset, "launcher"), container_of(jobset, "node")
    assert (parallelism(jobset, "launcher"), parallelism(jobset, "node")) == (1, 99)
    assert (launcher["image"], launcher["command"], launcher["args"]) == ("test:trainjob", ["trainjob"], ["trainjob"])
    assert (node["image"], node["command"], node["args"]) == ("test:openssh", ["/usr/sbin/sshd"], ["-De"])
    assert node["resources"] == launcher["resources"] == {"requests": {"cpu": 1, "memory": "4Gi"}}
    assert [e["name"] for e in launcher["env"]] == [*OMPI, "A"]
    assert env_of(node) == {"A": "1"}


def test_launcher_count_comes_from_ml_policy_when_labeled_trainer() -> None:
    jobs = [job("launcher", container("node"), ancestor="trainer"), job("node", container("node"))]
    jobset = mpi_plan({}, mpi_runtime(jobs, num_nodes=4))["JobSet"]
    assert (parallelism(jobset, "launcher"), parallelism(jobset, "node")) == (4, 1)


def test_hostfile_follows_num_nodes_even_while_jobset_runs() -> None:
    running = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
               "metadata": {"name": "test-job", "namespace": "default"}, "spec": {"suspend": False}}
    out = mpi_plan({"numNodes": 3}, mpi_runtime(), [running])
    assert "JobSet" not in out
    assert out["ConfigMap"]["data"]["hostfile"].count("\n") == 3


def test_subdomain_used_for_hostfile() -> None:
    rt = mpi_runtime(runLauncherAsNode=True)
    rt["spec"]["template"]["spec"]["network"] = {"subdomain": "kubeflow.org"}
    out = mpi_plan({"numNodes": 2}, rt)
    assert out["ConfigMap"]["data"]["hostfile"] == ("test-job-launcher-0-0.kubeflow.org slots=1\n"
                                                   "test-job-node-0-0.kubeflow.org slots=1\n")


def test_empty_mpi_implementation_fails_planning() -> None:
    with pytest.raises(PlanningError, match="MPI implementation for  doesn't supported"):
        plan(trainjob(trainer={}), mpi_runtime(mpiImplementation=""), new_ssh_key=fixed_ssh_key)


@pytest.mark.parametrize("jobs, trainer, expected", [
    pytest.param(None, {"numProcPerNode": "invalid"},
                 ['spec.trainer.numProcPerNode: Invalid value: "invalid": must have an int value for MPI TrainJob'],
                 id="string-nproc"),
    pytest.param(None, {"numProcPerNode": 8}, [], id="int-nproc"),
    pytest.param([job("node", container("node"))], {"numNodes": 1}, [], id="no-launcher-one-node-ok"),
    pytest.param([job("node", container("node"))], {"numNodes": 2},
                 ["spec.trainer.numNodes: Invalid value: 2: must have 1 when MPI trainingRuntime with enabled "
                  "runLauncherAsNode does not have either launcher and node"], id="no-launcher"),
    pytest.param([job("launcher", container("node"))], {"numNodes": 2},
                 ["spec.trainer.numNodes: Invalid value: 2: must have 1 when MPI trainingRuntime with enabled "
                  "runLauncherAsNode does not have either launcher and node"], id="no-node"),
])
def test_mpi_admission(jobs: Any, trainer: dict[str, Any], expected: list[str]) -> None:
    result = validate_trainjob(trainjob(trainer=trainer), runtime=mpi_runtime(jobs, runLauncherAsNode=True))
    assert result.texts() == expected
