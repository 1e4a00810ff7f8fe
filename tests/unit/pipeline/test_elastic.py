"""Elastic PyTorch planning and admission (issue #17): bounds, env, gang minimum, fault
tolerance, resize of a running JobSet, the HorizontalPodAutoscaler."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from fixtures.pipeline_builders import (container, container_of, env_of, find, job, pod_spec, replicated_job,
                                        runtime, trainjob)
from trainyard.pipeline import validate_trainjob
from fixtures.pipeline_builders import plan_past_snapshot as plan  # the plugins' objects (test_snapshot.py)


RANK = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
HPA = "autoscaling/v2"


def elastic_runtime(policy: dict[str, Any] | None = None, *, pod_group_policy: dict[str, Any] | None = None,
                    jobset_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    policy = {"minNodes": 1, "maxNodes": 4, "maxRestarts": 3} if policy is None else policy
    return runtime([job("node", container("node"), ancestor="trainer")],
                   ml_policy={"torch": {"numProcPerNode": 2, "elasticPolicy": policy}},
                   pod_group_policy=pod_group_policy, jobset_spec=jobset_spec)


def elastic_job(num_nodes: int | None = 2, **spec: Any) -> dict[str, Any]:
    trainer = {"numNodes": num_nodes} if num_nodes is not None else {}
    return trainjob(trainer=trainer, **spec)


def test_elastic_env_replaces_fixed_rank_and_master() -> None:
    jobset = find(plan(elastic_job(2), elastic_runtime()).objects, "JobSet")
    env = env_of(container_of(jobset, "node"))
    assert env == {"PET_NNODES": "1:4", "PET_NPROC_PER_NODE": "2", "PET_MAX_RESTARTS": "3",
                   "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "test-job-node-0-0.test-job:29500",
                   "PET_RDZV_ID": "uid-1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    assert container_of(jobset, "node")["ports"] == [{"containerPort": 29500}]
    spec = replicated_job(jobset, "node")["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (2, 2)


@pytest.mark.parametrize("policy, num_nodes, nnodes, restarts", [
    pytest.param({"minNodes": 2, "maxNodes": 8}, 3, "2:8", None, id="no-maxRestarts-no-env"),
    pytest.param({"maxNodes": 5, "maxRestarts": 0}, 3, "3:5", "0", id="absent-minNodes-pinned-to-numNodes"),
    pytest.param({"minNodes": 1}, 3, "1:3", None, id="absent-maxNodes-pinned-to-numNodes"),
    pytest.param({"maxRestarts": 2}, 2, "2:2", "2", id="no-bounds-fixed-size-fault-tolerant"),
])
def test_bounds_and_restart_env(policy: dict[str, Any], num_nodes: int, nnodes: str, restarts: str | None) -> None:
    jobset = find(plan(elastic_job(num_nodes), elastic_runtime(policy)).objects, "JobSet")
    env = env_of(container_of(jobset, "node"))
    assert env["PET_NNODES"] == nnodes
    assert env.get("PET_MAX_RESTARTS") == restarts
    assert "PET_NODE_RANK" not in env and "PET_MASTER_ADDR" not in env


def test_rendezvous_id_is_the_name_without_uid() -> None:
    doc = elastic_job(2)
    del doc["metadata"]["uid"]
    jobset = find(plan(doc, elastic_runtime()).objects, "JobSet")
    assert env_of(container_of(jobset, "node"))["PET_RDZV_ID"] == "test-job"


def test_fault_tolerance_fields_make_torchrun_budget_final() -> None:
    rt = elastic_runtime(jobset_spec={"failurePolicy": {"maxRestarts": 5}})
    jobset = find(plan(elastic_job(2), rt).objects, "JobSet")
    job_spec = replicated_job(jobset, "node")["template"]["spec"]
    assert pod_spec(jobset, "node")["restartPolicy"] == "Never"
    assert job_spec["backoffLimit"] == 3
    assert job_spec["podFailurePolicy"] == {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [137, 143]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}
    assert "failurePolicy" not in jobset["spec"]  # JobSet restarts would recreate every pod
    assert jobset["metadata"]["annotations"]["trainyard.kubeflow.org/elastic-policy"] == \
        '{"maxNodes":4,"maxRestarts":3,"minNodes":1}'


def test_non_elastic_torch_plan_keeps_fixed_env_and_no_elastic_fields() -> None:
    rt = runtime([job("node", container("node"), ancestor="trainer")], ml_policy={"torch": {"numProcPerNode": 2}})
    jobset = find(plan(elastic_job(2), rt).objects, "JobSet")
    env = env_of(container_of(jobset, "node"))
    assert env["PET_NNODES"] == "2" and env["PET_NODE_RANK"] == RANK
    assert "restartPolicy" not in pod_spec(jobset, "node")
    assert "podFailurePolicy" not in replicated_job(jobset, "node")["template"]["spec"]
    assert "annotations" not in jobset["metadata"]


@pytest.mark.parametrize("group_policy, api_version, field", [
    ({"coscheduling": {}}, "scheduling.x-k8s.io/v1alpha1", "minMember"),
    ({"volcano": {}}, "scheduling.volcano.sh/v1beta1", "minMember"),
])
def test_gang_admits_min_nodes(group_policy: dict[str, Any], api_version: str, field: str) -> None:
    rt = elastic_runtime({"minNodes": 2, "maxNodes": 6}, pod_group_policy=group_policy)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0][
        "resources"] = {"requests": {"cpu": "500m"}}
    group = find(plan(elastic_job(5), rt).objects, "PodGroup", api_version)
    assert group["spec"][field] == 2  # minNodes, not the current 5
    assert group["spec"]["minResources"] == {"cpu": "1"}


@pytest.mark.parametrize("num_nodes, text", [
    (None, "spec.trainer.numNodes: Required value: required when the runtime's torch elasticPolicy is set "
           "(between minNodes (1) and maxNodes (4))"),
    (0, "spec.trainer.numNodes: Invalid value: 0: must be between minNodes (1) and maxNodes (4) of the "
        "runtime's torch elasticPolicy"),
    (5, "spec.trainer.numNodes: Invalid value: 5: must be between minNodes (1) and maxNodes (4) of the "
        "runtime's torch elasticPolicy"),
])
def test_create_refused_outside_bounds(num_nodes: int | None, text: str) -> None:
    result = validate_trainjob(elastic_job(num_nodes), runtime=elastic_runtime())
    assert not result.allowed and result.code == 403
    assert result.texts() == [text]


@pytest.mark.parametrize("old, new, text", [
    pytest.param(2, 4, None, id="grow-within-bounds"),
    pytest.param(2, 1, None, id="shrink-to-min"),
    pytest.param(2, 5, "spec.trainer.numNodes: Invalid value: 5: must be between minNodes (1) and maxNodes (4) "
                       "of the runtime's torch elasticPolicy", id="grow-past-max"),
])
def test_resize_bounds(old: int, new: int, text: str | None) -> None:
    result = validate_trainjob(elastic_job(new), elastic_job(old), runtime=elastic_runtime())
    assert result.texts() == ([text] if text else [])


def test_resize_toward_an_absent_bound_is_refused() -> None:
    result = validate_trainjob(elastic_job(3), elastic_job(2), runtime=elastic_runtime({"minNodes": 1}))
    assert result.texts() == ["spec.trainer.numNodes: Invalid value: 3: the runtime's torch elasticPolicy sets "
                              "no maxNodes, so numNodes cannot grow beyond 2"]
    assert validate_trainjob(elastic_job(1), elastic_job(2), runtime=elastic_runtime({"minNodes": 1})).allowed


def test_resize_of_non_elastic_runtime_stays_immutable() -> None:
    rt = runtime([job("node", container("node"), ancestor="trainer")], ml_policy={"torch": {}})
    result = validate_trainjob(elastic_job(3), elastic_job(2), runtime=rt)
    assert [t.split(":")[0] + ":" + t.rsplit(":", 1)[1] for t in result.texts()] == \
        ["spec.trainer: field is immutable"]


def running_jobset(size: int, **status: Any) -> dict[str, Any]:
    doc = find(plan(elastic_job(size), elastic_runtime()).objects, "JobSet")
    doc = copy.deepcopy(doc)
    doc["status"] = status
    return doc


def test_running_elastic_jobset_is_resized_and_otherwise_left_alone() -> None:
    existing = running_jobset(2)
    assert plan(elastic_job(2), elastic_runtime(), [existing]).objects == ()
    resized = find(plan(elastic_job(3), elastic_runtime(), [existing]).objects, "JobSet")
    before = copy.deepcopy(existing)
    del before["status"]
    spec = replicated_job(resized, "node")["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (3, 3)
    # Nothing else changes: the data plane accepts only parallelism and completions.
    for doc in (resized, before):
        inner = replicated_job(doc, "node")["template"]["spec"]
        inner.pop("parallelism"), inner.pop("completions")
    assert resized == before


def test_finished_jobset_is_never_resized() -> None:
    existing = running_jobset(2, conditions=[{"type": "Completed", "status": "True"}])
    assert plan(elastic_job(3), elastic_runtime(), [existing]).objects == ()


def test_hpa_from_metrics() -> None:
    metrics = [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization",
                                                                         "averageUtilization": 80}}}]
    result = plan(elastic_job(2), elastic_runtime({"minNodes": 1, "maxNodes": 4, "metrics": metrics}))
    assert [o["kind"] for o in result.objects] == ["HorizontalPodAutoscaler", "JobSet"]
    assert find(result.objects, "HorizontalPodAutoscaler", HPA) == {
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "test-job", "namespace": "default", "ownerReferences": [
            {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "test-job", "uid": "uid-1",
             "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"scaleTargetRef": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                    "name": "test-job"},
                 "minReplicas": 1, "maxReplicas": 4, "metrics": metrics},
    }


def test_no_hpa_without_metrics() -> None:
    result = plan(elastic_job(2), elastic_runtime({"minNodes": 1, "maxNodes": 4, "metrics": []}))
    assert [o["kind"] for o in result.objects] == ["JobSet"]


def test_status_shows_sizes_selector_and_says_why_it_failed() -> None:
    from trainyard.pipeline import compute_trainjob_status

    jobset = running_jobset(2)
    status = compute_trainjob_status(elastic_job(3), jobset, "2026-01-01T00:00:00Z")
    assert status["elastic"] == {"currentNodes": 2, "desiredNodes": 3, "minNodes": 1, "maxNodes": 4,
                                 "selector": "jobset.sigs.k8s.io/jobset-name=test-job,"
                                             "jobset.sigs.k8s.io/replicatedjob-name=node"}
    failed = running_jobset(2, conditions=[{
        "type": "Failed", "status": "True", "reason": "FailedJobs", "lastTransitionTime": "2026-01-01T00:00:00Z",
        "message": "jobset failed due to one or more job failures (first failed job: test-job-node-0)"}])
    condition = compute_trainjob_status(elastic_job(2), failed, "2026-01-01T00:00:01Z")["conditions"][0]
    assert (condition["type"], condition["reason"]) == ("Failed", "ElasticRestartsExhausted")
    assert condition["message"] == (
        "torchrun exited non-zero after spending its restart budget (maxRestarts: 3), or the trainer pods "
        "were lost more often than that budget allows: jobset failed due to one or more job failures "
        "(first failed job: test-job-node-0)")
