"""Elastic resize benchmark: how long the data plane takes to follow a JobSet resize.

Starts ``trainyard devcluster up --jobset-feature-gates ElasticJobSet=true`` (embedded data
plane) on a free port in a temp dir, installs the JobSet CRD, creates one JobSet whose Indexed
replicated Job runs 2 ``sleep`` pods, then ``--runs`` times:
  * scale up 2 -> 3 (JSON patch of parallelism+completions): until the index-2 pod is Running;
  * scale down 3 -> 2: until the index-2 pod is gone from the API.
Prints p50 / p99 / mean of each and checks that the index-0 and index-1 pods kept their UIDs.
Usage: .venv/bin/python bench/elastic_resize.py [--runs 20]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from fixtures.devcluster import start_devcluster  # noqa: E402
from waiting import wait_until  # noqa: E402
INDEX = "batch.kubernetes.io/job-completion-index"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def resize(size: int) -> list[dict]:
    base = "/spec/replicatedJobs/0/template/spec"
    return [{"op": "replace", "path": f"{base}/parallelism", "value": size},
            {"op": "replace", "path": f"{base}/completions", "value": size}]


async def bench(kubeconfig: Path, runs: int) -> None:
    from trainyard.kube.client import KubeClient
    from trainyard.kube.resources import JOBSET, Resource
    from trainyard_services.devcluster.dataplane.informers import POD, Informer

    crd = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
    hooks = Resource("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                     "ValidatingWebhookConfiguration", False)
    client = await KubeClient.from_kubeconfig(str(kubeconfig))
    stop_watch = asyncio.Event()
    pods = Informer(client, POD)
    changed = asyncio.Event()
    pods.listeners.append(lambda _e, _o: changed.set())
    watcher = asyncio.create_task(pods.run(stop_watch))
    try:
        await client.create(crd, None, yaml.safe_load((REPO / "deploy/crds/jobset.x-k8s.io_jobsets.yaml").read_text()))
        await wait_until("the pod list of the API server", pods.synced.is_set, 60)

        async def webhook_registered() -> bool:
            return await client.get(hooks, None, "trainyard-dataplane-jobset") is not None

        await wait_until("the data plane's JobSet webhook to be registered", webhook_registered, 60)
        await asyncio.sleep(1.0)  # let the data plane notice the new CRD

        def by_index() -> dict[int, dict]:
            return {int(p["metadata"]["labels"][INDEX]): p for p in pods.items("default")
                    if p["metadata"]["name"].startswith("elastic-")}

        def running(index: int) -> bool:
            pod = by_index().get(index)
            return bool(pod and (pod.get("status") or {}).get("phase") == "Running"
                        and not pod["metadata"].get("deletionTimestamp"))

        jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                  "metadata": {"name": "elastic", "namespace": "default"},
                  "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
                      "parallelism": 2, "completions": 2, "completionMode": "Indexed", "template": {"spec": {
                          "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                          "containers": [{"name": "c", "image": "x", "command": ["sleep", "600"]}]}}}}}]}}
        await client.create(JOBSET, "default", jobset)
        await wait_until("pods 0 and 1 of the JobSet to run", lambda: running(0) and running(1), 60, wake=changed)
        survivors = {i: by_index()[i]["metadata"]["uid"] for i in (0, 1)}
        ups, downs = [], []
        for _ in range(runs):
            started = time.perf_counter()
            await client.request("PATCH", JOBSET.path("default", "elastic"), body=resize(3),
                                 content_type="application/json-patch+json")
            await wait_until("pod 2 to run after the resize to 3", lambda: running(2), 60, wake=changed)
            ups.append(time.perf_counter() - started)
            started = time.perf_counter()
            await client.request("PATCH", JOBSET.path("default", "elastic"), body=resize(2),
                                 content_type="application/json-patch+json")
            await wait_until("pod 2 to go after the resize to 2", lambda: 2 not in by_index(), 60, wake=changed)
            downs.append(time.perf_counter() - started)
        kept = {i: by_index()[i]["metadata"]["uid"] for i in (0, 1)} == survivors
        for label, values in (("scale up 2 -> 3 (patch -> index-2 pod Running)", ups),
                              ("scale down 3 -> 2 (patch -> index-2 pod gone)", downs)):
            print(f"{label}, {runs} runs: p50 {percentile(values, 0.5) * 1000:.0f} ms, "
                  f"p99 {percentile(values, 0.99) * 1000:.0f} ms, mean {statistics.mean(values) * 1000:.0f} ms",
                  flush=True)
        print(f"index-0 and index-1 pods kept their UIDs through all resizes: {kept}", flush=True)
    finally:
        stop_watch.set()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-elastic-") as tmp:
        cluster = start_devcluster(Path(tmp) / "data", ["--dataplane", "--log-level", "WARNING",
                                                        "--jobset-feature-gates", "ElasticJobSet=true"])
        try:
            asyncio.run(bench(cluster.kubeconfig, args.runs))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
