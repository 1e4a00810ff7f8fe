"""JobSet plugin: document, initializers, overrides, suspend/apply rules, admission (§4.6, §8.3)."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import (container, container_of, default_jobs, env_of, find, job, pod_spec,
                                        replicated_job, runtime, torch_runtime, trainjob)
from trainyard.compat import TrainerCompat
from trainyard.pipeline import ObservedState, PlanningError, validate_trainjob
from fixtures.pipeline_builders import plan_past_snapshot as plan  # the plugins' objects (test_snapshot.py)


JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet", "default", "test-job")


def jobset_doc(suspend: bool | None = False, active: dict[str, int] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"apiVersion": JOBSET[0], "kind": "JobSet",
                           "metadata": {"name": "test-job", "namespace": "default"}, "spec": {}}
    if suspend is not None:
        doc["spec"]["suspend"] = suspend
    if active:
        doc["status"] = {"replicatedJobsStatus": [{"name": n, "active": a} for n, a in active.items()]}
    return doc


def test_metadata_labels_annotations_owner_and_suspend() -> None:
    rt = runtime(template_metadata={"labels": {"conflictLabel": "overridden", "keep": "1"},
                                    "annotations": {"conflictAnnotation": "overridden"}})
    job_doc = trainjob(labels={"conflictLabel": "override"}, annotations={"conflictAnnotation": "override"},
                       suspend=True)
    jobset = find(plan(job_doc, rt).objects, "JobSet")
    assert jobset["metadata"]["labels"] == {"conflictLabel": "override", "keep": "1"}
    assert jobset["metadata"]["annotations"] == {"conflictAnnotation": "override"}
    assert jobset["metadata"]["ownerReferences"] == [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "test-job", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True}]
    assert jobset["spec"]["suspend"] is True
    assert [j["groupName"] for j in jobset["spec"]["replicatedJobs"]] == ["default"] * 3


def test_runtime_metadata_labels_are_not_copied() -> None:
    rt = runtime(labels={"trainer.kubeflow.org/framework": "torch"})
    assert "labels" not in find(plan(trainjob(), rt).objects, "JobSet")["metadata"]


def test_initializers_get_storage_uri_env_and_secret() -> None:
    jobs = default_jobs()
    jobs[0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "STORAGE_URI", "value": "hf://runtime"}, {"name": "OTHER", "value": "x"}]
    initializer = {
        "dataset": {"storageUri": "hf://trainjob-dataset", "env": [{"name": "TRAIN_JOB", "value": "test:trainjob:dataset"}],
                    "secretRef": {"name": "trainjob-secret-dataset"}},
        "model": {"storageUri": "hf://trainjob-model", "env": [{"name": "TRAIN_JOB", "value": "test:trainjob:model"}],
                  "secretRef": {"name": "trainjob-secret-model"}},
    }
    jobset = find(plan(trainjob(initializer=initializer), runtime(jobs)).objects, "JobSet")
    dataset = container_of(jobset, "dataset-initializer", "dataset-initializer")
    model = container_of(jobset, "model-initializer", "model-initializer")
    assert dataset["env"] == [{"name": "STORAGE_URI", "value": "hf://trainjob-dataset"},
                              {"name": "OTHER", "value": "x"},
                              {"name": "TRAIN_JOB", "value": "test:trainjob:dataset"}]
    assert dataset["envFrom"] == [{"secretRef": {"name": "trainjob-secret-dataset"}}]
    assert env_of(model) == {"STORAGE_URI": "hf://trainjob-model", "TRAIN_JOB": "test:trainjob:model"}
    assert model["envFrom"] == [{"secretRef": {"name": "trainjob-secret-model"}}]


def test_initializer_replicas_forced_to_one() -> None:
    jobs = default_jobs()
    jobs[0]["replicas"] = 3
    jobset = find(plan(trainjob(), runtime(jobs)).objects, "JobSet")
    assert replicated_job(jobset, "dataset-initializer")["replicas"] == 1


def test_parallelism_and_completions_synced_for_every_job() -> None:
    jobs = [job("node", container("node"), ancestor="trainer"), job("sidecar-job", parallelism=3)]
    jobs[1]["template"]["spec"]["completions"] = 5
    jobset = find(plan(trainjob(trainer={"numNodes": 2}), runtime(jobs)).objects, "JobSet")
    spec = replicated_job(jobset, "sidecar-job")["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (3, 3)


def test_plainml_applies_num_nodes_env_image_and_resources() -> None:
    trainer = {"numNodes": 3, "image": "i", "env": [{"name": "E", "value": "v"}],
               "resourcesPerNode": {"limits": {"cpu": "2"}, "claims": [{"name": "c"}]}}
    jobset = find(plan(trainjob(trainer=trainer), runtime(default_jobs({"requests": {"cpu": "9"}})),
                       compat=TrainerCompat.V2_1).objects, "JobSet")
    node = container_of(jobset, "node")
    assert replicated_job(jobset, "node")["template"]["spec"]["parallelism"] == 3
    # v2.1.0: replaced, claims dropped (v2.3.0 merges, and only with an mlPolicy: test_compat_levels.py)
    assert node["resources"] == {"limits": {"cpu": "2"}}
    assert node["image"] == "i" and env_of(node) == {"E": "v"}


@pytest.mark.parametrize("observed, suspend, emitted", [
    pytest.param([], False, True, id="absent-jobset-created"),
    pytest.param([jobset_doc(False)], False, False, id="running-jobset-untouched"),
    pytest.param([jobset_doc(True)], False, True, id="resume-reapplies"),
    pytest.param([jobset_doc(False)], True, True, id="suspending-reapplies"),
    pytest.param([jobset_doc(None)], False, False, id="jobset-without-suspend-is-running"),
])
def test_when_jobset_is_applied(observed: list[Any], suspend: bool, emitted: bool) -> None:
    objects = plan(trainjob(suspend=suspend), runtime(), observed).objects
    assert (find(objects, "JobSet") is not None) == emitted


def test_jobset_read_error_aborts() -> None:
    state = ObservedState.of(read_errors={JOBSET: "etcd timeout"})
    with pytest.raises(PlanningError, match="etcd timeout"):
        plan(trainjob(), runtime(), state)


def test_pod_template_overrides_merge_per_target_job() -> None:
    jobs = default_jobs()
    jobs[0]["template"]["spec"]["template"]["spec"]["initContainers"] = [
        container("init", env=[{"name": "INIT_ENV", "value": "original"}, {"name": "DATASET_PATH", "value": "p"}])]
    overrides = [{
        "targetJobs": [{"name": "dataset-initializer"}],
        "metadata": {"labels": {"l": "v"}, "annotations": {"a": "v"}},
        "spec": {"serviceAccountName": "sa", "nodeSelector": {"n": "1"},
                 "tolerations": [{"key": "k", "operator": "Exists"}],
                 "initContainers": [{"name": "init", "env": [{"name": "INIT_ENV", "value": "override"},
                                                              {"name": "NEW_VALUE", "value": "n"}]}],
                 "volumes": [{"name": "v", "emptyDir": {}}], "schedulingGates": [{"name": "g"}],
                 "imagePullSecrets": [{"name": "s"}]},
    }]
    jobset = find(plan(trainjob(podTemplateOverrides=overrides), runtime(jobs)).objects, "JobSet")
    spec = pod_spec(jobset, "dataset-initializer")
    assert env_of(spec["initContainers"][0]) == {"INIT_ENV": "override", "DATASET_PATH": "p", "NEW_VALUE": "n"}
    assert spec["serviceAccountName"] == "sa" and spec["nodeSelector"] == {"n": "1"}
    assert spec["volumes"] == [{"name": "v", "emptyDir": {}}]
    pod_meta = replicated_job(jobset, "dataset-initializer")["template"]["spec"]["template"]["metadata"]
    assert pod_meta == {"labels": {"l": "v"}, "annotations": {"a": "v"}}
    assert "serviceAccountName" not in pod_spec(jobset, "node")


def test_later_override_wins_and_tolerations_replace() -> None:
    jobs = [job("node", container("node"), ancestor="trainer",
                pod={"tolerations": [{"key": "runtime", "operator": "Exists"}]})]
    overrides = [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"type": "p5.48xlarge"}}},
                 {"targetJobs": [{"name": "node"}, {"name": "node"}],
                  "spec": {"nodeSelector": {"type": "p5en.48xlarge"}, "serviceAccountName": "sa",
                           "tolerations": [{"key": "mine", "operator": "Exists"}]}}]
    spec = pod_spec(find(plan(trainjob(podTemplateOverrides=overrides), runtime(jobs)).objects, "JobSet"), "node")
    assert spec["nodeSelector"] == {"type": "p5en.48xlarge"} and spec["serviceAccountName"] == "sa"
    assert spec["tolerations"] == [{"key": "mine", "operator": "Exists"}]


def test_override_volume_with_same_name_replaces_source() -> None:
    jobs = [job("node", container("node"), ancestor="trainer",
                pod={"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "c"}}]})]
    overrides = [{"targetJobs": [{"name": "node"}], "spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}]
    spec = pod_spec(find(plan(trainjob(podTemplateOverrides=overrides), runtime(jobs)).objects, "JobSet"), "node")
    assert spec["volumes"] == [{"name": "data", "emptyDir": {}}]


@pytest.mark.parametrize("spec, expected", [
    pytest.param({"initializer": {"dataset": {}}},
                 ["spec.runtimeRef: Invalid value: {\"name\":\"test-runtime\",\"kind\":\"TrainingRuntime\","
                  "\"apiGroup\":\"trainer.kubeflow.org\"}: must have dataset-initializer job when trainJob is "
                  "configured with input datasetConfig"], id="no-dataset-job"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "invalid"}]}]},
                 ["must not have targetJob that doesn't exist in the runtime job template"], id="unknown-target"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                                            "spec": {"containers": [{"name": "node", "env": [{"name": "A"}]}]}}]},
                 ["must not have envs for the dataset-initializer, model-initializer, node containers"],
                 id="env-for-reserved-container"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                                            "spec": {"containers": [{"name": "ghost"}]}}]},
                 ["must not have container that doesn't exist in the runtime job node"], id="unknown-container"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "node"}],
                                            "spec": {"initContainers": [{"name": "ghost"}]}}]},
                 ["must not have initContainer that doesn't exist in the runtime job node"], id="unknown-init"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "nope"}],
                                            "spec": {"containers": [{"name": "x"}]}}]},
                 ["must not have targetJob that doesn't exist in the runtime job template",
                  "must not have container that doesn't exist in the runtime job nope"], id="unknown-job-and-container"),
    pytest.param({"podTemplateOverrides": [{"targetJobs": [{"name": "node"}]}, {"targetJobs": [{"name": "node"}]}]},
                 [], id="two-overrides-same-target-allowed"),
])
def test_jobset_admission_on_create(spec: dict[str, Any], expected: list[str]) -> None:
    jobs = [job("node", container("node"), ancestor="trainer")]
    result = validate_trainjob(trainjob(**spec), runtime=runtime(jobs))
    assert [t if t.startswith("spec.runtimeRef:") else t.rsplit(": ", 1)[1] for t in result.texts()] == expected


def test_missing_initializer_container_is_reported() -> None:
    jobs = default_jobs()
    jobs[1]["template"]["spec"]["template"]["spec"]["containers"] = []
    result = validate_trainjob(trainjob(initializer={"model": {}}), runtime=runtime(jobs))
    assert [t.rsplit(": ", 1)[1] for t in result.texts()] == [
        "must have container with name - model-initializer in the model-initializer job"]


OLD = {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"serviceAccountName": "a"}}]}
NEW = {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"serviceAccountName": "b"}}]}


@pytest.mark.parametrize("suspend, observed, expected", [
    pytest.param(False, [], ["spec.podTemplateOverrides: Forbidden: PodTemplateOverrides can only be modified "
                             "when the TrainJob is suspended"], id="not-suspended"),
    pytest.param(True, [], [], id="suspended-no-jobset"),
    pytest.param(True, [jobset_doc(True, {"node": 0})], [], id="suspended-inactive-jobset"),
    pytest.param(True, [jobset_doc(True, {"dataset-initializer": 1, "node": 2})],
                 ["spec.podTemplateOverrides: Forbidden: PodTemplateOverrides cannot be modified when the JobSet's "
                  "ReplicatedJob dataset-initializer is still active",
                  "spec.podTemplateOverrides: Forbidden: PodTemplateOverrides cannot be modified when the JobSet's "
                  "ReplicatedJob node is still active"], id="active-jobs"),
    pytest.param(True, ObservedState.of(read_errors={JOBSET: "client error"}),
                 ["spec.podTemplateOverrides: Internal error: client error"], id="jobset-read-error"),
])
def test_override_changes_on_update(suspend: bool, observed: Any, expected: list[str]) -> None:
    old = trainjob(suspend=suspend, **OLD)
    new = trainjob(suspend=suspend, **NEW)
    result = validate_trainjob(new, old, runtime=runtime(), observed=observed)
    assert result.texts() == expected


def test_unchanged_overrides_on_update_are_fine_while_running() -> None:
    result = validate_trainjob(trainjob(**OLD), trainjob(**OLD), runtime=runtime())
    assert result.allowed


def test_torch_runtime_pipeline_with_override_and_coscheduling_worked_example() -> None:
    rt = torch_runtime([job("node", container("node", image="runtime:1",
                                              resources={"requests": {"cpu": "2", "memory": "8Gi"}}),
                            ancestor="trainer")], num_nodes=2, name="alpha", namespace="ns",
                       pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 100}},
                       template_metadata={"labels": {"team": "research"}})
    job_doc = trainjob("job1", "ns", runtime_name="alpha", suspend=True, labels={"team": "prod", "owner": "me"},
                       trainer={"image": "user:2", "env": [{"name": "LR", "value": "0.1"}]},
                       podTemplateOverrides=[{"targetJobs": [{"name": "node"}], "spec": {
                           "nodeSelector": {"pool": "gpu"},
                           "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]}}])
    objects = plan(job_doc, rt).objects
    assert [o["kind"] for o in objects] == ["PodGroup", "JobSet"]
    assert objects[0]["spec"] == {"minMember": 2, "minResources": {"cpu": "4", "memory": "16Gi"},
                                  "scheduleTimeoutSeconds": 100}
    jobset = objects[1]
    assert jobset["metadata"]["labels"] == {"team": "prod", "owner": "me"}
    node = container_of(jobset, "node")
    assert env_of(node)["PET_NPROC_PER_NODE"] == "2" and node["image"] == "user:2"
    template = replicated_job(jobset, "node")["template"]["spec"]["template"]
    assert template["metadata"] == {"labels": {"scheduling.x-k8s.io/pod-group": "job1"}}
    assert template["spec"]["nodeSelector"] == {"pool": "gpu"}


def test_trainer_job_replicas_forced_to_one_even_without_trainer_section() -> None:
    jobs = default_jobs()
    jobs[2]["replicas"] = 4
    jobset = find(plan(trainjob(), runtime(jobs)).objects, "JobSet")
    assert replicated_job(jobset, "node")["replicas"] == 1


def test_runtime_crd_defaults_are_applied_before_planning() -> None:
    rt = runtime(jobset_spec={"failurePolicy": {"maxRestarts": 3}})
    del rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["metadata"]
    jobset = find(plan(trainjob(), rt).objects, "JobSet")
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 3, "restartStrategy": "Recreate"}
    first = jobset["spec"]["replicatedJobs"][0]
    assert list(first)[:3] == ["name", "groupName", "replicas"] and (first["groupName"], first["replicas"]) == (
        "default", 1)
    assert rt["spec"]["template"]["spec"]["failurePolicy"] == {"maxRestarts": 3}  # input untouched
