"""Runtime resolution and the TrainJob / runtime admission rules (spec §2, §1 CEL, §6)."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import container, default_jobs, job, runtime, torch_runtime, trainjob
from trainyard.compat import TrainerCompat
from trainyard.pipeline import PlanningError, plan, validate_runtime, validate_trainjob

POLICY_URL = "https://www.kubeflow.org/docs/components/trainer/operator-guides/runtime/#runtime-deprecation-policy"


@pytest.mark.parametrize("ref, message", [
    pytest.param({"name": "x", "kind": "Foo"}, "unsupported runtime: Foo.trainer.kubeflow.org", id="unknown-kind"),
    pytest.param({"name": "x", "apiGroup": ""}, "unsupported runtime: ClusterTrainingRuntime", id="empty-group"),
    pytest.param({"name": "x", "apiGroup": "example.com", "kind": "TrainingRuntime"},
                 "unsupported runtime: TrainingRuntime.example.com", id="other-group"),
])
def test_unsupported_runtime(ref: dict[str, Any], message: str) -> None:
    job_doc = trainjob()
    job_doc["spec"]["runtimeRef"] = ref
    result = validate_trainjob(job_doc, observed=[])
    assert (result.code, result.texts()) == (403, [message])
    with pytest.raises(PlanningError) as err:
        plan(job_doc, observed=[])
    assert (err.value.message, err.value.reason) == (message, "TrainingRuntimeNotSupported")


def test_trainjob_without_spec_is_unsupported_with_empty_key() -> None:
    job_doc = trainjob()
    del job_doc["spec"]
    assert validate_trainjob(job_doc).texts() == ["unsupported runtime: "]


def test_missing_training_runtime() -> None:
    result = validate_trainjob(trainjob(runtime_name="alpha"), observed=[])
    assert result.texts() == [
        'spec.runtimeRef: Invalid value: {"name":"alpha","kind":"TrainingRuntime","apiGroup":"trainer.kubeflow.org"}: '
        'trainingruntimes.trainer.kubeflow.org "alpha" not found: specified trainingRuntime must be created before '
        "the TrainJob is created"]
    with pytest.raises(PlanningError, match='TrainingRuntime specified in TrainJob is not found: trainingruntimes'):
        plan(trainjob(runtime_name="alpha"), observed=[])


def test_missing_cluster_training_runtime_uses_upstream_capital_r() -> None:
    job_doc = trainjob(runtime_name="alpha", runtime_kind="ClusterTrainingRuntime")
    assert validate_trainjob(job_doc).texts()[0].startswith("spec.RuntimeRef: Invalid value: ")
    with pytest.raises(PlanningError, match="^not found ClusterTrainingRuntime specified in TrainJob: "
                                            'clustertrainingruntimes.trainer.kubeflow.org "alpha" not found$'):
        plan(job_doc)


def test_training_runtime_is_looked_up_in_trainjob_namespace_only() -> None:
    other_ns = runtime(namespace="other")
    assert not validate_trainjob(trainjob(), observed=[other_ns]).allowed
    assert validate_trainjob(trainjob(), observed=[runtime()]).allowed
    assert plan(trainjob(), observed=[runtime()]).objects


def test_deprecated_cluster_runtime_warns_but_allows() -> None:
    rt = runtime(kind="ClusterTrainingRuntime", name="test-runtime", labels={"trainer.kubeflow.org/support": "deprecated"})
    result = validate_trainjob(trainjob(runtime_kind="ClusterTrainingRuntime"), observed=[rt])
    assert result.allowed
    assert result.warnings == [f'Referenced ClusterTrainingRuntime "test-runtime" is deprecated and will be removed '
                               f"in a future release of Kubeflow Trainer. See runtime deprecation policy: {POLICY_URL}"]


def test_deprecated_namespaced_runtime_does_not_warn() -> None:
    rt = runtime(labels={"trainer.kubeflow.org/support": "deprecated"})
    assert validate_trainjob(trainjob(), observed=[rt]).warnings == []


@pytest.mark.parametrize("name, expected", [
    pytest.param("Upper", ['metadata.name: Invalid value: "Upper": metadata.name must match RFC 1035 DNS label format'],
                 id="uppercase"),
    pytest.param("1abc", ['metadata.name: Invalid value: "1abc": metadata.name must match RFC 1035 DNS label format'],
                 id="leading-digit"),
    pytest.param("abc-", ['metadata.name: Invalid value: "abc-": metadata.name must match RFC 1035 DNS label format'],
                 id="trailing-dash"),
    pytest.param("a" * 64, [f'metadata.name: Invalid value: "{"a" * 64}": metadata.name must be no more than 63 '
                            "characters"], id="too-long"),
    pytest.param("a" * 63, [], id="63-ok"),
])
def test_trainjob_name_rules(name: str, expected: list[str]) -> None:
    result = validate_trainjob(trainjob(name), runtime=runtime())
    assert result.texts() == expected
    assert result.code == (422 if expected else 200)


def test_managed_by_enum_and_immutability() -> None:
    bad = validate_trainjob(trainjob(managedBy="invalid"), runtime=runtime())
    assert bad.code == 422 and bad.texts() == [
        'spec.managedBy: Invalid value: "string": ManagedBy must be trainer.kubeflow.org/trainjob-controller or '
        "kueue.x-k8s.io/multikueue if set"]



# A7: same rules, each release's message (CRD rule messages; the v2.1 level installs v2.1.0's).
@pytest.mark.parametrize("compat, message", [
    pytest.param(TrainerCompat.V2_3, "field is immutable", id="v2.3"),
    pytest.param(TrainerCompat.V2_1, "ManagedBy value is immutable", id="v2.1"),
])
def test_managed_by_is_immutable(compat: TrainerCompat, message: str) -> None:
    changed = validate_trainjob(trainjob(managedBy="kueue.x-k8s.io/multikueue"), trainjob(), runtime=runtime(),
                                compat=compat)
    assert changed.texts() == [f'spec.managedBy: Invalid value: "string": {message}']


@pytest.mark.parametrize("compat, message", [
    pytest.param(TrainerCompat.V2_3, "field is immutable", id="v2.3"),
    pytest.param(TrainerCompat.V2_1, "runtimeRef is immutable", id="v2.1"),
])
def test_runtime_ref_is_immutable(compat: TrainerCompat, message: str) -> None:
    result = validate_trainjob(trainjob(runtime_name="b"), trainjob(runtime_name="a"), runtime=runtime(),
                               compat=compat)
    assert result.texts() == [f'spec.runtimeRef: Invalid value: "object": {message}']
    assert "is invalid: spec.runtimeRef" in result.kubectl_message("TrainJob", "test-job")


def test_denial_message_aggregates_like_kubernetes() -> None:
    rt = torch_runtime([job("node", container("node"), ancestor="trainer")])
    result = validate_trainjob(trainjob(trainer={"numProcPerNode": "x", "env": [{"name": "PET_NNODES"}]}), runtime=rt)
    message = result.kubectl_message("TrainJob", "test-job")
    assert message.startswith('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: [')
    assert message.count("spec.trainer.") == 2


# --- runtimes -----------------------------------------------------------------------------

def labeled_jobs(replicas: int = 2) -> list[dict[str, Any]]:
    jobs = default_jobs()
    jobs.insert(2, job("launcher", container("node")))
    for j in jobs:
        j["replicas"] = replicas
    return jobs


@pytest.mark.parametrize("kind", ["TrainingRuntime", "ClusterTrainingRuntime"])
def test_runtime_replicas_must_be_one_for_ancestor_jobs(kind: str) -> None:
    result = validate_runtime(runtime(labeled_jobs(), kind=kind))
    assert result.code == 403
    assert result.texts() == [f"spec.template.spec.replicatedJobs[{i}].replicas: Invalid value: 2: always must be 1"
                              for i in (0, 1, 3)]


def test_runtime_unknown_ancestor_may_have_replicas() -> None:
    jobs = [job("x", container("x"), ancestor="user-specified")]
    jobs[0]["replicas"] = 2
    assert validate_runtime(runtime(jobs)).allowed


def test_runtime_missing_required_container() -> None:
    jobs = [job("node", container("worker"), ancestor="trainer")]
    result = validate_runtime(runtime(jobs))
    assert result.texts()[0].endswith(": must contain the required container for the ancestor: trainer")
    assert result.texts()[0].startswith("spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers")


def test_training_runtime_update_is_not_validated_by_webhook() -> None:
    bad = runtime(labeled_jobs())
    assert validate_runtime(bad, old=runtime()).allowed
    assert not validate_runtime({**bad, "kind": "ClusterTrainingRuntime"}, old=runtime()).allowed


def test_cluster_runtime_deprecation_warning_on_create_only() -> None:
    rt = runtime(kind="ClusterTrainingRuntime", name="old", labels={"trainer.kubeflow.org/support": "deprecated"})
    assert validate_runtime(rt).warnings == [
        f'ClusterTrainingRuntime "old" is deprecated and will be removed in a future release of Kubeflow Trainer. '
        f"See runtime deprecation policy: {POLICY_URL}"]
    assert validate_runtime(rt, old=rt).warnings == []


@pytest.mark.parametrize("ml_policy, expected", [
    pytest.param({"numNodes": 2, "torch": {"elasticPolicy": {"maxNodes": 3}}},
                 ['spec.mlPolicy: Invalid value: "object": numNodes should not be set if torch.elasticPolicy is '
                  "configured"], id="elastic-and-num-nodes"),
    pytest.param({"torch": {}, "mpi": {}},
                 ['spec.mlPolicy: Invalid value: "object": Only one of the policy can be configured'], id="two-policies"),
    pytest.param({"torch": {"numProcPerNode": "npu"}},
                 ['spec.mlPolicy.torch.numProcPerNode: Invalid value: "string": NumProcPerNode must be equal to auto, '
                  "cpu, gpu, or int value"], id="bad-nproc"),
    pytest.param({"torch": {"numProcPerNode": 0}},
                 ['spec.mlPolicy.torch.numProcPerNode: Invalid value: "integer": NumProcPerNode must be equal to auto, '
                  "cpu, gpu, or int value"], id="zero-nproc"),
    pytest.param({"mpi": {"mpiImplementation": "Intel"}},
                 ['spec.mlPolicy.mpi.mpiImplementation: Unsupported value: "Intel": supported values: "OpenMPI", ""'],
                 id="intel-mpi"),
    pytest.param({"torch": {"numProcPerNode": "gpu"}}, [], id="gpu-ok"),
])
def test_runtime_cel_rules(ml_policy: dict[str, Any], expected: list[str]) -> None:
    result = validate_runtime(runtime(ml_policy=ml_policy))
    assert result.texts() == expected
    assert result.code == (422 if expected else 200)


def test_runtime_jobset_rules() -> None:
    jobs = default_jobs()
    jobs[2]["dependsOn"] = [{"name": "dataset-initializer", "status": "Complete"}]
    rt = runtime(jobs, jobset_spec={"startupPolicy": {"startupPolicyOrder": "InOrder"}})
    assert validate_runtime(rt).texts() == [
        'spec.template.spec: Invalid value: "object": StartupPolicy and DependsOn APIs are mutually exclusive']
    jobs[2]["dependsOn"] = [{"name": "dataset-initializer", "status": "Done"}]
    assert validate_runtime(runtime(jobs)).texts() == [
        'spec.template.spec.replicatedJobs[2].dependsOn[0].status: Unsupported value: "Done": supported values: '
        '"Ready", "Complete"']


def test_runtime_jobset_immutable_fields_on_update() -> None:
    old = runtime(jobset_spec={"successPolicy": {"operator": "All"}})
    new = runtime(jobset_spec={"successPolicy": {"operator": "Any"}})
    assert validate_runtime(new, old=old).texts() == [
        'spec.template.spec.successPolicy: Invalid value: "object": Value is immutable']


# --- resource-in-use finalizer decisions (spec §2.4) --------------------------------------

from trainyard.pipeline.resolution import finalizer_action, referenced_runtime  # noqa: E402


@pytest.mark.parametrize("ref, expected", [
    pytest.param({"name": "r", "kind": "TrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
                 ("TrainingRuntime", "default", "r"), id="training-runtime"),
    pytest.param({"name": "r", "kind": "ClusterTrainingRuntime", "apiGroup": "trainer.kubeflow.org"},
                 ("ClusterTrainingRuntime", "", "r"), id="cluster-runtime"),
    pytest.param({"name": "r", "kind": "TrainingRuntime"}, None, id="absent-api-group-never-matches"),
    pytest.param({"name": "r", "apiGroup": "trainer.kubeflow.org"}, None, id="absent-kind-never-matches"),
])
def test_referenced_runtime_index(ref: dict[str, Any], expected: Any) -> None:
    job_doc = trainjob()
    job_doc["spec"]["runtimeRef"] = ref
    assert referenced_runtime(job_doc) == expected


@pytest.mark.parametrize("finalizers, deleting, referenced, action", [
    pytest.param([], False, True, "add", id="add-when-used"),
    pytest.param(["trainer.kubeflow.org/resource-in-use"], True, False, "remove", id="remove-when-deleting-unused"),
    pytest.param(["trainer.kubeflow.org/resource-in-use"], False, False, None, id="kept-on-live-runtime"),
    pytest.param(["trainer.kubeflow.org/resource-in-use"], True, True, None, id="kept-while-used"),
    pytest.param([], False, False, None, id="unused-without-finalizer"),
    pytest.param([], True, True, None, id="none-added-while-deleting"),
])
def test_finalizer_action(finalizers: list[str], deleting: bool, referenced: bool, action: Any) -> None:
    rt = runtime()
    rt["metadata"]["finalizers"] = finalizers
    if deleting:
        rt["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert finalizer_action(rt, referenced) == action
