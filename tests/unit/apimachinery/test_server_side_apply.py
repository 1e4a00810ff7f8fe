"""Server-side apply: ownership, conflicts, force, removal of unapplied fields, Update entries."""
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.apimachinery.fieldpath import format_path, from_fields_v1, to_fields_v1
from trainyard.apimachinery.openapi_definitions import builtin_schema, structural_schema
from trainyard.apimachinery.server_side_apply import (
    ApplyConflict,
    ApplyError,
    apply,
    owned_fields,
    record_update,
)

T1, T2, T3 = "2025-01-02T03:04:05Z", "2025-01-02T03:05:00Z", "2025-01-02T03:06:00Z"
DEPLOYMENT = builtin_schema("io.k8s.api.apps.v1.Deployment")
POD = builtin_schema("io.k8s.api.core.v1.Pod")
TRAINJOB = structural_schema({
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "suspend": {"type": "boolean"},
            "trainer": {"type": "object", "properties": {
                "numNodes": {"type": "integer"}, "image": {"type": "string"},
                "args": {"type": "array", "items": {"type": "string"}},
                "env": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}},
            }},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        }},
        "status": {"type": "object", "properties": {
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                           "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}},
        }},
    },
})


def trainjob(spec: dict, **metadata) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "tj", "namespace": "default", **metadata}, "spec": spec}


def entry(obj: dict, manager: str, operation: str = "Apply") -> dict:
    return next(e for e in obj["metadata"]["managedFields"] if e["manager"] == manager and e["operation"] == operation)


def test_apply_creates_and_owns_exactly_the_config_fields() -> None:
    config = trainjob({"trainer": {"numNodes": 2, "env": [{"name": "A", "value": "1"}]}}, labels={"team": "ml"})
    result = apply(None, config, manager="kubectl", schema=TRAINJOB, now=T1, status_is_subresource=True)
    assert result.created and result.changed
    assert result.object["spec"] == config["spec"]
    managed = entry(result.object, "kubectl")
    assert managed == {
        "manager": "kubectl", "operation": "Apply", "apiVersion": "trainer.kubeflow.org/v1alpha1", "time": T1,
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}},
                     "f:spec": {"f:trainer": {"f:env": {'k:{"name":"A"}': {".": {}, "f:name": {}, "f:value": {}}},
                                              "f:numNodes": {}}}},
    }


def test_identical_reapply_is_a_no_op() -> None:
    config = trainjob({"trainer": {"numNodes": 2}})
    first = apply(None, config, manager="applier", schema=TRAINJOB, now=T1)
    again = apply(first.object, config, manager="applier", schema=TRAINJOB, now=T2)
    assert not again.changed
    assert again.object == first.object


def test_conflict_with_an_update_manager_uses_the_api_server_wording() -> None:
    created = apply(None, trainjob({"trainer": {"numNodes": 2}}), manager="kubectl", schema=TRAINJOB, now=T1).object
    patched = dict(created, spec={"trainer": {"numNodes": 5}})
    live = record_update(created, patched, manager="kubectl-patch", schema=TRAINJOB, now=T2)
    assert entry(live, "kubectl-patch", "Update")["fieldsV1"] == {"f:spec": {"f:trainer": {"f:numNodes": {}}}}
    # the patched field left the applier's entry, which is now empty and gone
    assert [e["manager"] for e in live["metadata"]["managedFields"]] == ["kubectl-patch"]
    with pytest.raises(ApplyConflict) as raised:
        apply(live, trainjob({"trainer": {"numNodes": 3}}), manager="other", schema=TRAINJOB, now=T3)
    assert str(raised.value) == ('Apply failed with 1 conflict: conflict with "kubectl-patch" using '
                                 f"trainer.kubeflow.org/v1alpha1 at {T2}: .spec.trainer.numNodes")
    assert raised.value.causes() == [{
        "reason": "FieldManagerConflict", "field": ".spec.trainer.numNodes",
        "message": f'conflict with "kubectl-patch" using trainer.kubeflow.org/v1alpha1 at {T2}'}]


