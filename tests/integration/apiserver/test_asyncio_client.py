"""kubernetes-asyncio against a real devcluster: watch resume, 410, SSA, status, concurrent writers."""
from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.rest import ApiException

from fixtures.devcluster import api_workers_args, start_devcluster
from integration.apiserver._manifests import install_trainer_crds

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
HISTORY = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, api_workers):
    # a small watch history so that the 410 Expired path is reachable with a few writes
    cluster = start_devcluster(tmp_path_factory.mktemp("asyncio") / "data", ["--watch-history", str(HISTORY),
                                                                              *api_workers_args(api_workers)])
    try:
        install_trainer_crds(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
async def api(cluster):
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    async with client.ApiClient(cfg) as api_client:
        yield api_client


def job(name: str, nodes: int = 1, **labels: str) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob",
            "metadata": {"name": name, "labels": labels or {"team": "a"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": nodes}}}


async def test_list_then_watch_resumes_from_the_list_resource_version(api):
    crs = client.CustomObjectsApi(api)
    await crs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("resume-a"))
    listed = await crs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, label_selector="team=resume")
    rv = listed["metadata"]["resourceVersion"]
    await crs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("resume-b", team="resume"))
    await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "resume-b",
                                             {"spec": {"trainer": {"numNodes": 2}}}, _content_type=MERGE)
    await crs.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "resume-b")
    seen = []
    w = watch.Watch()
    async with asyncio.timeout(10):
        async for event in w.stream(crs.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                                    label_selector="team=resume", resource_version=rv, allow_watch_bookmarks=True,
                                    timeout_seconds=2):
            if event["type"] == "BOOKMARK":
                continue
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == 3:
                w.stop()
    assert seen == [("ADDED", "resume-b"), ("MODIFIED", "resume-b"), ("DELETED", "resume-b")]


async def test_watch_from_a_compacted_resource_version_raises_410(api):
    crs = client.CustomObjectsApi(api)
    listed = await crs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    old_rv = int(listed["metadata"]["resourceVersion"])
    await crs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("churn"))
    for i in range(HISTORY * 2 + 5):
        await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "churn",
                                                 {"metadata": {"labels": {"i": str(i)}}}, _content_type=MERGE)
    w = watch.Watch()
    with pytest.raises(ApiException) as caught:
        async with asyncio.timeout(10):
            async for _ in w.stream(crs.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                                    resource_version=str(old_rv), timeout_seconds=2):
                pass
    assert caught.value.status == 410
    # relist + watch from the new list resourceVersion works again
    relisted = await crs.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    assert int(relisted["metadata"]["resourceVersion"]) > old_rv


async def test_server_side_apply_managers_conflicts_force_and_removal(api):
    crs = client.CustomObjectsApi(api)
    body = job("ssa", 2)
    # A field the CRD lets change (v2.3.0 makes spec.trainer's other fields immutable).
    body["spec"]["labels"] = {"team": "a"}
    await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", body,
                                             field_manager="applier-a", _content_type=APPLY)
    created = await crs.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa")
    managers = {e["manager"]: e for e in created["metadata"]["managedFields"]}
    assert managers["applier-a"]["operation"] == "Apply"
    assert "f:numNodes" in json.dumps(managers["applier-a"]["fieldsV1"])
    # identical re-apply: no write, same resourceVersion
    again = await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", body,
                                                     field_manager="applier-a", _content_type=APPLY)
    assert again["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    # another manager changing an owned field conflicts
    other = job("ssa", 5)
    with pytest.raises(ApiException) as caught:
        await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", other,
                                                 field_manager="applier-b", _content_type=APPLY)
    assert caught.value.status == 409
    status = json.loads(caught.value.body)
    assert status["reason"] == "Conflict"
    assert status["message"].startswith("Apply failed with")
    assert {"reason": "FieldManagerConflict", "field": ".spec.trainer.numNodes"}.items() <= status["details"]["causes"][0].items()
    forced = await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", other,
                                                      field_manager="applier-b", force=True, _content_type=APPLY)
    assert forced["spec"]["trainer"]["numNodes"] == 5
    # applier-a's unchanged configuration is not a no-op any more: the object moved on
    with pytest.raises(ApiException) as caught:
        await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", body,
                                                 field_manager="applier-a", _content_type=APPLY)
    assert caught.value.status == 409
    # applier-a drops the labels: they are removed (nobody else owns them)
    body["spec"].pop("labels")
    body["spec"]["trainer"]["numNodes"] = 5
    dropped = await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "ssa", body,
                                                       field_manager="applier-a", _content_type=APPLY)
    assert "labels" not in dropped["spec"]


