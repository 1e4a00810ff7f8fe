"""The runtime snapshot (v2.3.0, KEP-2599; docs/compatibility.md A20) as table tests written from
upstream's facts (pkg/runtime/core/snapshot.go and the runtimes' NewObjects at v2.3.0): the first
plan stores the runtime, later plans read it, and a ConfigMap that is no snapshot of this
TrainJob's runtime fails planning with upstream's texts."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from fixtures.pipeline_builders import container, container_of, find, job, runtime, trainjob
from trainyard.compat import TrainerCompat
from trainyard.pipeline import PlanningError, plan

SNAPSHOT = "test-job-runtime-snapshot"


def node_runtime(image: str = "old", kind: str = "TrainingRuntime", name: str = "test-runtime") -> dict[str, Any]:
    return runtime([job("node", container("node", image=image), ancestor="trainer")], ml_policy={"torch": {}},
                   kind=kind, name=name)


def stored(objects: Any) -> dict[str, Any]:
    config_map = objects[0]
    assert (config_map["kind"], config_map["metadata"]["name"]) == ("ConfigMap", SNAPSHOT)
    return config_map


def snapshot_of(rt: dict[str, Any], *, uid: str = "uid-1", data: dict[str, str] | None = None,
                controller: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": SNAPSHOT, "namespace": "default", "ownerReferences": [
                {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "test-job", "uid": uid,
                 "controller": controller, "blockOwnerDeletion": True}]},
            "data": data if data is not None else {"runtime": yaml.safe_dump(rt)}}


def test_the_first_plan_stores_the_runtime_owned_by_the_trainjob() -> None:
    rt = node_runtime()
    config_map = stored(plan(trainjob(), observed=[rt]).objects)
    assert config_map["apiVersion"] == "v1" and config_map["metadata"]["namespace"] == "default"
    assert config_map["metadata"]["ownerReferences"] == [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "test-job", "uid": "uid-1",
        "controller": True, "blockOwnerDeletion": True}]
    assert list(config_map["data"]) == ["runtime"]
    assert yaml.safe_load(config_map["data"]["runtime"]) == rt


def test_later_plans_read_the_snapshot_whatever_became_of_the_runtime() -> None:
    first = stored(plan(trainjob(), observed=[node_runtime("old")]).objects)
    edited = node_runtime("new")
    again = plan(trainjob(), observed=[edited, first]).objects
    assert stored(again) == first  # written back unchanged
    assert container_of(find(again, "JobSet"), "node")["image"] == "old"
    deleted = plan(trainjob(), observed=[first]).objects  # the runtime is gone
    assert container_of(find(deleted, "JobSet"), "node")["image"] == "old"
    # Another TrainJob (no snapshot yet) gets the edit.
    other = plan(trainjob("other", uid="uid-2"), observed=[edited, first]).objects
    assert container_of(find(other, "JobSet"), "node")["image"] == "new"


def test_a_runtime_given_by_the_caller_does_not_replace_the_snapshot() -> None:
    first = stored(plan(trainjob(), node_runtime("old")).objects)
    objects = plan(trainjob(), node_runtime("new"), [first]).objects
    assert container_of(find(objects, "JobSet"), "node")["image"] == "old"


def test_a_deleted_snapshot_is_made_again_from_the_runtime() -> None:
    objects = plan(trainjob(), observed=[node_runtime("new")]).objects
    assert yaml.safe_load(stored(objects)["data"]["runtime"])["spec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]["containers"][0]["image"] == "new"


def test_cluster_training_runtimes_are_stored_too() -> None:
    rt = node_runtime(kind="ClusterTrainingRuntime", name="cluster-rt")
    job_doc = trainjob(runtime_name="cluster-rt", runtime_kind="ClusterTrainingRuntime")
    first = stored(plan(job_doc, observed=[rt]).objects)
    assert yaml.safe_load(first["data"]["runtime"])["kind"] == "ClusterTrainingRuntime"
    assert container_of(find(plan(job_doc, observed=[first]).objects, "JobSet"), "node")["image"] == "old"


WRONG = ('invalid runtime snapshot: the snapshot refers to the wrong runtime: expecting a runtime with name, api '
         'group and kind of "test-runtime", "trainer.kubeflow.org", "TrainingRuntime" but found runtime with name, '
         'api group and kind of "{name}", "{group}", "{kind}"')


@pytest.mark.parametrize("config_map, message", [
    pytest.param(snapshot_of(node_runtime(), uid="someone-else"),
                 "invalid runtime snapshot: a snapshot configmap exists but is owned by another object", id="other-owner"),
    pytest.param(snapshot_of(node_runtime(), controller=False),
                 "invalid runtime snapshot: a snapshot configmap exists but is owned by another object",
                 id="not-controller"),
    pytest.param(snapshot_of(node_runtime(), data={"other": "x"}),
                 'invalid runtime snapshot: snapshot ConfigMap missing "runtime" data key', id="missing-key"),
    pytest.param(snapshot_of(node_runtime(name="renamed")),
                 WRONG.format(name="renamed", group="trainer.kubeflow.org", kind="TrainingRuntime"), id="other-name"),
    pytest.param(snapshot_of(node_runtime(kind="ClusterTrainingRuntime")),
                 WRONG.format(name="test-runtime", group="trainer.kubeflow.org", kind="ClusterTrainingRuntime"),
                 id="other-kind"),
    pytest.param(snapshot_of({**node_runtime(), "apiVersion": "example.com/v1"}),
                 WRONG.format(name="test-runtime", group="example.com", kind="TrainingRuntime"), id="other-group"),
    pytest.param(snapshot_of({}, data={"runtime": "spec: [unclosed"}),
                 "invalid runtime snapshot: unable to unmarshal the snapshot: ", id="not-yaml"),
])
def test_a_config_map_that_is_no_snapshot_of_this_runtime_fails_planning(config_map: dict, message: str) -> None:
    with pytest.raises(PlanningError) as raised:
        plan(trainjob(), observed=[node_runtime(), config_map])
    assert raised.value.message.startswith("unable to get runtime snapshot: " + message)  # TrainingRuntime's prefix
    assert raised.value.reason in (None, "", "TrainJobResourcesCreationFailed")


def test_cluster_training_runtime_errors_carry_its_prefix() -> None:
    rt = node_runtime(kind="ClusterTrainingRuntime", name="cluster-rt")
    job_doc = trainjob(runtime_name="cluster-rt", runtime_kind="ClusterTrainingRuntime")
    with pytest.raises(PlanningError) as raised:
        plan(job_doc, observed=[rt, snapshot_of(rt, data={})])
    assert raised.value.message == 'getting runtime snapshot: invalid runtime snapshot: snapshot ConfigMap missing ' \
                                   '"runtime" data key'


def test_v2_1_reads_the_runtime_live_and_stores_nothing() -> None:
    first = stored(plan(trainjob(), observed=[node_runtime("old")]).objects)
    objects = plan(trainjob(), observed=[node_runtime("new"), first], compat=TrainerCompat.V2_1).objects
    assert [o["kind"] for o in objects] == ["JobSet"]
    assert container_of(find(objects, "JobSet"), "node")["image"] == "new"
    broken = copy.deepcopy(first)
    broken["data"] = {}
    assert plan(trainjob(), observed=[node_runtime(), broken], compat=TrainerCompat.V2_1).objects