def test_conflicts_between_two_appliers_and_force_takes_ownership() -> None:
    first = apply(None, trainjob({"trainer": {"numNodes": 2, "image": "a"}, "suspend": True}),
                  manager="alice", schema=TRAINJOB, now=T1).object
    config = trainjob({"trainer": {"numNodes": 4, "image": "b"}, "suspend": True})
    with pytest.raises(ApplyConflict) as raised:
        apply(first, config, manager="bob", schema=TRAINJOB, now=T2)
    assert str(raised.value) == ('Apply failed with 2 conflicts: conflicts with "alice":\n'
                                 "- .spec.trainer.image\n- .spec.trainer.numNodes")
    forced = apply(first, config, manager="bob", schema=TRAINJOB, now=T2, force=True)
    assert forced.object["spec"]["trainer"] == {"numNodes": 4, "image": "b"}
    assert [format_path(c.path) for c in forced.forced] == [".spec.trainer.image", ".spec.trainer.numNodes"]
    # alice keeps the shared, unchanged field only
    assert entry(forced.object, "alice")["fieldsV1"] == {"f:spec": {"f:suspend": {}}}
    assert entry(forced.object, "bob")["fieldsV1"]["f:spec"]["f:suspend"] == {}


def test_same_value_is_shared_ownership_without_conflict() -> None:
    first = apply(None, trainjob({"trainer": {"numNodes": 2}}), manager="alice", schema=TRAINJOB, now=T1).object
    shared = apply(first, trainjob({"trainer": {"numNodes": 2}}), manager="bob", schema=TRAINJOB, now=T2)
    assert not shared.forced
    assert {e["manager"] for e in shared.object["metadata"]["managedFields"]} == {"alice", "bob"}


def test_fields_no_longer_applied_are_removed_unless_someone_else_owns_them() -> None:
    first = apply(None, trainjob({"trainer": {"numNodes": 2, "image": "x", "env": [{"name": "A", "value": "1"}]}},
                                 labels={"a": "1", "b": "2"}),
                  manager="applier", schema=TRAINJOB, now=T1).object
    # another manager also owns label b
    labels_only = {key: value for key, value in trainjob({}, labels={"b": "2"}).items() if key != "spec"}
    first = apply(first, labels_only, manager="other", schema=TRAINJOB, now=T1).object
    second = apply(first, trainjob({"trainer": {"image": "x"}}), manager="applier", schema=TRAINJOB, now=T2).object
    assert second["spec"] == {"trainer": {"image": "x"}}
    assert second["metadata"]["labels"] == {"b": "2"}
    # dropping the whole spec removes the emptied struct too; applying `spec: {}` keeps it
    without_spec = {key: value for key, value in trainjob({}).items() if key != "spec"}
    third = apply(second, without_spec, manager="applier", schema=TRAINJOB, now=T3).object
    assert "spec" not in third
    kept = apply(second, trainjob({}), manager="applier", schema=TRAINJOB, now=T3).object
    assert kept["spec"] == {}


def test_crd_lists_without_list_type_are_atomic_and_replace() -> None:
    first = apply(None, trainjob({"trainer": {"args": ["a", "b"]}}), manager="m", schema=TRAINJOB, now=T1).object
    assert entry(first, "m")["fieldsV1"] == {"f:spec": {"f:trainer": {"f:args": {}}}}
    second = apply(first, trainjob({"trainer": {"args": ["c"]}}), manager="m", schema=TRAINJOB, now=T2).object
    assert second["spec"]["trainer"]["args"] == ["c"]


def test_list_map_items_merge_by_key_and_other_managers_items_stay() -> None:
    first = apply(None, trainjob({"trainer": {"env": [{"name": "A", "value": "1"}]}}),
                  manager="m1", schema=TRAINJOB, now=T1).object
    second = apply(first, trainjob({"trainer": {"env": [{"name": "B", "value": "2"}]}}),
                   manager="m2", schema=TRAINJOB, now=T2).object
    assert second["spec"]["trainer"]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    with pytest.raises(ApplyConflict, match=r'conflict with "m1": .spec.trainer.env\[name="A"\].value'):
        apply(second, trainjob({"trainer": {"env": [{"name": "A", "value": "9"}]}}), manager="m2", schema=TRAINJOB, now=T3)


