"""API-server rules behind elastic training (pure): the scale subresource's conversions and
path checks, the batch/v1 Job completions update rule, autoscaling/v2 HPA validation."""
from __future__ import annotations

import pytest

from trainyard_services.devcluster.apiserver.registry.builtin_fields import hpa_causes, job_update_causes
from trainyard_services.devcluster.apiserver.registry.scale_view import ScaleError, replicas_causes, scale_of, with_replicas

PATHS = {"specReplicasPath": ".spec.trainer.numNodes", "statusReplicasPath": ".status.elastic.currentNodes",
         "labelSelectorPath": ".status.elastic.selector"}


def trainjob(num_nodes=None, status=None):
    spec = {"runtimeRef": {"name": "r"}}
    if num_nodes is not None:
        spec["trainer"] = {"numNodes": num_nodes}
    obj = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "t", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                        "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"a": "b"}, "generation": 3},
           "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def test_scale_of_a_custom_resource():
    scale, found = scale_of(trainjob(3, {"elastic": {"currentNodes": 2, "selector": "x=y"}}), PATHS)
    assert found
    assert scale == {"kind": "Scale", "apiVersion": "autoscaling/v1",
                     "metadata": {"name": "t", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                                  "creationTimestamp": "2026-01-01T00:00:00Z"},
                     "spec": {"replicas": 3}, "status": {"replicas": 2, "selector": "x=y"}}
    empty, found = scale_of(trainjob(), PATHS)
    assert not found and empty["spec"] == {} and empty["status"] == {"replicas": 0}
    with pytest.raises(ScaleError, match="accessor error: two is of the type string, expected int64"):
        scale_of(trainjob("two"), PATHS)


def test_with_replicas_creates_the_path_and_leaves_the_rest():
    before = trainjob()
    after = with_replicas(before, PATHS, 4)
    assert after["spec"] == {"runtimeRef": {"name": "r"}, "trainer": {"numNodes": 4}}
    assert "trainer" not in before["spec"]


@pytest.mark.parametrize("value,status,message", [
    (2, False, None),
    (-1, False, "Invalid value: -1: should be a non-negative integer"),
    (2**31, False, "Invalid value: 2147483648: should be less than or equal to 2147483647"),
    (1.5, False, "Invalid value: 0: .spec.trainer.numNodes accessor error: 1.5 is of the type float64, expected int64"),
])
def test_replicas_path_checks(value, status, message):
    causes = replicas_causes(trainjob(value), PATHS, status=status)
    assert [c["message"] for c in causes] == ([message] if message else [])


def test_status_paths_are_checked_on_status_writes_only():
    bad = trainjob(1, {"elastic": {"currentNodes": -2, "selector": 5}})
    assert replicas_causes(bad, PATHS) == []
    fields = [c["field"] for c in replicas_causes(bad, PATHS, status=True)]
    assert fields == [".status.elastic.currentNodes", ".status.elastic.selector"]


@pytest.mark.parametrize("new,old,message", [
    ({"completionMode": "Indexed", "completions": 3, "parallelism": 3}, {"completions": 2}, None),
    ({"completionMode": "Indexed", "completions": 3, "parallelism": 2}, {"completions": 2},
     "Invalid value: 3: can only be modified in tandem with spec.parallelism"),
    ({"completionMode": "Indexed", "completions": 2, "parallelism": 5}, {"completions": 2}, None),
    ({"completions": 3, "parallelism": 3}, {"completions": 2}, "Invalid value: 3: field is immutable"),
])
def test_job_completions_update_rule(new, old, message):
    causes = job_update_causes({"spec": new}, {"spec": old})
    assert [c["message"] for c in causes] == ([message] if message else [])
    assert all(c["field"] == "spec.completions" for c in causes)


HPA_SPEC = {"scaleTargetRef": {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "t"},
            "minReplicas": 1, "maxReplicas": 4}


@pytest.mark.parametrize("metric,causes", [
    ({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}, []),
    ({"type": "Pods", "pods": {"metric": {"name": "steps_per_second"},
                               "target": {"type": "AverageValue", "averageValue": "10"}}}, []),
    ({"type": "Resource"}, [("spec.metrics[0].resource", "Required value: must populate information for the given "
                                                         "metric source")]),
    ({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}},
     [("spec.metrics[0].resource.target.averageUtilization",
       "Required value: must set either a target raw value or a target utilization")]),
    ({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 0}}},
     [("spec.metrics[0].resource.target.averageUtilization", "Invalid value: 0: must be greater than 0")]),
    ({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Percent", "averageUtilization": 5}}},
     [("spec.metrics[0].resource.target.type",
       'Invalid value: "Percent": must be either Utilization, Value, or AverageValue')]),
    ({"type": "Pods", "pods": {"metric": {"name": "m"}, "target": {"type": "AverageValue", "averageValue": "0"}}},
     [("spec.metrics[0].pods.target.averageValue", 'Invalid value: "0": must be positive')]),
    ({"type": "Pods", "pods": {"metric": {"name": "m"}, "target": {"type": "AverageValue", "averageValue": "1"}},
      "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 5}}},
     [("spec.metrics[0].resource", "Forbidden: must populate the given metric source only")]),
])
def test_hpa_metrics_validation(metric, causes):
    found = hpa_causes({"spec": dict(HPA_SPEC, metrics=[metric])})
    assert [(c["field"], c["message"]) for c in found] == causes


def test_managed_fields_through_the_scale_and_back():
    from trainyard_services.devcluster.apiserver.registry.scale_view import parent_managed_fields, scale_managed_fields
    owner = {"manager": "owner", "operation": "Apply", "apiVersion": "trainer.kubeflow.org/v1alpha1",
             "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:runtimeRef": {"f:name": {}}, "f:trainer": {"f:numNodes": {}}}}}
    other = {"manager": "labeller", "operation": "Update", "apiVersion": "trainer.kubeflow.org/v1alpha1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}}}}}
    seen = scale_managed_fields([owner, other], PATHS)
    assert [(e["manager"], e["apiVersion"], e["fieldsV1"]) for e in seen] == [
        ("owner", "autoscaling/v1", {"f:spec": {"f:replicas": {}}})]
    taken = [{"manager": "hpa", "operation": "Apply", "apiVersion": "autoscaling/v1", "subresource": "scale",
              "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]
    back = parent_managed_fields([owner, other], taken, PATHS, "trainer.kubeflow.org/v1alpha1")
    assert back[0]["fieldsV1"] == {"f:spec": {"f:runtimeRef": {"f:name": {}}}}  # owner lost numNodes
    assert back[1] == other
    assert back[2] == {"manager": "hpa", "operation": "Apply", "apiVersion": "trainer.kubeflow.org/v1alpha1",
                       "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                       "fieldsV1": {"f:spec": {"f:trainer": {"f:numNodes": {}}}}, "subresource": "scale"}
    shared = parent_managed_fields([owner], seen + taken, PATHS, "trainer.kubeflow.org/v1alpha1")
    assert shared[0]["fieldsV1"] == owner["fieldsV1"]  # co-owners keep it
