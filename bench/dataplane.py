"""Data plane benchmark: JobSet create -> all pods Running, and the torch example end to end.

Starts ``trainyard devcluster up`` (with its embedded data plane) on a free port in a temp
dir, installs the JobSet CRD, then prints:
  * JobSet (2 replicated Jobs x 1 plain pod) create -> both pods Running: p50 / p99 over N runs
  * examples/torch-ddp-cpu (2 nodes x 2 processes) JobSet create -> Completed
Usage: .venv/bin/python bench/dataplane.py [--runs 30] [--skip-torch]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from waiting import wait_until

REPO = Path(__file__).resolve().parents[1]


def start_devcluster(data_dir: Path) -> tuple[subprocess.Popen, Path]:
    process = subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "devcluster", "up", "--port", "0",
         "--data-dir", str(data_dir), "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and '"ready"' in line:
            return process, Path(json.loads(line)["kubeconfig"])
    raise SystemExit("devcluster did not start")


def stop(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


async def bench(kubeconfig: Path, data_dir: Path, runs: int, torch: bool) -> None:
    from trainyard.kube.client import KubeClient
    from trainyard.kube.resources import CONFIGMAP, JOBSET, Resource
    from trainyard_services.devcluster.dataplane.informers import POD, Informer

    crd = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
    client = await KubeClient.from_kubeconfig(str(kubeconfig))
    stop_watch = asyncio.Event()
    pods = Informer(client, POD)
    changed = asyncio.Event()
    pods.listeners.append(lambda _e, _o: changed.set())
    watcher = asyncio.create_task(pods.run(stop_watch))
    try:
        await client.create(crd, None, yaml.safe_load((REPO / "deploy/crds/jobset.x-k8s.io_jobsets.yaml").read_text()))
        await wait_until("the pod list of the API server", pods.synced.is_set, 60)
        await asyncio.sleep(1.0)  # let the data plane notice the new CRD

        def running(name: str, count: int) -> bool:
            return len([p for p in pods.items("default") if p["metadata"]["name"].startswith(name + "-")
                        and (p.get("status") or {}).get("phase") == "Running"]) >= count

        latencies = []
        for run in range(runs):
            name = f"bench-{run}"
            jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                      "metadata": {"name": name, "namespace": "default"},
                      "spec": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": {"spec": {
                          "parallelism": 1, "completions": 1, "template": {"spec": {
                              "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                              "containers": [{"name": "c", "image": "x", "command": ["sleep", "60"]}]}}}}}]}}
            started = time.perf_counter()
            await client.create(JOBSET, "default", jobset)
            await wait_until(f"the 2 pods of JobSet {name} to run", lambda: running(name, 2), 60, wake=changed)
            latencies.append(time.perf_counter() - started)
            await client.request("DELETE", JOBSET.path("default", name), body={"propagationPolicy": "Background"})
        print(f"JobSet create -> 2 plain pods Running ({runs} runs): "
              f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, p99 {percentile(latencies, 0.99) * 1000:.0f} ms, "
              f"mean {statistics.mean(latencies) * 1000:.0f} ms", flush=True)

        if torch:
            example = REPO / "examples" / "torch-ddp-cpu"
            await client.create(CONFIGMAP, "default", {"apiVersion": "v1", "kind": "ConfigMap",
                                                       "metadata": {"name": "torch-ddp-cpu-script"},
                                                       "data": {"train.py": (example / "train.py").read_text()}})
            doc = yaml.safe_load((example / "jobset.yaml").read_text())
            started = time.perf_counter()
            await client.create(JOBSET, "default", doc)
            done: list[dict] = []

            async def finished() -> bool:
                js = await client.get(JOBSET, "default", doc["metadata"]["name"])
                done[:] = [c for c in ((js or {}).get("status") or {}).get("conditions") or []
                           if c["type"] in ("Completed", "Failed") and c["status"] == "True"]
                return bool(done)

            await wait_until("the torch-ddp-cpu JobSet to finish", finished, 600)
            print(f"torch-ddp-cpu (2 nodes x 2 procs, 30 steps) create -> {done[0]['type']}: "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
    finally:
        stop_watch.set()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="trainyard-bench-dataplane-") as tmp:
        process, kubeconfig = start_devcluster(Path(tmp) / "data")
        try:
            asyncio.run(bench(kubeconfig, Path(tmp) / "data", args.runs, not args.skip_torch))
        finally:
            stop(process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
