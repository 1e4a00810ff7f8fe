"""Strategic merge patch behaves like the Kubernetes API server for built-in types."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.apimachinery.errors import PatchError, UnsupportedPatchType
from trainyard.apimachinery.merge_patch import json_merge_patch
from trainyard.apimachinery.strategic_merge import strategic_merge_patch

POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
POD = "io.k8s.api.core.v1.Pod"


def env(*pairs: tuple[str, str]) -> list[dict]:
    return [{"name": name, "value": value} for name, value in pairs]


def test_pod_template_override_like_upstream_trainer() -> None:
    """The podTemplateOverrides case of spec §4.1.2: merge by the strategic keys, replace atomics."""
    runtime_template = {
        "metadata": {"labels": {"keep": "1"}},
        "spec": {
            "initContainers": [
                {"name": "override-init-container", "image": "test:runtime",
                 "env": env(("INIT_ENV", "original_init"), ("DATASET_PATH", "runtime"))},
            ],
            "containers": [
                {"name": "node", "image": "test:runtime", "volumeMounts": [{"name": "a", "mountPath": "/a"}]},
            ],
            "tolerations": [{"key": "old", "operator": "Exists"}],
            "nodeSelector": {"zone": "x"},
        },
    }
    override = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "n"}},
        "spec": {
            "serviceAccountName": "override-sa",
            "initContainers": [
                {"name": "override-init-container",
                 "env": env(("INIT_ENV", "override_init"), ("NEW_VALUE", "from_overrides"))},
            ],
            "containers": [{"name": "node", "volumeMounts": [{"name": "s", "mountPath": "/secret"}]}],
            "volumes": [{"name": "s", "secret": {"secretName": "node_secret_name"}}],
            "tolerations": [{"key": "example.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
            "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}],
            "imagePullSecrets": [{"name": "registry-credential"}],
        },
    }
    merged = strategic_merge_patch(runtime_template, override, POD_TEMPLATE)
    init = merged["spec"]["initContainers"][0]
    assert init["image"] == "test:runtime"
    assert {e["name"]: e["value"] for e in init["env"]} == {
        "INIT_ENV": "override_init", "DATASET_PATH": "runtime", "NEW_VALUE": "from_overrides"}
    assert merged["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "s", "mountPath": "/secret"}, {"name": "a", "mountPath": "/a"}]
    assert merged["spec"]["tolerations"] == override["spec"]["tolerations"]
    assert merged["spec"]["nodeSelector"] == {"zone": "x", "node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert merged["spec"]["serviceAccountName"] == "override-sa"
    assert merged["metadata"] == {"labels": {"keep": "1", "team": "ml"}, "annotations": {"note": "n"}}
    assert merged["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    # the inputs are untouched
    assert runtime_template["spec"]["tolerations"] == [{"key": "old", "operator": "Exists"}]


def test_override_naming_a_missing_container_adds_a_partial_container() -> None:
    """Upstream's order: items named by the patch but not live come before the live-only items."""
    template = {"spec": {"containers": [{"name": "node", "image": "i"}]}}
    patch = {"spec": {"containers": [{"name": "sidecar", "env": env(("A", "1"))}]}}
    merged = strategic_merge_patch(template, patch, POD_TEMPLATE)
    assert merged["spec"]["containers"] == [
        {"name": "sidecar", "env": [{"name": "A", "value": "1"}]}, {"name": "node", "image": "i"}]