def test_builtin_containers_ports_and_volume_mounts_are_keyed_upstream_style() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "finalizers": ["x"]},
           "spec": {"containers": [{"name": "node", "image": "i", "ports": [{"containerPort": 80}],
                                    "volumeMounts": [{"name": "v", "mountPath": "/data"}]}]}}
    fields = to_fields_v1(owned_fields(pod, POD))
    container = fields["f:spec"]["f:containers"]['k:{"name":"node"}']
    assert container["."] == {}
    assert 'k:{"containerPort":80,"protocol":"TCP"}' in container["f:ports"]
    assert 'k:{"mountPath":"/data"}' in container["f:volumeMounts"]
    assert fields["f:metadata"]["f:finalizers"] == {'v:"x"': {}}


def test_status_subresource_scoping() -> None:
    created = apply(None, trainjob({"trainer": {"numNodes": 1}}), manager="kubectl", schema=TRAINJOB, now=T1,
                    status_is_subresource=True).object
    status_config = {**trainjob({"trainer": {"numNodes": 99}}), "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    applied = apply(created, status_config, manager="trainer", schema=TRAINJOB, now=T2, subresource="status")
    assert applied.object["spec"] == {"trainer": {"numNodes": 1}}
    assert applied.object["status"]["conditions"] == [{"type": "Complete", "status": "True"}]
    status_entry = entry(applied.object, "trainer")
    assert status_entry["subresource"] == "status"
    assert list(status_entry["fieldsV1"]) == ["f:status"]
    # a main-resource apply ignores status
    main = apply(applied.object, {**trainjob({"trainer": {"numNodes": 1}}), "status": {"conditions": []}},
                 manager="kubectl", schema=TRAINJOB, now=T3, status_is_subresource=True)
    assert main.object["status"] == applied.object["status"]
    assert not main.changed


def test_update_entries_track_changed_fields_and_removals() -> None:
    created = record_update(None, trainjob({"trainer": {"numNodes": 1}}, labels={"a": "1"}),
                            manager="kubectl-create", schema=TRAINJOB, now=T1)
    assert entry(created, "kubectl-create", "Update")["fieldsV1"] == {
        "f:metadata": {"f:labels": {".": {}, "f:a": {}}},
        "f:spec": {".": {}, "f:trainer": {".": {}, "f:numNodes": {}}},
    }
    edited = dict(created, metadata={**created["metadata"], "labels": {}}, spec={"trainer": {"numNodes": 1, "image": "x"}})
    updated = record_update(created, edited, manager="editor", schema=TRAINJOB, now=T2)
    assert entry(updated, "editor", "Update")["fieldsV1"] == {"f:spec": {"f:trainer": {"f:image": {}}}}
    assert "f:a" not in entry(updated, "kubectl-create", "Update")["fieldsV1"]["f:metadata"]["f:labels"]


def test_bad_applied_configurations_are_clear_errors() -> None:
    with pytest.raises(ApplyError, match="fieldManager: Required value"):
        apply(None, trainjob({}), manager="", schema=TRAINJOB, now=T1)
    with pytest.raises(ApplyError, match=r'\.spec\.trainer\.env\[name="A"\]: duplicate entries'):
        apply(None, trainjob({"trainer": {"env": [{"name": "A"}, {"name": "A"}]}}), manager="m", schema=TRAINJOB, now=T1)
    with pytest.raises(ApplyError, match="missing its key field"):
        apply(None, trainjob({"trainer": {"env": [{"value": "x"}]}}), manager="m", schema=TRAINJOB, now=T1)


def test_fields_v1_round_trip() -> None:
    tree = {"f:metadata": {"f:labels": {".": {}, "f:a": {}}},
            "f:spec": {"f:containers": {'k:{"name":"c"}': {".": {}, "f:image": {}}}}}
    assert to_fields_v1(from_fields_v1(tree)) == tree


def test_deployment_apply_after_kubectl_create_shares_unchanged_replicas() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "c", "image": "a"}]}}}}
    created = record_update(None, deployment, manager="kubectl-client-side-apply", schema=DEPLOYMENT, now=T1)
    with pytest.raises(ApplyConflict) as raised:
        apply(created, {**deployment, "spec": {**deployment["spec"], "replicas": 3}},
              manager="kubectl", schema=DEPLOYMENT, now=T2)
    assert str(raised.value) == ('Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" '
                                 f"using apps/v1 at {T1}: .spec.replicas")


