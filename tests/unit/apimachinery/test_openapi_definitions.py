"""The pinned Kubernetes 1.36 definitions answer the questions patching and apply ask."""
import pytest

from trainyard.apimachinery.openapi_definitions import (
    UnknownDefinitionError,
    builtin_schema,
    definition,
    definition_name_for,
    group_version_kinds,
    structural_schema,
)


def test_pod_spec_list_semantics() -> None:
    spec = builtin_schema("io.k8s.api.core.v1.PodTemplateSpec").field("spec")
    assert spec is not None
    containers = spec.field("containers")
    assert containers.patch_strategies == ("merge",)
    assert containers.patch_merge_key == "name"
    assert containers.list_type == "map" and containers.list_map_keys == ("name",)
    volumes = spec.field("volumes")
    assert volumes.patch_strategies == ("merge", "retainKeys")
    assert spec.field("tolerations").list_type == "atomic"
    mounts = containers.items().field("volumeMounts")
    assert mounts.patch_merge_key == "mountPath"
    ports = containers.items().field("ports")
    assert ports.list_map_keys == ("containerPort", "protocol")


def test_metadata_maps_and_sets() -> None:
    meta = builtin_schema("io.k8s.api.core.v1.Pod").field("metadata")
    assert meta.field("labels").is_map
    assert meta.field("labels").field("any-key").schema.get("type") is not None
    assert meta.field("finalizers").list_type == "set"
    assert meta.field("ownerReferences").list_map_keys == ("uid",)
    assert meta.field("ownerReferences").items().map_type == "atomic"


def test_group_version_kind_lookups() -> None:
    assert definition_name_for("v1", "Pod") == "io.k8s.api.core.v1.Pod"
    assert definition_name_for("batch/v1", "Job") == "io.k8s.api.batch.v1.Job"
    assert definition_name_for("trainer.kubeflow.org/v1alpha1", "TrainJob") is None
    assert ("", "v1", "ConfigMap") in group_version_kinds("io.k8s.api.core.v1.ConfigMap")


def test_unknown_names_raise_a_clear_error() -> None:
    with pytest.raises(UnknownDefinitionError, match="io.k8s.api.core.v1.Nope"):
        definition("io.k8s.api.core.v1.Nope")


def test_crd_lists_default_to_atomic_and_metadata_is_object_meta() -> None:
    schema = structural_schema({
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {
                "args": {"type": "array", "items": {"type": "string"}},
                "jobs": {"type": "array", "x-kubernetes-list-type": "map",
                         "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}},
            }},
            "metadata": {"type": "object"},
        },
    })
    spec = schema.field("spec")
    assert spec.field("args").list_type == "atomic"
    assert spec.field("jobs").list_type == "map" and spec.field("jobs").list_map_keys == ("name",)
    assert schema.field("metadata").field("finalizers").list_type == "set"
