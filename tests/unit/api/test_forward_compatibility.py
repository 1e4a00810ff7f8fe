"""v2.3.0 as a superset: its fields are typed, v2.1.0 manifests parse exactly as before, and the
fields v2.3.0 dropped are still there."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from trainyard.api.objects import FieldError, dump_object, load_yaml_documents, parse_object

EXAMPLES = Path(__file__).parent / "examples"
REFERENCE = Path(__file__).resolve().parents[4] / "shared" / "reference"
V23_TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "v23"},
    "spec": {
        "runtimeRef": {"name": "torch-distributed"},
        "activeDeadlineSeconds": 3600,
        "trainer": {"numNodes": 2, "numProcPerNode": 4},
        "runtimePatches": [{"manager": "kueue.x-k8s.io/manager", "time": "2026-01-01T00:00:00Z",
                            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                                {"name": "node", "template": {"spec": {"template": {"spec": {
                                    "nodeSelector": {"pool": "a"}}}}}}]}}}}],
    },
    "status": {"trainerStatus": {"progressPercentage": 10, "lastUpdatedTime": "2026-01-01T00:00:00Z",
                                 "metrics": [{"name": "loss", "value": "0.1"}]}},
}


def test_v2_3_trainjob_fields_are_typed_and_round_trip() -> None:
    job = parse_object(copy.deepcopy(V23_TRAINJOB), strict=True)
    assert dump_object(job) == V23_TRAINJOB
    assert job.spec.active_deadline_seconds == 3600
    assert job.spec.trainer.num_proc_per_node == 4  # v2.3.0's integer fits int-or-string
    patch = job.spec.runtime_patches[0]
    assert patch.manager == "kueue.x-k8s.io/manager"
    assert patch.training_runtime_spec.template.spec.replicated_jobs[0].name == "node"
    assert job.status.trainer_status.metrics[0].value == "0.1"


def test_v2_3_type_errors_name_the_field() -> None:
    bad = copy.deepcopy(V23_TRAINJOB)
    bad["spec"]["activeDeadlineSeconds"] = "soon"
    with pytest.raises(FieldError, match="spec.activeDeadlineSeconds"):
        parse_object(bad)


def test_v2_1_manifests_parse_and_dump_unchanged() -> None:
    for path in sorted(EXAMPLES.glob("trainjob-*.yaml")):
        for doc in load_yaml_documents(path.read_text(), path.name):
            assert dump_object(parse_object(copy.deepcopy(doc), strict=True)) == doc


def test_every_v2_3_runtime_parses_strictly() -> None:
    runtimes = sorted((REFERENCE / "trainer-v2.3.0" / "runtimes").glob("*.yaml"))
    if not runtimes:
        pytest.skip("v2.3.0 reference runtimes are not present")
    for path in runtimes:
        for doc in load_yaml_documents(path.read_text(), path.name):
            assert dump_object(parse_object(copy.deepcopy(doc), strict=True)) == doc


def test_fields_v2_3_dropped_are_kept() -> None:
    job = parse_object({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "j"},
                        "spec": {"runtimeRef": {"name": "t"}, "labels": {"a": "b"}, "annotations": {"c": "d"},
                                 "podTemplateOverrides": [{"targetJobs": [{"name": "node"}]}]}}, strict=True)
    assert job.spec.labels == {"a": "b"} and job.spec.pod_template_overrides[0].target_jobs[0].name == "node"
    runtime = parse_object({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
                            "metadata": {"name": "r"},
                            "spec": {"mlPolicy": {"torch": {"elasticPolicy": {"minNodes": 1}, "envInjection": {
                                "targets": [{"jobName": "node", "containerNames": ["sidecar"]}]}}}}}, strict=True)
    assert runtime.spec.ml_policy.torch.elastic_policy.min_nodes == 1
    assert runtime.spec.ml_policy.torch.env_injection.targets[0].container_names == ["sidecar"]