label_maps = st.dictionaries(st.sampled_from(["a", "b", "c", "example.com/d"]), st.sampled_from(["1", "2"]), max_size=4)
env_lists = st.lists(st.sampled_from(["A", "B", "C", "D"]), unique=True, max_size=4).map(
    lambda names: [{"name": name, "value": name.lower()} for name in names])


@settings(max_examples=40, deadline=None)
@given(label_maps, env_lists, label_maps, env_lists.filter(bool))
def test_one_applier_converges_to_its_latest_config(labels1, env1, labels2, env2) -> None:
    """Whatever a sole manager applied before, the object ends up holding exactly the new config."""
    first = apply(None, trainjob({"trainer": {"env": env1}}, labels=labels1), manager="m", schema=TRAINJOB, now=T1)
    second = apply(first.object, trainjob({"trainer": {"env": env2}}, labels=labels2), manager="m", schema=TRAINJOB, now=T2)
    assert second.object["metadata"].get("labels", {}) == labels2
    assert second.object["spec"]["trainer"]["env"] == env2
    again = apply(second.object, trainjob({"trainer": {"env": env2}}, labels=labels2), manager="m", schema=TRAINJOB, now=T3)
    assert not again.changed


def test_an_applied_empty_list_owns_nothing_so_its_struct_goes_away() -> None:
    """Upstream quirk kept on purpose: `env: []` owns no field, so the spec it was in is pruned."""
    first = apply(None, trainjob({"trainer": {"env": [{"name": "A"}]}}), manager="m", schema=TRAINJOB, now=T1)
    second = apply(first.object, trainjob({"trainer": {"env": []}}), manager="m", schema=TRAINJOB, now=T2)
    assert "spec" not in second.object


@settings(max_examples=40, deadline=None)
@given(label_maps, label_maps)
def test_fields_of_another_manager_survive_removal(mine, theirs) -> None:
    base = apply(None, trainjob({}, labels=theirs), manager="them", schema=TRAINJOB, now=T1).object
    mine_applied = apply(base, trainjob({}, labels={**mine, **theirs}), manager="me", schema=TRAINJOB, now=T2).object
    withdrawn = apply(mine_applied, trainjob({}), manager="me", schema=TRAINJOB, now=T3).object
    assert withdrawn["metadata"].get("labels", {}) == theirs


def test_more_than_ten_update_managers_fold_the_oldest_into_ancient_changes() -> None:
    obj = trainjob({"trainer": {"numNodes": 1}})
    live = None
    for index in range(12):
        new = dict(obj, metadata={**obj["metadata"], "labels": {f"k{index}": "v"} | (live or obj)["metadata"].get("labels", {})})
        live = record_update(live, new, manager=f"writer-{index:02d}", schema=TRAINJOB, now=f"2025-01-02T03:04:{index:02d}Z")
        obj = live
    entries = live["metadata"]["managedFields"]
    assert len(entries) == 10
    ancient = [e for e in entries if e["manager"] == "ancient-changes"]
    assert len(ancient) == 1 and ancient[0]["time"] == "2025-01-02T03:04:02Z"
    assert {"f:k0", "f:k1", "f:k2"} <= set(ancient[0]["fieldsV1"]["f:metadata"]["f:labels"])
    assert "writer-11" in {e["manager"] for e in entries}


