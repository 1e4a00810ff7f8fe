"""CoScheduling and Volcano PodGroups (spec §4.7, §4.8, §8.4)."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import container, default_jobs, find, job, replicated_job, runtime, trainjob
from trainyard.compat import TrainerCompat
from trainyard.pipeline import ObservedState, PlanningError, plan, validate_trainjob

COSCHED = "scheduling.x-k8s.io/v1alpha1"
VOLCANO = "scheduling.volcano.sh/v1beta1"


def req(cpu: str, memory: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}}


def pod_group(objects: Any, api_version: str) -> dict[str, Any] | None:
    return find(objects, "PodGroup", api_version)


def test_coscheduling_multiple_pod_sets_sum_exactly() -> None:
    jobs = [job("node", container("node", resources=req("500m", "1Gi")), ancestor="trainer", parallelism=2),
            job("dataset-initializer", container("dataset-initializer", resources=req("250m", "512Mi")),
                ancestor="dataset-initializer")]
    rt = runtime(jobs, pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 30}})
    group = pod_group(plan(trainjob(), rt).objects, COSCHED)
    assert group["spec"] == {"minMember": 3, "minResources": {"cpu": "1250m", "memory": "2560Mi"},
                             "scheduleTimeoutSeconds": 30}


def test_coscheduling_no_requests_and_default_timeout() -> None:
    rt = runtime([job("node", container("node"), ancestor="trainer")], pod_group_policy={"coscheduling": {}})
    group = pod_group(plan(trainjob(), rt).objects, COSCHED)
    assert group["spec"] == {"minMember": 1, "minResources": {}, "scheduleTimeoutSeconds": 60}
    assert group["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"


def test_coscheduling_counts_follow_num_nodes_and_label_every_pod() -> None:
    jobs = [job(n, container(n, resources=req("1", "4Gi")), ancestor=a) for n, a in
            (("dataset-initializer", "dataset-initializer"), ("model-initializer", "model-initializer"),
             ("node", "trainer"))]
    jobs[2]["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "node"
    rt = runtime(jobs, ml_policy={"numNodes": 100, "torch": {}},
                 pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 100}})
    objects = plan(trainjob("alpha"), rt).objects
    assert pod_group(objects, COSCHED)["spec"] == {"minMember": 102, "minResources": {"cpu": "102", "memory": "408Gi"},
                                                   "scheduleTimeoutSeconds": 100}
    jobset = find(objects, "JobSet")
    for name in ("dataset-initializer", "model-initializer", "node"):
        labels = replicated_job(jobset, name)["template"]["spec"]["template"]["metadata"]["labels"]
        assert labels == {"scheduling.x-k8s.io/pod-group": "alpha"}


def test_plainml_suspended_num_nodes_and_coscheduling() -> None:
    rt = runtime(default_jobs(req("1", "1Gi")), ml_policy={"numNodes": 100},
                 pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 120}})
    for job_doc in rt["spec"]["template"]["spec"]["replicatedJobs"]:
        for c in job_doc["template"]["spec"]["template"]["spec"]["containers"]:
            c["resources"] = req("1", "1Gi")
    objects = plan(trainjob(suspend=True, trainer={"numNodes": 30}), rt).objects
    spec = pod_group(objects, COSCHED)["spec"]
    assert spec["minMember"] == 32 and spec["minResources"]["cpu"] == "32"


@pytest.mark.parametrize("compat, min_resources", [
    pytest.param(TrainerCompat.V2_1, {"cpu": "1", "memory": "1Gi"}, id="v2.1-runtime-requests-only"),
    pytest.param(TrainerCompat.V2_3, {"cpu": "8", "memory": "64Gi"}, id="v2.3-merged-resources-count"),
])
def test_resources_per_node_in_min_resources(compat: TrainerCompat, min_resources: dict) -> None:
    rt = runtime([job("node", container("node", resources=req("1", "1Gi")), ancestor="trainer")],
                 ml_policy={"torch": {}}, pod_group_policy={"coscheduling": {}})
    objects = plan(trainjob(trainer={"resourcesPerNode": req("8", "64Gi")}), rt, compat=compat).objects
    assert pod_group(objects, COSCHED)["spec"]["minResources"] == min_resources


def test_sidecar_init_container_requests_count() -> None:
    pod = {"initContainers": [{"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "25"}}},
                              {"name": "init", "resources": {"requests": {"cpu": "30"}}}]}
    rt = runtime([job("node", container("node", resources={"requests": {"cpu": "15"}}), ancestor="trainer", pod=pod)],
                 pod_group_policy={"coscheduling": {}})
    assert pod_group(plan(trainjob(), rt).objects, COSCHED)["spec"]["minResources"] == {"cpu": "55"}


@pytest.mark.parametrize("api_version, policy", [(COSCHED, {"coscheduling": {}}), (VOLCANO, {"volcano": {}})])
@pytest.mark.parametrize("suspend, emitted", [(False, False), (True, True)])
def test_existing_pod_group_only_reapplied_while_suspended(api_version: str, policy: dict, suspend: bool,
                                                           emitted: bool) -> None:
    existing = {"apiVersion": api_version, "kind": "PodGroup", "metadata": {"name": "test-job", "namespace": "default"}}
    objects = plan(trainjob(suspend=suspend), runtime(pod_group_policy=policy), [existing]).objects
    assert (pod_group(objects, api_version) is not None) == emitted


def test_pod_group_read_error_aborts() -> None:
    state = ObservedState.of(read_errors={(COSCHED, "PodGroup", "default", "test-job"): "denied"})
    with pytest.raises(PlanningError, match="denied"):
        plan(trainjob(), runtime(pod_group_policy={"coscheduling": {}}), state)


def test_volcano_pod_group_queue_priority_topology() -> None:
    jobs = [job("launcher", container("node", resources=req("300m", "1Gi")), pod={"priorityClassName": "low"}),
            job("worker", container("node", resources=req("500m", "0.5Gi")), parallelism=4,
                pod={"priorityClassName": "high-priority"})]
    rt = runtime(jobs, pod_group_policy={"volcano": {"networkTopology": {}}},
                 template_metadata={"annotations": {"scheduling.volcano.sh/queue-name": "q1"}})
    objects = plan(trainjob(suspend=True), rt).objects
    assert pod_group(objects, VOLCANO)["spec"] == {
        "minMember": 5, "minResources": {"cpu": "2300m", "memory": "3Gi"}, "queue": "q1",
        "priorityClassName": "high-priority", "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}
    jobset = find(objects, "JobSet")
    assert jobset["metadata"]["annotations"] == {"scheduling.volcano.sh/queue-name": "q1"}
    meta = replicated_job(jobset, "worker")["template"]["spec"]["template"]["metadata"]
    assert meta == {"annotations": {"scheduling.k8s.io/group-name": "test-job"}}


def test_volcano_no_pod_sets() -> None:
    group = pod_group(plan(trainjob(), runtime([], pod_group_policy={"volcano": {}})).objects, VOLCANO)
    assert group["spec"] == {"minMember": 0, "minResources": {}}


def test_both_pod_group_policies_act() -> None:
    objects = plan(trainjob(), runtime(pod_group_policy={"coscheduling": {}, "volcano": {}})).objects
    assert [o["apiVersion"] for o in objects if o["kind"] == "PodGroup"] == [COSCHED, VOLCANO]
    meta = replicated_job(find(objects, "JobSet"), "node")["template"]["spec"]["template"]["metadata"]
    assert meta == {"labels": {"scheduling.x-k8s.io/pod-group": "test-job"},
                    "annotations": {"scheduling.k8s.io/group-name": "test-job"}}


PRIORITY = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "exists"}}


@pytest.mark.parametrize("annotations, priority_classes, expected", [
    pytest.param({"scheduling.volcano.sh/queue-name": ""}, [],
                 ['spec.annotations[scheduling.volcano.sh/queue-name]: Invalid value: "": Volcano queue name must not '
                  "be empty"], id="empty-queue"),
    pytest.param({}, ["non-existent"],
                 ['spec.templateSpec.priorityClassName: Invalid value: "non-existent": PriorityClass "non-existent" '
                  'doesn\'t exist: priorityclasses.scheduling.k8s.io "non-existent" not found'], id="missing-priority"),
    pytest.param({}, ["exists"], [], id="existing-priority"),
    pytest.param({}, ["system-node-critical", "non-existent"], [], id="system-class-stops-checks"),
    pytest.param({}, ["non-existent", "system-node-critical", "other"],
                 ['spec.templateSpec.priorityClassName: Invalid value: "non-existent": PriorityClass "non-existent" '
                  'doesn\'t exist: priorityclasses.scheduling.k8s.io "non-existent" not found'], id="checks-before-stop"),
])
def test_volcano_admission(annotations: dict[str, str], priority_classes: list[str], expected: list[str]) -> None:
    jobs = [job(f"j{i}", container("c"), pod={"priorityClassName": p}) for i, p in enumerate(priority_classes)]
    rt = runtime(jobs, pod_group_policy={"volcano": {}})
    result = validate_trainjob(trainjob(annotations=annotations), runtime=rt, observed=[PRIORITY])
    assert result.texts() == expected
