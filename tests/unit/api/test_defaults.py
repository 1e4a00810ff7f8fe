"""apply_defaults fills absent fields exactly as upstream's CRD defaults would."""
from __future__ import annotations

import copy

import pytest

from trainyard.api.defaults import apply_defaults
from trainyard.api.objects import dump_object, parse_object


def _trainjob(spec: dict) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"}, "spec": spec}


def _runtime(spec: dict, kind: str = "ClusterTrainingRuntime") -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": kind, "metadata": {"name": "r"}, "spec": spec}


def _defaulted(doc: dict) -> dict:
    return dump_object(apply_defaults(parse_object(doc)))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"runtimeRef": {"name": "torch"}},
            {
                "runtimeRef": {"name": "torch", "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
                "suspend": False,
                "managedBy": "trainer.kubeflow.org/trainjob-controller",
            },
        ),
        (
            # Present values, even empty strings, are never replaced.
            {"runtimeRef": {"name": "t", "apiGroup": "", "kind": "TrainingRuntime"}, "suspend": True, "managedBy": "kueue.x-k8s.io/multikueue"},
            {"runtimeRef": {"name": "t", "apiGroup": "", "kind": "TrainingRuntime"}, "suspend": True, "managedBy": "kueue.x-k8s.io/multikueue"},
        ),
        (
            # Nothing is added inside the trainer or initializer sections.
            {"runtimeRef": {"name": "t", "apiGroup": "g", "kind": "k"}, "suspend": False, "managedBy": "m", "trainer": {"numNodes": 2}, "initializer": {"dataset": {}}},
            {"runtimeRef": {"name": "t", "apiGroup": "g", "kind": "k"}, "suspend": False, "managedBy": "m", "trainer": {"numNodes": 2}, "initializer": {"dataset": {}}},
        ),
    ],
    ids=["all-absent", "all-present", "nested-untouched"],
)
def test_trainjob_defaults(spec: dict, expected: dict) -> None:
    assert _defaulted(_trainjob(spec))["spec"] == expected


def test_trainjob_without_spec_gets_no_defaults() -> None:
    doc = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"}}
    assert _defaulted(doc) == doc


@pytest.mark.parametrize("kind", ["ClusterTrainingRuntime", "TrainingRuntime"])
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"mlPolicy": {"torch": {}}}, {"mlPolicy": {"torch": {"numProcPerNode": "auto"}}}),
        ({"mlPolicy": {"torch": {"numProcPerNode": 4}}}, {"mlPolicy": {"torch": {"numProcPerNode": 4}}}),
        (
            {"mlPolicy": {"mpi": {}}},
            {"mlPolicy": {"mpi": {"numProcPerNode": 1, "mpiImplementation": "OpenMPI", "sshAuthMountPath": "/root/.ssh", "runLauncherAsNode": False}}},
        ),
        ({"mlPolicy": {"numNodes": 3}}, {"mlPolicy": {"numNodes": 3}}),
        ({"podGroupPolicy": {"coscheduling": {}}}, {"podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 60}}}),
        ({"podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 0}}}, {"podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 0}}}),
        ({"podGroupPolicy": {"volcano": {}}}, {"podGroupPolicy": {"volcano": {}}}),
        (
            {"podGroupPolicy": {"volcano": {"networkTopology": {}}}},
            {"podGroupPolicy": {"volcano": {"networkTopology": {"mode": "hard", "highestTierAllowed": 1}}}},
        ),
        (
            {"template": {"spec": {"replicatedJobs": [{"name": "a", "template": {}}, {"name": "b", "replicas": 3, "groupName": "g", "template": {}}]}}},
            {"template": {"spec": {"replicatedJobs": [{"name": "a", "template": {}, "replicas": 1, "groupName": "default"}, {"name": "b", "replicas": 3, "groupName": "g", "template": {}}]}}},
        ),
        (
            {"template": {"spec": {"failurePolicy": {"maxRestarts": 2}}}},
            {"template": {"spec": {"failurePolicy": {"maxRestarts": 2, "restartStrategy": "Recreate"}}}},
        ),
    ],
    ids=["torch", "torch-set", "mpi", "numNodes-not-defaulted", "coscheduling", "coscheduling-zero", "volcano-without-topology", "volcano-topology", "replicated-jobs", "failure-policy"],
)
def test_runtime_defaults(kind: str, spec: dict, expected: dict) -> None:
    assert _defaulted(_runtime(spec, kind))["spec"] == expected


def test_built_in_kubernetes_types_are_not_defaulted() -> None:
    job = {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "node"}]}}}}}
    doc = _runtime({"template": {"spec": {"replicatedJobs": [job]}}})
    defaulted = _defaulted(doc)["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert defaulted == {**job, "replicas": 1, "groupName": "default"}


def test_defaulting_returns_a_new_object_and_keeps_the_input() -> None:
    doc = _runtime({"mlPolicy": {"mpi": {}}})
    obj = parse_object(copy.deepcopy(doc))
    defaulted = apply_defaults(obj)
    assert defaulted is not obj
    assert dump_object(obj) == doc
    assert defaulted.spec.ml_policy.mpi.num_proc_per_node == 1


def test_null_values_are_defaulted_like_absent_ones() -> None:
    assert _defaulted(_trainjob({"runtimeRef": {"name": "t", "kind": None}}))["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"


def test_defaulting_is_idempotent() -> None:
    doc = _runtime({"mlPolicy": {"mpi": {}}, "template": {"spec": {"replicatedJobs": [{"name": "a", "template": {}}]}}})
    once = apply_defaults(parse_object(doc))
    assert dump_object(apply_defaults(once)) == dump_object(once)


def test_jobset_and_podgroup_objects_get_their_crd_defaults() -> None:
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "j"},
        "spec": {"replicatedJobs": [{"name": "node", "template": {}}], "volumeClaimPolicies": [{"retentionPolicy": {}}]},
    }
    spec = _defaulted(jobset)["spec"]
    assert spec["replicatedJobs"] == [{"name": "node", "template": {}, "replicas": 1, "groupName": "default"}]
    assert spec["volumeClaimPolicies"] == [{"retentionPolicy": {"whenDeleted": "Delete"}}]
    podgroup = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "p"}, "spec": {"minMember": 2}}
    assert _defaulted(podgroup)["spec"] == {"minMember": 2, "queue": "default"}
    coscheduling = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "p"}, "spec": {"minMember": 2}}
    assert _defaulted(coscheduling) == coscheduling