def test_writes_can_reset_managed_fields_but_applies_cannot_set_them() -> None:
    created = apply(None, trainjob({"trainer": {"numNodes": 1}}), manager="m", schema=TRAINJOB, now=T1).object
    reset = record_update(created, {**created, "metadata": {**created["metadata"], "managedFields": [{}]}},
                          manager="admin", schema=TRAINJOB, now=T2)
    assert "managedFields" not in reset["metadata"]
    kept = record_update(created, {**created, "metadata": {**created["metadata"], "managedFields": []}},
                         manager="admin", schema=TRAINJOB, now=T2)
    assert kept["metadata"]["managedFields"] == created["metadata"]["managedFields"]
    with pytest.raises(ApplyError, match="metadata.managedFields must be nil"):
        apply(created, created, manager="m", schema=TRAINJOB, now=T3)


def test_kubectl_server_side_apply_upgrades_from_client_side_apply() -> None:
    """`kubectl apply` then `kubectl apply --server-side` with a changed value: no conflict for
    fields the last-applied annotation describes; the annotation follows the new config."""
    config = trainjob({"trainer": {"numNodes": 2}})
    annotation = "kubectl.kubernetes.io/last-applied-configuration"
    csa = {**config, "metadata": {**config["metadata"], "annotations": {annotation: json.dumps(config)}}}
    live = record_update(None, csa, manager="kubectl-client-side-apply", schema=TRAINJOB, now=T1)
    changed = trainjob({"trainer": {"numNodes": 3}})
    with pytest.raises(ApplyConflict):
        apply(live, changed, manager="someone-else", schema=TRAINJOB, now=T2)
    upgraded = apply(live, changed, manager="kubectl", schema=TRAINJOB, now=T2).object
    assert upgraded["spec"]["trainer"]["numNodes"] == 3
    assert json.loads(upgraded["metadata"]["annotations"][annotation]) == changed
    # a field changed by someone else since the client-side apply still conflicts
    patched = record_update(live, {**live, "spec": {"trainer": {"numNodes": 5}}}, manager="kubectl-patch",
                            schema=TRAINJOB, now=T2)
    with pytest.raises(ApplyConflict, match='conflict with "kubectl-patch"'):
        apply(patched, changed, manager="kubectl", schema=TRAINJOB, now=T3)


def test_apply_leaves_its_inputs_alone_and_returns_an_object_of_its_own() -> None:
    # the merge shares unchanged parts with the live object while it works (copy-on-write):
    # callers must still be able to keep, compare and edit live, config and result independently
    first = apply(None, trainjob({"trainer": {"numNodes": 1, "image": "a", "env": [{"name": "A", "value": "1"}],
                                              "args": ["x"]}}, labels={"team": "ml"}),
                  manager="applier", schema=TRAINJOB, now=T1)
    live = first.object
    config = trainjob({"trainer": {"numNodes": 2, "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}]}},
                      labels={"team": "ml"})
    live_before, config_before = json.loads(json.dumps(live)), json.loads(json.dumps(config))
    status_live = {**live, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    status_before = json.loads(json.dumps(status_live))

    result = apply(live, config, manager="applier", schema=TRAINJOB, now=T2)  # prunes image and args
    status_result = apply(status_live, {"apiVersion": live["apiVersion"], "kind": "TrainJob", "metadata": {"name": "tj"},
                                        "status": {"conditions": [{"type": "Ready", "status": "False"}]}},
                          manager="status-writer", schema=TRAINJOB, now=T2, subresource="status")

    assert live == live_before and config == config_before and status_live == status_before
    assert result.object["spec"] == {"trainer": {"numNodes": 2, "env": [{"name": "A", "value": "2"},
                                                                        {"name": "B", "value": "3"}]}}
    result.object["spec"]["trainer"]["env"][0]["value"] = "edited"
    result.object["metadata"]["labels"]["team"] = "edited"
    status_result.object["spec"]["trainer"]["numNodes"] = 99
    assert live == live_before and config == config_before and status_live == status_before
