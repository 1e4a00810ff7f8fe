"""Where Kubeflow Trainer v2.1.0 and v2.3.0 disagree, each level as its release: upstream's
v2.3.0 unit-test cases as API-level cases at the default level, v2.1.0's behaviour under
``--trainer-compat v2.1`` (docs/compatibility.md A17, A18; A7 in test_admission.py, A20 in
test_snapshot.py, B3 in tests/unit/services/test_webhook.py).

Sources at the v2.3.0 tag: pkg/runtime/core/trainingruntime_test.go ("merged resourcesPerNode keeps
runtime resources when trainjob sets gpu only"), pkg/util/trainingruntime/trainingruntime_test.go
(MergeResourceRequirements), pkg/runtime/framework/plugins/jobset/jobset_test.go ("must have
volumeMount with name - initializer in the ... initializer container")."""
from __future__ import annotations

from typing import Any

import pytest

from fixtures.pipeline_builders import container, container_of, find, job, runtime, trainjob
from fixtures.pipeline_builders import plan_past_snapshot as plan
from trainyard.compat import TrainerCompat
from trainyard.pipeline import validate_trainjob

V21, V23 = TrainerCompat.V2_1, TrainerCompat.V2_3


def node_resources(runtime_resources: dict[str, Any] | None, resources_per_node: dict[str, Any],
                   compat: TrainerCompat, *, ml_policy: dict[str, Any] | None = None) -> Any:
    node = container("node", **({"resources": runtime_resources} if runtime_resources else {}))
    rt = runtime([job("node", node, ancestor="trainer")], ml_policy=ml_policy)
    objects = plan(trainjob(trainer={"resourcesPerNode": resources_per_node}), rt, compat=compat).objects
    return container_of(find(objects, "JobSet"), "node").get("resources")


@pytest.mark.parametrize("runtime_resources, per_node, compat, expected", [
    # trainingruntime_test.go: runtime requests cpu 1, TrainJob limits gpu 4.
    pytest.param({"requests": {"cpu": "1"}}, {"limits": {"nvidia.com/gpu": "4"}}, V23,
                 {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "4"}}, id="v2.3-gpu-only-keeps-runtime-cpu"),
    pytest.param({"requests": {"cpu": "1"}}, {"limits": {"nvidia.com/gpu": "4"}}, V21,
                 {"limits": {"nvidia.com/gpu": "4"}}, id="v2.1-gpu-only-replaces"),
    # MergeResourceRequirements: "partial override keeps other runtime keys".
    pytest.param({"requests": {"cpu": "5", "memory": "32Gi"}}, {"requests": {"nvidia.com/gpu": "2", "memory": "1Gi"}},
                 V23, {"requests": {"cpu": "5", "memory": "1Gi", "nvidia.com/gpu": "2"}}, id="v2.3-partial-override"),
    pytest.param({"requests": {"cpu": "5", "memory": "32Gi"}}, {"requests": {"nvidia.com/gpu": "2", "memory": "1Gi"}},
                 V21, {"requests": {"nvidia.com/gpu": "2", "memory": "1Gi"}}, id="v2.1-partial-override-replaces"),
    # MergeResourceRequirements: "trainjob cpu overrides runtime cpu"; claims are not carried (upstream
    # copies only limits and requests into the container).
    pytest.param({"limits": {"cpu": "8"}, "claims": [{"name": "gpu"}]}, {"limits": {"cpu": "4"}}, V23,
                 {"limits": {"cpu": "4"}}, id="v2.3-cpu-overrides"),
    # "empty override returns base".
    pytest.param({"requests": {"cpu": "1"}}, {}, V23, {"requests": {"cpu": "1"}}, id="v2.3-empty-override"),
])
def test_resources_per_node_merge_or_replace(runtime_resources: dict, per_node: dict, compat: TrainerCompat,
                                             expected: dict) -> None:
    assert node_resources(runtime_resources, per_node, compat, ml_policy={"numNodes": 1}) == expected


@pytest.mark.parametrize("compat, expected", [
    pytest.param(V23, {"requests": {"cpu": "1"}}, id="v2.3-ignored-without-mlPolicy"),
    pytest.param(V21, {"limits": {"cpu": "2"}}, id="v2.1-replaced-without-mlPolicy"),
])
def test_runtime_without_ml_policy(compat: TrainerCompat, expected: dict) -> None:
    assert node_resources({"requests": {"cpu": "1"}}, {"limits": {"cpu": "2"}}, compat) == expected


def test_mpi_launcher_as_node_merges_into_the_node_job() -> None:
    launcher = job("launcher", container("node", resources={"requests": {"cpu": "1"}}))
    node = job("node", container("node", resources={"requests": {"cpu": "1"}}), ancestor="trainer")
    rt = runtime([launcher, node], ml_policy={"numNodes": 1, "mpi": {"runLauncherAsNode": True,
                                                                     "mpiImplementation": "OpenMPI"}})
    objects = plan(trainjob(trainer={"resourcesPerNode": {"limits": {"cpu": "3"}}}), rt).objects
    jobset = find(objects, "JobSet")
    node_job = next(j for j in jobset["spec"]["replicatedJobs"] if j["name"] == "node")
    assert node_job["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] == \
        {"requests": {"cpu": "1"}, "limits": {"cpu": "3"}}


def initializer_runtime(section: str) -> dict[str, Any]:
    name = f"{section}-initializer"
    return runtime([job(name, container(name), ancestor=name), job("node", container("node"), ancestor="trainer")],
                   ml_policy={"numNodes": 1, "torch": {}})


@pytest.mark.parametrize("section", ["dataset", "model"])
@pytest.mark.parametrize("compat", [V23, V21], ids=["v2.3", "v2.1"])
def test_initializer_needs_the_initializer_volume_mount(section: str, compat: TrainerCompat) -> None:
    result = validate_trainjob(trainjob(initializer={section: {}}), runtime=initializer_runtime(section), compat=compat)
    name = f"{section}-initializer"
    if compat is V21:
        assert result.allowed, result.texts()
        return
    assert result.code == 403
    assert result.texts() == [
        'spec.runtimeRef: Invalid value: {"name":"test-runtime","kind":"TrainingRuntime",'
        f'"apiGroup":"trainer.kubeflow.org"}}: must have volumeMount with name - initializer in container {name} of the {name} job']


def test_a_runtime_patch_may_add_the_initializer_mount() -> None:
    """The rule reads the runtime as the TrainJob's patches leave it (upstream checks the info's
    JobSet spec, built after the patches)."""
    mount = {"name": "dataset-initializer", "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}]}
    patch = {"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "dataset-initializer", "template": {"spec": {"template": {"spec": {"containers": [mount]}}}}}]}}}}
    result = validate_trainjob(trainjob(initializer={"dataset": {}}, runtimePatches=[patch]),
                               runtime=initializer_runtime("dataset"))
    assert not any("volumeMount" in text for text in result.texts()), result.texts()
