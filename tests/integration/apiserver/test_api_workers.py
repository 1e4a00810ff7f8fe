"""A devcluster of 4 API workers over one store process (``devcluster up --api-workers 4``).

Every request here goes on a new HTTPS connection, so the kernel (SO_REUSEPORT) spreads them
over the workers: writes commit through different processes, and reads and watches are
served from different workers' replicas of the store.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
from pathlib import Path

import httpx
import pytest

from fixtures.devcluster import Devcluster, start_devcluster

CM = "/api/v1/namespaces/default/configmaps"
MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Devcluster:
    devcluster = start_devcluster(tmp_path_factory.mktemp("workers") / "data", ["--api-workers", "4"])
    try:
        yield devcluster
    finally:
        devcluster.stop()


def _pids(cluster: Devcluster) -> list[int]:
    return [int(line) for line in (cluster.data_dir / "api-workers").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is gone as a server
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process, from /proc (as prometheus_client reads it)."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fresh:
    """Each request on its own connection (a new client): any worker may take it."""

    def __init__(self, cluster: Devcluster) -> None:
        self.cluster = cluster
        self.ctx = ssl.create_default_context(cafile=str(cluster.ca_cert))

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.cluster.url, verify=self.ctx, timeout=30,
                                 headers={"Authorization": f"Bearer {self.cluster.token}"})

    async def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        async with self.client() as c:
            return await c.request(method, path, **kwargs)


def test_the_workers_are_separate_processes_on_one_port(cluster):
    pids = _pids(cluster)
    assert len(set(pids)) == 4 and cluster.pid not in pids
    assert all(_alive(pid) for pid in pids)


async def test_a_write_is_read_at_once_through_any_worker(cluster):
    """Read-your-writes: a GET or LIST right after a create, on another connection (another
    worker, most of the time), sees the object."""
    fresh = Fresh(cluster)
    for index in range(20):
        name = f"ryw-{index}"
        created = await fresh.request("POST", CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                        "metadata": {"name": name}, "data": {"i": str(index)}})
        assert created.status_code == 201, created.text
        got = await fresh.request("GET", f"{CM}/{name}")
        assert got.status_code == 200, got.text
        assert got.json()["metadata"]["resourceVersion"] == created.json()["metadata"]["resourceVersion"]
    listed = await fresh.request("GET", CM)
    assert {f"ryw-{i}" for i in range(20)} <= {item["metadata"]["name"] for item in listed.json()["items"]}


async def test_conditional_writes_through_different_workers_store_exactly_one(cluster):
    fresh = Fresh(cluster)
    created = await fresh.request("POST", CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                    "metadata": {"name": "contended"}})
    base = created.json()

    async def claim(who: str) -> httpx.Response:
        body = dict(base, data={"owner": who})
        return await fresh.request("PUT", f"{CM}/contended", json=body)

    answers = await asyncio.gather(*(claim(f"writer-{i}") for i in range(8)))
    assert sorted(a.status_code for a in answers) == [200] + [409] * 7, [a.text for a in answers]
    winner = next(a for a in answers if a.status_code == 200).json()
    stored = (await fresh.request("GET", f"{CM}/contended")).json()
    assert stored["data"] == winner["data"]
    assert stored["metadata"]["resourceVersion"] == winner["metadata"]["resourceVersion"]


async def test_applies_and_patches_through_different_workers_all_land(cluster):
    """Without a precondition, a write that loses its commit in the store process is computed
    again on the new object (GuaranteedUpdate), whichever worker made it."""
    fresh = Fresh(cluster)
    assert (await fresh.request("POST", CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"name": "merged"}})).status_code == 201

    async def apply(index: int) -> httpx.Response:
        config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "merged"},
                  "data": {f"applied-{index}": "a"}}
        return await fresh.request("PATCH", f"{CM}/merged", params={"fieldManager": f"applier-{index}"},
                                   content=json.dumps(config), headers={"Content-Type": "application/apply-patch+yaml"})

    async def merge(index: int) -> httpx.Response:
        return await fresh.request("PATCH", f"{CM}/merged", content=json.dumps({"data": {f"merged-{index}": "m"}}),
                                   headers=MERGE)

    answers = await asyncio.gather(*(apply(i) for i in range(6)), *(merge(i) for i in range(6)))
    assert [a.status_code for a in answers] == [200] * 12, [a.text for a in answers if a.status_code != 200]
    data = (await fresh.request("GET", f"{CM}/merged")).json()["data"]
    assert set(data) == {f"applied-{i}" for i in range(6)} | {f"merged-{i}" for i in range(6)}


async def test_a_watch_sees_writes_made_through_the_other_workers_in_order(cluster):
    fresh = Fresh(cluster)
    start = (await fresh.request("GET", CM)).json()["metadata"]["resourceVersion"]
    events: list[dict] = []
    async with fresh.client() as watcher:
        async with watcher.stream("GET", CM, params={"watch": "1", "resourceVersion": start,
                                                     "labelSelector": "watched=yes"}) as stream:
            async def write_all() -> list[str]:
                rvs = []
                for index in range(15):
                    created = await fresh.request("POST", CM, json={
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": f"watched-{index}", "labels": {"watched": "yes"}}})
                    assert created.status_code == 201, created.text
                    rvs.append(created.json()["metadata"]["resourceVersion"])
                return rvs

            writer = asyncio.ensure_future(write_all())
            async for line in stream.aiter_lines():
                if line.strip():
                    events.append(json.loads(line))
                if len(events) == 15:
                    break
            rvs = await writer
    assert [e["type"] for e in events] == ["ADDED"] * 15
    assert [e["object"]["metadata"]["name"] for e in events] == [f"watched-{i}" for i in range(15)]
    assert [e["object"]["metadata"]["resourceVersion"] for e in events] == rvs
    assert [int(rv) for rv in rvs] == sorted(int(rv) for rv in rvs)


async def test_services_created_through_different_workers_get_different_cluster_ips(cluster):
    fresh = Fresh(cluster)

    async def create(index: int) -> httpx.Response:
        return await fresh.request("POST", "/api/v1/namespaces/default/services", json={
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": f"svc-{index}"},
            "spec": {"ports": [{"port": 80}]}})

    answers = await asyncio.gather(*(create(i) for i in range(12)))
    assert [a.status_code for a in answers] == [201] * 12
    ips = [a.json()["spec"]["clusterIP"] for a in answers]
    assert len(set(ips)) == 12, ips


def test_kubectl_sees_a_crd_installed_through_one_worker_in_every_worker(cluster):
    """The CRD registry of every worker follows the store's stream: each kubectl call (a new
    connection) serves the new kind at once."""
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "gadgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "properties": {"spec": {"type": "object", "properties": {
                            "size": {"type": "integer", "minimum": 1}}}}}}}]}}
    cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(crd))
    for index in range(8):
        gadget = {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": f"g{index}"},
                  "spec": {"size": index + 1}}
        cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(gadget))
    names = cluster.kubectl("get", "gadgets", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert names == [f"g{i}" for i in range(8)]
    bad = cluster.kubectl("apply", "--server-side", "-f", "-", check=False, input=json.dumps(
        {"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "bad"}, "spec": {"size": 0}}))
    assert bad.returncode != 0 and "should be greater than or equal to 1" in bad.stderr
    cluster.kubectl("delete", "crd", "gadgets.example.com")
    gone = cluster.kubectl("get", "gadgets", check=False)
    # (kubectl's discovery cache may still know the kind: then the server's 404 on its path)
    assert gone.returncode != 0
    assert "the server doesn't have a resource type" in gone.stderr or "NotFound" in gone.stderr


async def test_metrics_answer_for_every_worker_in_every_scrape(cluster):
    """The port hands a scrape to any one worker, and each answers for the whole server: the
    requests the other workers served are counted too, the same in every scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    fresh = Fresh(cluster)
    labels = {"verb": "GET", "group": "", "resource": "secrets", "subresource": "", "code": "404"}

    async def scrape() -> dict[str, list]:
        answer = await fresh.request("GET", "/metrics")
        assert answer.status_code == 200, answer.text
        return {family.name: family.samples for family in text_string_to_metric_families(answer.text)}

    def not_found_gets(families: dict[str, list]) -> float:
        return sum(s.value for s in families.get("apiserver_request", [])
                   if s.name == "apiserver_request_total" and s.labels == labels)

    def latencies_counted(families: dict[str, list]) -> float:
        return sum(s.value for s in families.get("apiserver_request_duration_seconds", [])
                   if s.name.endswith("_count") and s.labels == {k: labels[k] for k in labels if k != "code"})

    before = await scrape()
    for index in range(24):  # each on a new connection: spread over the four workers
        assert (await fresh.request("GET", f"/api/v1/namespaces/default/secrets/absent-{index}")).status_code == 404
    for _ in range(4):  # each scrape on a new connection too: any worker answers
        after = await scrape()
        assert not_found_gets(after) - not_found_gets(before) == 24
        assert latencies_counted(after) - latencies_counted(before) == 24
        # Figures of the server as a whole appear once, not once per worker.
        assert [s.name for s in after["process_start_time_seconds"]] == ["process_start_time_seconds"]
        secrets = [s for s in after["apiserver_storage_objects"] if s.labels == {"resource": "secrets"}]
        assert len(secrets) <= 1

    # The server's CPU time is its processes' together: at least what each had used before.
    used = sum(_cpu_seconds(pid) for pid in [cluster.pid, *_pids(cluster)])
    [cpu] = (await scrape())["process_cpu_seconds"]
    assert cpu.value >= used - 0.05, (cpu.value, used)  # a tick of rounding per process


