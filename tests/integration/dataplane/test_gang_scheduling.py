"""Gang scheduling on a node with room for 3 of a 4-pod PodGroup: none start until all fit."""
from __future__ import annotations

import pytest

from fixtures.dataplane import pids_of_pod, wait_until
from trainyard.kube.resources import COSCHEDULING_PODGROUP, VOLCANO_PODGROUP, Resource

NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
POD = Resource("", "v1", "pods", "Pod")
NODE = Resource("", "v1", "nodes", "Node", False)


@pytest.fixture
async def small_node_cluster(dataplane_cluster):
    """The shared cluster with its Node's allocatable CPU set to 4 for the test (then restored)."""
    kube = await dataplane_cluster.client()
    node = await kube.get(NODE, None, "devcluster")
    original = node["status"]["allocatable"]
    async def set_cpu(allocatable):
        current = await kube.get(NODE, None, "devcluster")
        current["status"]["allocatable"] = allocatable
        await kube.request("PUT", NODE.path(None, "devcluster", "status"), body=current)
    await set_cpu({**original, "cpu": "4"})
    try:
        yield dataplane_cluster
    finally:
        await set_cpu(original)
        await kube.close()


def sleeper(name, namespace, *, cpu="1", labels=None, annotations=None, scheduler=None):
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "300"],
                            "resources": {"requests": {"cpu": cpu}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": spec}


async def phases(kube, ns, names):
    return {n: ((await kube.get(POD, ns, n)) or {}).get("status", {}).get("phase") for n in names}


@pytest.mark.parametrize("flavour", ["coscheduling", "volcano"])
async def test_gang_of_four_starts_only_when_all_fit(small_node_cluster, flavour):
    kube = await small_node_cluster.client()
    ns = f"gang-{flavour}"
    try:
        await kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        await kube.create(POD, ns, sleeper("blocker", ns))
        await wait_until(lambda: _phase_is(kube, ns, "blocker", "Running"), what="blocker running")
        if flavour == "coscheduling":
            group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                     "metadata": {"name": "pg", "namespace": ns}, "spec": {"minMember": 4}}
            await kube.create(COSCHEDULING_PODGROUP, ns, group)
            member = dict(labels={"scheduling.x-k8s.io/pod-group": "pg"})
        else:
            group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                     "metadata": {"name": "pg", "namespace": ns}, "spec": {"minMember": 4}}
            await kube.create(VOLCANO_PODGROUP, ns, group)
            member = dict(annotations={"scheduling.k8s.io/group-name": "pg"}, scheduler="volcano")
        names = [f"member-{i}" for i in range(4)]
        for name in names:
            await kube.create(POD, ns, sleeper(name, ns, **member))

        async def all_unschedulable():
            for name in names:
                pod = await kube.get(POD, ns, name)
                scheduled = next((c for c in (pod.get("status") or {}).get("conditions") or []
                                  if c["type"] == "PodScheduled"), None)
                if not scheduled or scheduled["status"] != "False" or scheduled["reason"] != "Unschedulable":
                    return None
            return pod
        waiting = await wait_until(all_unschedulable, what="gang held")
        message = next(c for c in waiting["status"]["conditions"] if c["type"] == "PodScheduled")["message"]
        assert "needs 4 pods scheduled together" in message
        assert set((await phases(kube, ns, names)).values()) == {"Pending"}
        for name in names:
            assert not (await kube.get(POD, ns, name))["spec"].get("nodeName")

        blocker = await kube.get(POD, ns, "blocker")
        await kube.request("DELETE", POD.path(ns, "blocker"), body={})
        await wait_until(lambda: not pids_of_pod(blocker["metadata"]["uid"]), what="blocker stopped")
        await wait_until(lambda: _all_running(kube, ns, names), timeout=60, what="gang running")
    finally:
        for name in ["blocker"] + [f"member-{i}" for i in range(4)]:
            try:
                await kube.request("DELETE", POD.path(ns, name), body={})
            except Exception:
                pass
        await kube.close()


async def _phase_is(kube, ns, name, phase):
    return ((await kube.get(POD, ns, name)) or {}).get("status", {}).get("phase") == phase


async def _all_running(kube, ns, names):
    return set((await phases(kube, ns, names)).values()) == {"Running"}