async def test_dict_body_without_content_type_is_rejected_not_merged(api):
    crs = client.CustomObjectsApi(api)
    await crs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("jsonpatch-dict"))
    with pytest.raises(ApiException) as caught:
        await crs.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "jsonpatch-dict",
                                                 {"spec": {"suspend": True}})
    assert 400 <= caught.value.status < 500


async def test_status_subresource_apply_and_generation(api):
    crs = client.CustomObjectsApi(api)
    await crs.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, job("stat"))
    status = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainJob", "metadata": {"name": "stat"},
              "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": "",
                                         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    updated = await crs.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "stat", status,
                                                              field_manager="trainyard-status", force=True,
                                                              _content_type=APPLY)
    assert updated["status"]["conditions"][0]["type"] == "Complete"
    assert updated["metadata"]["generation"] == 1
    entry = next(e for e in updated["metadata"]["managedFields"] if e["manager"] == "trainyard-status")
    assert entry["subresource"] == "status"
    got = await crs.get_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "stat")
    assert got["spec"]["trainer"]["numNodes"] == 1  # the whole object


async def test_concurrent_writers_lose_no_update(api):
    crs = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    await core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="counter"),
                                                                         data={"n": "0"}))
    successes = 0

    async def bump() -> None:
        nonlocal successes
        for _ in range(50):
            current = await core.read_namespaced_config_map("counter", "default")
            current.data["n"] = str(int(current.data["n"]) + 1)
            try:
                await core.replace_namespaced_config_map("counter", "default", current)
            except ApiException as err:
                assert err.status == 409
                continue
            successes += 1
            if successes >= 40:
                return

    await asyncio.gather(*(bump() for _ in range(8)))
    final = await core.read_namespaced_config_map("counter", "default")
    assert int(final.data["n"]) == successes
    del crs


async def test_filtered_watch_sees_label_transitions_as_added_and_deleted(api):
    core = client.CoreV1Api(api)
    listed = await core.list_namespaced_config_map("default", label_selector="phase=on")
    rv = listed.metadata.resource_version
    await core.create_namespaced_config_map("default", {"metadata": {"name": "flip", "labels": {"phase": "off"}}})
    await core.patch_namespaced_config_map("flip", "default", {"metadata": {"labels": {"phase": "on"}}},
                                           _content_type=MERGE)
    await core.patch_namespaced_config_map("flip", "default", {"data": {"a": "1"}}, _content_type=MERGE)
    await core.patch_namespaced_config_map("flip", "default", {"metadata": {"labels": {"phase": "off"}}},
                                           _content_type=MERGE)
    seen = []
    w = watch.Watch()
    async with asyncio.timeout(10):
        async for event in w.stream(core.list_namespaced_config_map, "default", label_selector="phase=on",
                                    resource_version=rv, timeout_seconds=2):
            seen.append((event["type"], event["object"].metadata.labels["phase"]))
            if len(seen) == 3:
                w.stop()
    assert seen == [("ADDED", "on"), ("MODIFIED", "on"), ("DELETED", "off")]


async def test_foreground_deletion_waits_for_a_dependent_held_by_a_finalizer(api):
    core = client.CoreV1Api(api)
    owner = await core.create_namespaced_config_map("default", {"metadata": {"name": "fg-owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "fg-owner", "uid": owner.metadata.uid}
    await core.create_namespaced_config_map("default", {"metadata": {"name": "fg-dep", "ownerReferences": [ref],
                                                                     "finalizers": ["example.com/hold"]}})
    await core.delete_namespaced_config_map("fg-owner", "default", propagation_policy="Foreground")
    held = await core.read_namespaced_config_map("fg-owner", "default")
    assert held.metadata.deletion_timestamp and "foregroundDeletion" in held.metadata.finalizers
    dep = await core.read_namespaced_config_map("fg-dep", "default")
    assert dep.metadata.deletion_timestamp
    await core.patch_namespaced_config_map("fg-dep", "default", {"metadata": {"finalizers": None}}, _content_type=MERGE)
    for name in ("fg-dep", "fg-owner"):
        with pytest.raises(ApiException) as caught:
            await core.read_namespaced_config_map(name, "default")
        assert caught.value.status == 404
