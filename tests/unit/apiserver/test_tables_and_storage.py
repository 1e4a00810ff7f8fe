"""Pure parts of the devcluster: printer-column JSONPath, ages, events conversion, storage."""
from __future__ import annotations

import asyncio

import pytest

from trainyard_services.devcluster.apiserver.registry.events import core_to_events_v1, events_v1_to_core
from trainyard_services.devcluster.storage.store import DataDirError, Expired, StaleWrite, Store
from trainyard_services.devcluster.apiserver.endpoints.tables import humanise_age, jsonpath


def test_jsonpath_subset_used_by_printer_columns():
    obj = {"status": {"conditions": [{"type": "Created", "status": "True"}, {"type": "Complete", "status": "False"}]}}
    assert jsonpath(obj, ".status.conditions[-1:].type") == ["Complete"]
    assert jsonpath(obj, '.status.conditions[?(@.type=="Complete")].status') == ["False"]
    assert jsonpath(obj, ".status.conditions[0].type") == ["Created"]
    assert jsonpath(obj, ".status.conditions[*].type") == ["Created", "Complete"]
    assert jsonpath(obj, ".spec.missing") == []


def test_ages_are_humanised_like_kubectl():
    assert humanise_age("2000-01-01T00:00:00Z").endswith("y")
    assert humanise_age("not a time") is None


def test_events_conversion_round_trips():
    core = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
            "message": "m", "reason": "R", "type": "Normal", "firstTimestamp": "2026-01-01T00:00:00Z", "count": 2,
            "source": {"component": "c"}, "reportingComponent": "rc"}
    newer = core_to_events_v1(core)
    assert newer["regarding"] == {"kind": "Pod", "name": "p"} and newer["note"] == "m" and newer["deprecatedCount"] == 2
    assert events_v1_to_core(newer) == core


def test_store_keeps_objects_and_resource_version_across_reopen(tmp_path):
    async def write() -> int:
        store = Store(tmp_path)
        store.start(asyncio.get_running_loop())
        store.put(("", "configmaps"), "default", "a", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
        store.put(("", "configmaps"), "default", "b", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}})
        stored = store.get(("", "configmaps"), "default", "a")
        store.delete(("", "configmaps"), "default", "a", stored.load())
        await store.durable(store.rv)
        await store.close()
        return store.rv
    rv = asyncio.run(write())
    reopened = Store(tmp_path)
    assert reopened.rv == rv == 3
    assert [name for (_, name), _ in reopened.list(("", "configmaps"))] == ["b"]


def test_puts_and_deletes_commit_only_at_the_resource_version_they_were_computed_from(tmp_path):
    """The store holds each object's write order: a write computed from resourceVersion N
    commits only while the object is at N (0: absent), whoever the writer is."""
    store = Store(tmp_path)
    key = ("", "configmaps")
    first = store.put(key, "default", "a", {"metadata": {"name": "a"}}, expect_rv=0)
    with pytest.raises(StaleWrite) as made:
        store.put(key, "default", "a", {"metadata": {"name": "a"}}, expect_rv=0)
    assert made.value.current == first
    second = store.put(key, "default", "a", {"metadata": {"name": "a", "labels": {"x": "1"}}}, expect_rv=first.rv)
    with pytest.raises(StaleWrite):
        store.put(key, "default", "a", {"metadata": {"name": "a"}}, expect_rv=first.rv)
    with pytest.raises(StaleWrite):
        store.delete(key, "default", "a", {"metadata": {"name": "a"}}, expect_rv=first.rv)
    assert store.get(key, "default", "a") == second
    store.delete(key, "default", "a", second.load(), expect_rv=second.rv)
    with pytest.raises(StaleWrite) as gone:
        store.delete(key, "default", "a", second.load(), expect_rv=second.rv)
    assert gone.value.current is None
    assert [c.type for c in store.changes_since(0)] == ["ADDED", "MODIFIED", "DELETED"]


def test_watch_history_is_bounded_and_older_versions_expire(tmp_path):
    store = Store(tmp_path, history_size=3)
    for i in range(10):
        store.put(("", "configmaps"), "default", f"c{i}", {"metadata": {"name": f"c{i}"}})
    assert [c.rv for c in store.changes_since(store.rv - 2)] == [store.rv - 1, store.rv]
    with pytest.raises(Expired) as caught:
        store.changes_since(1)
    assert str(caught.value).startswith("too old resource version: 1 (")


def test_a_foreign_sqlite_database_is_refused(tmp_path):
    import sqlite3
    conn = sqlite3.connect(tmp_path / "devcluster.db")
    conn.execute("CREATE TABLE other (x)")
    conn.commit()
    conn.close()
    with pytest.raises(DataDirError, match="not a trainyard devcluster store"):
        Store(tmp_path)


def test_a_second_server_on_the_same_data_dir_is_refused(tmp_path):
    first = Store(tmp_path)
    with pytest.raises(DataDirError, match="in use by another devcluster"):
        Store(tmp_path)
    asyncio.run(first.close())
    Store(tmp_path)  # free again once the first one closed


def test_printer_column_paths_with_escaped_dots_read_label_and_annotation_keys():
    from trainyard_services.devcluster.apiserver.endpoints.tables import jsonpath

    obj = {"metadata": {"labels": {"trainer.kubeflow.org/framework": "torch"},
                        "annotations": {"trainyard.kubeflow.org/worker-cluster": "worker-2"}}}
    assert jsonpath(obj, r".metadata.labels.trainer\.kubeflow\.org/framework") == ["torch"]
    assert jsonpath(obj, r".metadata.annotations.trainyard\.kubeflow\.org/worker-cluster") == ["worker-2"]
    assert jsonpath(obj, r".metadata.annotations.trainyard\.kubeflow\.org/other") == []


def test_the_default_number_of_api_workers_follows_the_cores():
    """One process up to 4 cores (measured fastest on 2: docs/performance.md), else half the
    cores, at most 8 (`devcluster up --api-workers 0`, the default)."""
    from trainyard_services.devcluster.process.supervisor import default_api_workers

    assert [default_api_workers(cores) for cores in (1, 2, 4, 6, 8, 16, 64)] == [1, 1, 1, 3, 4, 8, 8]
