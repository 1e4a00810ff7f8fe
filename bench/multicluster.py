"""Multi-cluster benchmark: delegated TrainJobs, manager create -> JobSet on a worker.

1. The single-cluster sustained rate of bench/e2e.py (nats-server, one devcluster, the four
   services; TrainJobs created as fast as the API server takes them until every JobSet exists).
   And the same on a plain `trainyard up` (one cluster, its data plane on, as each worker has).
2. `trainyard up --workers 2` (three devclusters, four services each, the dispatcher, one NATS):
   - paced at 10 delegated TrainJobs/s: latency from sending the create on the manager to the
     JobSet's ADDED event on whichever worker runs it (p50/p99);
   - sustained: delegated TrainJobs created as fast as the manager takes them, until every
     worker JobSet exists (TrainJobs/s), and the CPU ms each process spent per TrainJob;
   - the ratio delegated / single-cluster of the same run.
TrainJobs are created suspended in both parts, so JobSets are created and no pod runs: the
figures are the control planes', not the local data plane's.

Usage: .venv/bin/python bench/multicluster.py [--sustained 200] [--paced-seconds 5] [--concurrency 16]
Prints figures; asserts nothing (targets: delegated >= 0.4 x single-cluster on 2 cores,
p50 < 500 ms at 10/s; >= 30 delegated TrainJobs/s on a 16-core machine).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

import httpx  # noqa: E402

from e2e import (  # noqa: E402
    RUNTIME, SERVICES, JobSetWatch, as_fast_as_possible, cpu_seconds, percentile, start_service, wait_ready,
)
from fixtures.devcluster import start_devcluster  # noqa: E402
from fixtures.nats import NatsServer  # noqa: E402
from fixtures.stack import start_stack  # noqa: E402
from waiting import missing, wait_until  # noqa: E402

TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
MANAGED_BY = "kueue.x-k8s.io/multikueue"
NAMESPACE = "bench-mc"


def trainjob(name: str, delegated: bool) -> dict:
    spec = {"runtimeRef": {"name": "bench-torch"}, "suspend": True}
    if delegated:
        spec["managedBy"] = MANAGED_BY
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


class Endpoint:
    """An API server from a kubeconfig written by devcluster (bearer token, own CA)."""

    def __init__(self, kubeconfig: Path, concurrency: int) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        context = ssl.create_default_context()
        if cluster.get("certificate-authority-data"):
            import base64
            context.load_verify_locations(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        else:
            context.load_verify_locations(cafile=cluster["certificate-authority"])
        limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
        self.client = httpx.AsyncClient(base_url=cluster["server"], verify=context, limits=limits, timeout=60,
                                        headers={"Authorization": f"Bearer {user['token']}"})

    async def prepare(self) -> None:
        await self.client.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
        await self.client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                            "metadata": {"name": NAMESPACE}})


async def wait_all(watches: list[JobSetWatch], keys: list[str], timeout: float,
                   stall_s: float = 60.0) -> dict[str, float]:
    """Until every key's JobSet exists on some worker: says how many each worker has every few
    seconds, and ends the run (exit 1) after ``timeout`` or ``stall_s`` without a new JobSet (e.g.
    when the workers' pod slots are full and the dispatcher cannot place the rest)."""
    def seen() -> dict[str, float]:
        return {key: watch.seen[key] for watch in watches for key in keys if key in watch.seen}

    def progress() -> str:
        per_worker = ", ".join(f"worker {i + 1}: {sum(1 for key in keys if key in watch.seen)}"
                               for i, watch in enumerate(watches))
        return f"{missing(keys, seen())} ({per_worker})"

    await wait_until(f"{len(keys)} delegated JobSets on the workers", lambda: len(seen()) == len(keys), timeout,
                     progress=progress, poll_s=0.05, stall_s=stall_s)
    return seen()


async def single_cluster(args) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-single-"))
    nats = NatsServer(workdir / "nats")
    nats.start()
    cluster = start_devcluster(workdir / "devcluster")
    procs = []
    try:
        cluster.kubectl("apply", "--server-side",  # every CRD file (not the kustomization)
                        *(arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))))
        procs = [start_service(name, cluster.kubeconfig, nats.url, workdir) for name in SERVICES]
        for proc, name in zip(procs, SERVICES):
            wait_ready(proc, name)
        endpoint = Endpoint(cluster.kubeconfig, args.concurrency)
        await endpoint.prepare()
        watch = JobSetWatch(endpoint.client)
        await watch.start()
        names = [f"single-{i}" for i in range(args.sustained)]

        async def create(doc):
            (await endpoint.client.post(TRAINJOBS.format(ns=NAMESPACE), json=doc)).raise_for_status()

        start = time.perf_counter()
        await as_fast_as_possible([trainjob(n, False) for n in names],
                                  args.concurrency, create)
        await watch.wait_all([f"{NAMESPACE}/{n}" for n in names], timeout=300)
        rate = args.sustained / (time.perf_counter() - start)
        await watch.stop()
        await endpoint.client.aclose()
        return rate
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
        cluster.stop()
        nats.stop()


