"""The kubelet runs a pod once: an older version of a finished pod, delivered late by the watch,
does not start its containers again.

Seen in a clean-clone run under load (tests/e2e/test_multicluster.py, 7 of 20 delegated
TrainJobs Complete with no pod left): the kubelet wrote a pod's final status (Succeeded) and let
its runner go; the watch then delivered the pod's earlier MODIFIED event (still Running), the
kubelet saw a pod bound here with no runner and started it again ("starting pod" a second and a
third time), and the Job controller, whose completed index already counted that pod, deleted the
pod it now saw running. Here the kubelet runs a real pod against a real devcluster, and the pod
as it was before it finished is handed to the kubelet the way the watch would, late.
"""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path

from fixtures.dataplane import wait_until
from trainyard.kube.client import KubeClient
from trainyard_services.devcluster.dataplane.informers import POD, SERVICE, Informer
from trainyard_services.devcluster.dataplane.kubelet import Kubelet
from trainyard_services.devcluster.dataplane.network import open_network
from trainyard_services.devcluster.dataplane.runner import RunnerConfig

NODE = "node-once"


async def test_a_late_event_of_a_finished_pod_does_not_run_it_again(devcluster, tmp_path: Path) -> None:
    client = await KubeClient.from_kubeconfig(str(devcluster.kubeconfig))
    network = await open_network(prefer_isolated=False)
    pods, services = Informer(client, POD), Informer(client, SERVICE)
    kubelet = Kubelet(client, RunnerConfig(data_dir=tmp_path, node_name=NODE), network, pods, services, gpus=0)
    stop = asyncio.Event()
    informers = [asyncio.create_task(pods.run(stop)), asyncio.create_task(services.run(stop))]
    try:
        await asyncio.wait_for(asyncio.gather(pods.synced.wait(), services.synced.wait()), 30)
        started = []
        start = kubelet._start  # noqa: SLF001 - counted, not replaced: the pod really runs

        def counting_start(pod):
            started.append(pod["metadata"]["uid"])
            start(pod)
        kubelet._start = counting_start  # noqa: SLF001
        created = await client.create(POD, "default", {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "once", "namespace": "default"},
            "spec": {"nodeName": NODE, "restartPolicy": "Never", "automountServiceAccountToken": False,
                     "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": "busybox", "command": ["sh", "-c", "echo ran"]}]}})
        uid = created["metadata"]["uid"]

        async def finished_and_let_go():
            pod = await client.get(POD, "default", "once")
            return (pod or {}).get("status", {}).get("phase") == "Succeeded" and uid not in kubelet.runners
        await wait_until(finished_and_let_go, timeout=60, what="the pod Succeeded and its runner gone")
        assert started == [uid]

        # The watch delivers the pod as it was while it ran (older resourceVersion, not terminal).
        late = copy.deepcopy(created)
        late["status"] = {"phase": "Running"}
        kubelet._on_pod("MODIFIED", late)  # noqa: SLF001 - what the informer's listener is called with
        await asyncio.sleep(0.5)
        assert started == [uid] and uid not in kubelet.runners
        pod = await client.get(POD, "default", "once")
        assert pod["status"]["phase"] == "Succeeded"
        assert [s["state"].get("terminated", {}).get("exitCode") for s in pod["status"]["containerStatuses"]] == [0]

        # Deleted and created again under the same name (a new uid): it runs.
        await client.delete(POD, "default", "once")
        await wait_until(lambda: pods.get("default", "once") is None, timeout=30, what="the pod's deletion seen")
        again = await client.create(POD, "default", {**created, "metadata": {"name": "once", "namespace": "default"},
                                                     "status": {}})
        await wait_until(lambda: again["metadata"]["uid"] in started, timeout=30, what="the new pod started")
    finally:
        stop.set()
        await kubelet.stop()
        for task in informers:
            task.cancel()
        await asyncio.gather(*informers, return_exceptions=True)
        await network.close()
        await client.close()