def test_stopping_the_devcluster_stops_every_worker(cluster):
    """Last in this module: the store process stops its workers before it exits."""
    pids = _pids(cluster)
    cluster.stop()
    assert cluster.process.returncode == 0
    assert [pid for pid in pids if _alive(pid)] == []


def test_workers_exit_when_the_store_process_is_killed(tmp_path):
    """No orphans even when the store process cannot stop them: each worker's stream ends."""
    devcluster = start_devcluster(tmp_path / "data", ["--api-workers", "2"])
    pids: list[int] = []
    try:
        pids = _pids(devcluster)
        os.kill(devcluster.pid, signal.SIGKILL)
        devcluster.process.wait(timeout=10)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in pids if _alive(pid)] == []
    finally:
        devcluster.stop()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_that_dies_stops_the_devcluster_and_the_other_workers(tmp_path):
    """Nothing serves half the port silently: the store process stops the rest and exits 1."""
    devcluster = start_devcluster(tmp_path / "data", ["--api-workers", "2"])
    pids: list[int] = []
    try:
        pids = _pids(devcluster)
        os.kill(pids[0], signal.SIGKILL)
        assert devcluster.process.wait(timeout=60) == 1
        assert [pid for pid in pids if _alive(pid)] == []
        log = (tmp_path / "data-server.log").read_text()
        assert f"API worker {pids[0]} exited with -9" in log
    finally:
        devcluster.stop()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
