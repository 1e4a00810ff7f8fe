"""SSA with the project's real CRD schemas: the applier's JobSet flow and the TrainJob flow."""
from functools import lru_cache

import pytest

from trainyard.api.crds import generate_crds
from trainyard.apimachinery.openapi_definitions import structural_schema
from trainyard.apimachinery.server_side_apply import ApplyConflict, apply, record_update

T1, T2, T3 = "2025-01-02T03:04:05Z", "2025-01-02T03:05:00Z", "2025-01-02T03:06:00Z"


@lru_cache(maxsize=None)
def crds_by_name() -> dict:
    return {crd["metadata"]["name"]: crd for crd in generate_crds()}


def crd_schema(name: str):
    crd = crds_by_name()[name]
    return structural_schema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def jobset(node_image: str, env: list[dict], parallelism: int = 2) -> dict:
    container = {"name": "node", "image": node_image, "env": env}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "tj", "namespace": "default", "labels": {"trainer.kubeflow.org/trainjob-name": "tj"}},
        "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
            "parallelism": parallelism, "completions": parallelism,
            "template": {"spec": {"containers": [container], "restartPolicy": "OnFailure"}}}}}]},
    }


def test_trainer_applier_replans_a_jobset_and_drops_removed_env() -> None:
    schema = crd_schema("jobsets.jobset.x-k8s.io")
    first = apply(None, jobset("img:1", [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]),
                  manager="trainer", schema=schema, now=T1, force=True, status_is_subresource=True)
    assert first.created
    # the JobSet controller writes status; a user labels the object
    with_status = record_update(first.object, {**first.object, "status": {"restarts": 0}},
                                manager="jobset-controller", schema=schema, now=T2, subresource="status")
    labelled = dict(with_status, metadata={**with_status["metadata"],
                                           "labels": {**with_status["metadata"]["labels"], "user": "x"}})
    live = record_update(with_status, labelled, manager="kubectl-label", schema=schema, now=T2)
    replanned = apply(live, jobset("img:2", [{"name": "A", "value": "1"}], parallelism=3),
                      manager="trainer", schema=schema, now=T3, force=True, status_is_subresource=True)
    job = replanned.object["spec"]["replicatedJobs"][0]["template"]["spec"]
    container = job["template"]["spec"]["containers"][0]
    assert container["image"] == "img:2"
    assert [e["name"] for e in container["env"]] == ["A"]
    assert job["parallelism"] == 3
    assert replanned.object["status"] == {"restarts": 0}
    assert replanned.object["metadata"]["labels"]["user"] == "x"
    again = apply(replanned.object, jobset("img:2", [{"name": "A", "value": "1"}], parallelism=3),
                  manager="trainer", schema=schema, now=T3, force=True, status_is_subresource=True)
    assert not again.changed


def test_trainjob_conflict_after_kubectl_patch() -> None:
    schema = crd_schema("trainjobs.trainer.kubeflow.org")
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "x", "namespace": "default"},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}}}
    created = apply(None, trainjob, manager="kubectl", schema=schema, now=T1, status_is_subresource=True).object
    patched = record_update(created, {**created, "spec": {**created["spec"], "trainer": {"numNodes": 4}}},
                            manager="kubectl-patch", schema=schema, now=T2)
    with pytest.raises(ApplyConflict) as raised:
        apply(patched, trainjob, manager="kubectl", schema=schema, now=T3, status_is_subresource=True)
    assert str(raised.value) == ('Apply failed with 1 conflict: conflict with "kubectl-patch" using '
                                 "trainer.kubeflow.org/v1alpha1 at 2025-01-02T03:05:00Z: .spec.trainer.numNodes")