async def single_cluster_up(args, stack) -> float:
    """The same run's single-cluster rate on the stack one worker is: `trainyard up` (its data
    plane creates the JobSets' Jobs, as on the workers), TrainJobs without managedBy."""
    endpoint = Endpoint(Path(stack.state["kubeconfig"]), args.concurrency)
    await endpoint.prepare()
    watch = JobSetWatch(endpoint.client)
    await watch.start()

    async def create(doc):
        (await endpoint.client.post(TRAINJOBS.format(ns=NAMESPACE), json=doc)).raise_for_status()

    for name in ("warm-0", "warm-1"):
        await create(trainjob(name, False))
    await wait_all([watch], [f"{NAMESPACE}/warm-0", f"{NAMESPACE}/warm-1"], timeout=60)
    names = [f"up-{i}" for i in range(args.sustained)]
    start = time.perf_counter()
    await as_fast_as_possible([trainjob(n, False) for n in names], args.concurrency, create)
    done = await wait_all([watch], [f"{NAMESPACE}/{n}" for n in names], timeout=300)
    rate = len(done) / (time.perf_counter() - start)
    await watch.stop()
    await endpoint.client.aclose()
    return rate


async def delegated(args, stack) -> tuple[list[float], float, dict[str, float]]:
    clusters = stack.state["clusters"]
    endpoints = {name: Endpoint(Path(info["kubeconfig"]), args.concurrency) for name, info in clusters.items()}
    for endpoint in endpoints.values():
        await endpoint.prepare()
    manager = endpoints["manager"].client
    watches = [JobSetWatch(endpoints[name].client) for name in clusters if name != "manager"]
    for watch in watches:
        await watch.start()

    async def create(doc):
        (await manager.post(TRAINJOBS.format(ns=NAMESPACE), json=doc)).raise_for_status()

    # Warm-up: every process has imported and connected before anything is timed.
    warm = [f"warm-{i}" for i in range(5)]
    for name in warm:
        await create(trainjob(name, True))
    await wait_all(watches, [f"{NAMESPACE}/{n}" for n in warm], timeout=120)

    sent: dict[str, float] = {}
    count = int(10 * args.paced_seconds)
    start = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = start + i / 10 - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        name = f"paced-{i}"
        sent[f"{NAMESPACE}/{name}"] = time.perf_counter()
        tasks.append(asyncio.create_task(create(trainjob(name, True))))
    await asyncio.gather(*tasks)
    seen = await wait_all(watches, list(sent), timeout=120)
    latencies = [(seen[key] - at) * 1000 for key, at in sent.items() if key in seen]

    pids = {name: info["pid"] for name, info in stack.state["children"].items()}
    cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    names = [f"sustained-{i}" for i in range(args.sustained)]
    start = time.perf_counter()
    await as_fast_as_possible([trainjob(n, True) for n in names], args.concurrency, create)
    done = await wait_all(watches, [f"{NAMESPACE}/{n}" for n in names], timeout=600)
    rate = len(done) / (time.perf_counter() - start)
    cpu = {name: (cpu_seconds(pid) - cpu_before[name]) * 1000 / args.sustained for name, pid in pids.items()}
    for watch in watches:
        await watch.stop()
    for endpoint in endpoints.values():
        await endpoint.client.aclose()
    return latencies, rate, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sustained", type=int, default=200, help="TrainJobs in each sustained run")
    parser.add_argument("--paced-seconds", type=float, default=5.0, help="seconds of the 10/s paced run")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    single = asyncio.run(single_cluster(args))
    print(f"single-cluster sustained: {single:.1f} TrainJobs/s (bench/e2e.py's setup: devcluster without data "
          f"plane; create -> JobSet applied, {args.sustained} TrainJobs)")
    up_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-up-")) / "data"
    one = start_stack(up_dir, timeout=300)
    try:
        single_up = asyncio.run(single_cluster_up(args, one))
    finally:
        one.stop()
        one.kill()
    print(f"single-cluster sustained on `trainyard up` (data plane on, as each worker): {single_up:.1f} TrainJobs/s")
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-mc-")) / "data"
    stack = start_stack(data_dir, "--workers", "2", timeout=300)
    try:
        latencies, rate, cpu = asyncio.run(delegated(args, stack))
    finally:
        stack.stop()
        stack.kill()
    print(f"delegated at 10/s: p50 {percentile(latencies, 0.5):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms "
          f"(n={len(latencies)}; manager create -> JobSet on a worker)")
    print(f"delegated sustained: {rate:.1f} TrainJobs/s with 2 workers ({args.sustained} TrainJobs, "
          f"concurrency {args.concurrency}); ratio delegated/single-cluster = {rate / single:.2f} "
          f"(vs `trainyard up` single cluster: {rate / single_up:.2f})")
    busiest = sorted(cpu.items(), key=lambda item: -item[1])
    print("CPU ms per delegated TrainJob: " + ", ".join(f"{name} {value:.1f}" for name, value in busiest)
          + f"; total {sum(cpu.values()):.1f}")
    print(json.dumps({"single_rate": round(single, 1), "single_up_rate": round(single_up, 1),
                      "delegated_rate": round(rate, 1),
                      "p50_ms_at_10": round(percentile(latencies, 0.5), 1),
                      "p99_ms_at_10": round(percentile(latencies, 0.99), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