def test_live_order_is_kept_around_patched_items() -> None:
    template = {"spec": {"containers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}}
    patch = {"spec": {"containers": [{"name": "b", "image": "x"}, {"name": "d"}]}}
    merged = strategic_merge_patch(template, patch, POD_TEMPLATE)
    assert [c["name"] for c in merged["spec"]["containers"]] == ["a", "b", "d", "c"]


def test_later_overrides_win_for_the_same_key() -> None:
    template = {"spec": {"nodeSelector": {"t": "a"}}}
    first = strategic_merge_patch(template, {"spec": {"nodeSelector": {"t": "p5.48xlarge"}}}, POD_TEMPLATE)
    second = strategic_merge_patch(first, {"spec": {"nodeSelector": {"t": "p5en.48xlarge"}}}, POD_TEMPLATE)
    assert second["spec"]["nodeSelector"] == {"t": "p5en.48xlarge"}


def test_empty_override_spec_leaves_template_untouched() -> None:
    template = {"spec": {"affinity": {"nodeAffinity": {"x": 1}}, "containers": [{"name": "node"}]}}
    assert strategic_merge_patch(template, {"spec": {}}, POD_TEMPLATE) == template


@pytest.mark.parametrize(
    ("live", "patch", "expected"),
    [
        # volumeMounts merge by mountPath, not by name
        ([{"name": "a", "mountPath": "/x"}], [{"name": "b", "mountPath": "/x"}], [{"name": "b", "mountPath": "/x"}]),
        ([{"name": "a", "mountPath": "/x"}], [{"name": "a", "mountPath": "/y"}],
         [{"name": "a", "mountPath": "/y"}, {"name": "a", "mountPath": "/x"}]),
        # $patch: delete removes the item with that key
        ([{"name": "a", "mountPath": "/x"}, {"name": "b", "mountPath": "/y"}],
         [{"$patch": "delete", "mountPath": "/x"}], [{"name": "b", "mountPath": "/y"}]),
        # $patch: replace replaces the whole list
        ([{"name": "a", "mountPath": "/x"}], [{"name": "c", "mountPath": "/z"}, {"$patch": "replace"}],
         [{"name": "c", "mountPath": "/z"}]),
    ],
)
def test_volume_mounts_merge_by_mount_path(live: list, patch: list, expected: list) -> None:
    original = {"spec": {"containers": [{"name": "node", "volumeMounts": live}]}}
    merged = strategic_merge_patch(original, {"spec": {"containers": [{"name": "node", "volumeMounts": patch}]}}, POD)
    assert merged["spec"]["containers"][0]["volumeMounts"] == expected


def test_retain_keys_switches_a_volume_source() -> None:
    original = {"spec": {"volumes": [{"name": "data", "emptyDir": {"medium": "Memory"}}]}}
    patch = {"spec": {"volumes": [{"name": "data", "$retainKeys": ["name", "hostPath"], "hostPath": {"path": "/d"}}]}}
    merged = strategic_merge_patch(original, patch, POD)
    assert merged["spec"]["volumes"] == [{"name": "data", "hostPath": {"path": "/d"}}]


def test_retain_keys_rejects_a_patch_field_it_does_not_list() -> None:
    original = {"spec": {"volumes": [{"name": "data", "emptyDir": {}}]}}
    patch = {"spec": {"volumes": [{"name": "data", "$retainKeys": ["name"], "hostPath": {"path": "/d"}}]}}
    with pytest.raises(PatchError, match="hostPath"):
        strategic_merge_patch(original, patch, POD)


def test_null_deletes_and_map_level_directives() -> None:
    original = {"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"nodeSelector": {"x": "1"}, "hostname": "h"}}
    patch = {
        "metadata": {"labels": {"a": None}},
        "spec": {"nodeSelector": {"$patch": "replace", "y": "2"}, "hostname": None},
    }
    merged = strategic_merge_patch(original, patch, POD)
    assert merged == {"metadata": {"labels": {"b": "2"}}, "spec": {"nodeSelector": {"y": "2"}}}
    deleted = strategic_merge_patch(original, {"spec": {"$patch": "delete"}}, POD)
    assert deleted["spec"] == {}


def test_finalizers_are_a_merged_set_with_delete_from_primitive_list() -> None:
    original = {"metadata": {"finalizers": ["a", "b"]}}
    merged = strategic_merge_patch(original, {"metadata": {"finalizers": ["c", "a"]}}, POD)
    assert sorted(merged["metadata"]["finalizers"]) == ["a", "b", "c"]
    removed = strategic_merge_patch(original, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, POD)
    assert removed["metadata"]["finalizers"] == ["b"]


def test_set_element_order_reorders_containers() -> None:
    original = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}}
    patch = {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                      "containers": [{"name": "a", "image": "3"}]}}
    merged = strategic_merge_patch(original, patch, POD)
    assert merged["spec"]["containers"] == [{"name": "b", "image": "2"}, {"name": "a", "image": "3"}]


