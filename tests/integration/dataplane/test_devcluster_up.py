"""`trainyard devcluster up` runs the data plane; stopping it stops every pod and removes what
the data plane made on the host (processes, network namespaces, the bridge)."""
from __future__ import annotations

import asyncio
import re
import subprocess

import yaml

from fixtures.dataplane import CRD_FILES, REPO, jobset_object, pids_of_pod, replicated_job, wait_until
from fixtures.devcluster import start_devcluster
from trainyard.kube.client import KubeClient
from trainyard.kube.resources import JOBSET, Resource

POD = Resource("", "v1", "pods", "Pod")
CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)


def test_stopping_devcluster_stops_pods_and_cleans_the_host(tmp_path):
    server = start_devcluster(tmp_path / "data", ["--dataplane"])
    try:
        uids = asyncio.run(_run_pods(server.kubeconfig))
        log = (tmp_path / "data-server.log").read_text()
        bridge = re.search(r"on bridge (tyb[0-9a-f]{5})", log).group(1)
        assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0
    finally:
        server.stop()
    assert not any(pids_of_pod(uid) for uid in uids)
    assert subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"ty{bridge[3:]}-" not in namespaces


async def _run_pods(kubeconfig) -> list[str]:
    kube = await KubeClient.from_kubeconfig(str(kubeconfig))
    try:
        await kube.create(CRD, None, yaml.safe_load((REPO / "deploy" / "crds" / CRD_FILES[0]).read_text()))
        await asyncio.sleep(0.5)
        created = None
        for _ in range(50):  # the CRD is served a moment after it is created
            try:
                created = await kube.create(JOBSET, "default", jobset_object("js", "default", [replicated_job(
                    "w", ["sh", "-c", "setsid sleep 300 & sleep 300"], parallelism=2, completions=2)]))
                break
            except Exception:
                await asyncio.sleep(0.2)
        assert created is not None

        async def running():
            pods, _ = await kube.list(POD, "default")
            up = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            return up if len(up) == 2 else None
        pods = await wait_until(running, what="pods running")
        uids = [p["metadata"]["uid"] for p in pods]
        await wait_until(lambda: all(len(pids_of_pod(uid)) >= 2 for uid in uids), what="processes")
        return uids
    finally:
        await kube.close()


def test_a_restarted_devcluster_keeps_its_node_address(tmp_path):
    """The pod bridge of a data dir is made on the same /24 again: the Node's address, which
    `trainyard up` told the status service to bind, exists again after a restart."""
    import json

    addresses = []
    for _ in range(2):
        server = start_devcluster(tmp_path / "data", ["--dataplane"])
        try:
            asyncio.run(wait_until(lambda: (tmp_path / "data" / "dataplane-ready").is_file(),
                                   what="dataplane-ready"))
            addresses.append(json.loads((tmp_path / "data" / "dataplane-ready").read_text())["host_ip"])
            node = json.loads(server.kubectl("get", "node", "devcluster", "-o", "json").stdout)
            assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": addresses[-1]}
        finally:
            server.stop()
        assert not (tmp_path / "data" / "dataplane-ready").exists()
    assert addresses[0] == addresses[1]

