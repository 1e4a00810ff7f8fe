"""The plain-python and coscheduling examples run to completion on a devcluster."""
from __future__ import annotations

from pathlib import Path

import yaml

from fixtures.dataplane import wait_until
from trainyard.kube.resources import COSCHEDULING_PODGROUP, JOBSET, Resource

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
POD = Resource("", "v1", "pods", "Pod")


async def _apply(kube, path: Path, namespace: str) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    await kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        resource = JOBSET if doc["kind"] == "JobSet" else COSCHEDULING_PODGROUP
        await kube.create(resource, namespace, doc)
    return docs


async def _completed(kube, namespace, name):
    js = await kube.get(JOBSET, namespace, name)
    return any(c["type"] == "Completed" and c["status"] == "True"
               for c in ((js or {}).get("status") or {}).get("conditions") or [])


def _logs(cluster, namespace, pods, container):
    return {p["metadata"]["name"]: (cluster.data_dir / "pods" / namespace / p["metadata"]["name"] /
                                    f"{container}.log").read_text() for p in pods}


async def test_plain_python_and_coscheduling_examples(dataplane_cluster):
    kube = await dataplane_cluster.client()
    try:
        await _apply(kube, EXAMPLES / "plain-python" / "jobset.yaml", "ex-plain")
        await _apply(kube, EXAMPLES / "coscheduling" / "planned.yaml", "ex-gang")
        await wait_until(lambda: _completed(kube, "ex-plain", "plain-python"), timeout=60, what="plain-python")
        await wait_until(lambda: _completed(kube, "ex-gang", "gang-hello"), timeout=60, what="gang-hello")

        pods, _ = await kube.list(POD, "ex-plain")
        logs = _logs(dataplane_cluster, "ex-plain", pods, "worker")
        by_host = {p["spec"]["hostname"]: p for p in pods}
        first, second = by_host["plain-python-worker-0-0"], by_host["plain-python-worker-0-1"]
        assert f"hello from plain-python-worker-0-1 at {second['status']['podIP']}" in logs[first["metadata"]["name"]]
        assert (f"said hello to plain-python-worker-0-0.plain-python ({first['status']['podIP']})"
                in logs[second["metadata"]["name"]])

        pods, _ = await kube.list(POD, "ex-gang")
        assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods} == {"gang-hello"}
        lines = sorted(_logs(dataplane_cluster, "ex-gang", pods, "node").values())
        assert lines[0].startswith("node rank 0 of 2 on gang-hello-node-0-0, master gang-hello-node-0-0.gang-hello:29500")
        assert lines[1].startswith("node rank 1 of 2 on gang-hello-node-0-1")
    finally:
        await kube.close()