def test_atomic_lists_replace_and_container_ports_merge_by_port() -> None:
    original = {"spec": {"containers": [{"name": "n", "args": ["a", "b"], "ports": [{"containerPort": 80}]}]}}
    patch = {"spec": {"containers": [{"name": "n", "args": ["c"], "ports": [{"containerPort": 29500}]}]}}
    container = strategic_merge_patch(original, patch, POD)["spec"]["containers"][0]
    assert container["args"] == ["c"]
    assert container["ports"] == [{"containerPort": 29500}, {"containerPort": 80}]


def test_new_values_drop_nulls_and_directives() -> None:
    merged = strategic_merge_patch({}, {"spec": {"containers": [{"name": "n", "image": None}]}}, POD)
    assert merged == {"spec": {"containers": [{"name": "n"}]}}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"spec": {"$patch": "explode"}}, "spec: unknown patch directive"),
        ({"spec": {"containers": [{"image": "x"}]}}, "merge key 'name'"),
        ({"spec": {"containers": [{"name": "a"}, {"$patch": "merge"}]}}, "not supported inside a list"),
        ({"spec": {"volumes": [{"name": "v", "$retainKeys": "name"}]}}, "list of field names"),
    ],
)
def test_malformed_patches_name_the_field(patch: dict, message: str) -> None:
    original = {"spec": {"containers": [{"name": "a"}], "volumes": [{"name": "v"}]}}
    with pytest.raises(PatchError, match=message):
        strategic_merge_patch(original, patch, POD)


def test_custom_resources_have_no_strategic_patch_unless_caller_falls_back() -> None:
    with pytest.raises(UnsupportedPatchType):
        strategic_merge_patch({}, {"spec": {}}, "org.kubeflow.trainer.v1alpha1.TrainJob")
    merged = strategic_merge_patch({"spec": {"a": [1], "b": 1}}, {"spec": {"a": [2], "b": None}},
                                   "org.kubeflow.trainer.v1alpha1.TrainJob", fall_back_to_merge_patch=True)
    assert merged == {"spec": {"a": [2]}}


labels = st.dictionaries(st.text(min_size=1, max_size=5), st.text(max_size=5), max_size=4)


@settings(max_examples=40, deadline=None)
@given(labels, labels)
def test_label_patches_merge_like_dict_update(live: dict, patch: dict) -> None:
    merged = strategic_merge_patch({"metadata": {"labels": live}}, {"metadata": {"labels": patch}}, POD)
    assert merged["metadata"]["labels"] == {**live, **patch}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from("abcdef"), unique=True), st.lists(st.sampled_from("abcdef"), unique=True))
def test_container_merge_keeps_every_name_once(live: list, patch: list) -> None:
    original = {"spec": {"containers": [{"name": n, "image": "old"} for n in live]}}
    merged = strategic_merge_patch(original, {"spec": {"containers": [{"name": n, "image": "new"} for n in patch]}}, POD)
    names = [c["name"] for c in merged["spec"]["containers"]]
    assert sorted(names) == sorted(set(live) | set(patch))
    assert all(c["image"] == ("new" if c["name"] in patch else "old") for c in merged["spec"]["containers"])
    assert [n for n in names if n in live and n not in patch] == [n for n in live if n not in patch]


string_maps = st.dictionaries(st.text(min_size=1, max_size=3), st.none() | st.text(max_size=3), max_size=4)


@settings(max_examples=40, deadline=None)
@given(string_maps, string_maps, string_maps, string_maps)
def test_on_maps_and_scalars_strategic_merge_equals_json_merge_patch(labels, annotations, patch_labels, patch_annotations) -> None:
    live = {"metadata": {"labels": {k: v for k, v in labels.items() if v is not None},
                         "annotations": {k: v for k, v in annotations.items() if v is not None}}}
    patch = {"metadata": {"labels": patch_labels, "annotations": patch_annotations}}
    assert strategic_merge_patch(live, patch, POD) == json_merge_patch(live, patch)
