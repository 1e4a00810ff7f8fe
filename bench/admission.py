"""Admission on a CPU-limited planner: how long one create waits for the validating webhooks.

Starts the bench stack of bench/e2e.py (nats-server, a devcluster, one replica of each service),
with the planner in a cgroup of its own limited to ``--cpu-limit`` cores (as a pod's
resources.limits.cpu), lets it go idle, then creates ``--creates`` ClusterTrainingRuntimes and
as many TrainJobs, one at a time, each through the API server and so through the planner's
webhooks (and the TrainJob defaulter). Prints, per kind, the create latency (p50, p90, max),
how many were answered within 1 s, and the planner's CPU per create from its cgroup's own
accounting, which includes whatever else the create made the planner do (a runtime event, the
TrainJob's plan).

Target (issue #33): at 0.03 CPU, each create answered within 1 s on an idle stack.

``--backlog N`` measures the same creates while the planner has work waiting: N TrainJobs are
created first (16 at a time, in a namespace of their own), and the one-at-a-time creates begin
once those are answered, while their plans are still being made; it prints how many of the N had
no JobSet yet when the measured creates began and when they ended (the backlog they competed with).

Usage: .venv/bin/python bench/admission.py [--cpu-limit 0.03] [--creates 20] [--idle 5] [--backlog N]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from cpu_quota import parse_limit  # noqa: E402  (bench/)
from e2e import RUNTIME, Stack, loadavg, percentile, trainjob  # noqa: E402  (bench/)

RUNTIMES = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
NAMESPACE = "bench-admission"
BACKLOG_NAMESPACE = "bench-admission-backlog"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"


def runtime(name: str) -> dict:
    doc = copy.deepcopy(RUNTIME)
    doc["metadata"] = {"name": name}
    return doc


def summary(kind: str, latencies_ms: list[float], cpu_ms: float) -> str:
    within = sum(1 for value in latencies_ms if value <= 1000.0)
    return (f"{kind:<24} n={len(latencies_ms):<3} p50 {percentile(latencies_ms, 0.5):7.1f} ms  "
            f"p90 {percentile(latencies_ms, 0.9):7.1f} ms  max {max(latencies_ms):7.1f} ms  "
            f"within 1 s: {within}/{len(latencies_ms)}  planner CPU {cpu_ms / len(latencies_ms):6.1f} ms per create")


async def creates(client: httpx.AsyncClient, path: str, docs: list[dict], planner_cpu) -> tuple[list[float], float]:
    latencies: list[float] = []
    cpu_before = planner_cpu()
    for doc in docs:
        began = time.perf_counter()
        response = await client.post(path, json=doc)
        latencies.append((time.perf_counter() - began) * 1000)
        if response.status_code != 201:
            raise SystemExit(f"create {doc['kind']} {doc['metadata']['name']}: HTTP {response.status_code} "
                             f"{response.text[:300]}")
        await asyncio.sleep(0.2)  # one at a time, on an otherwise idle stack
    return latencies, (planner_cpu() - cpu_before) * 1000


async def fill_backlog(client: httpx.AsyncClient, count: int, concurrency: int = 16) -> float:
    """Creates ``count`` TrainJobs, ``concurrency`` at a time; returns the seconds it took."""
    gate = asyncio.Semaphore(concurrency)

    async def create(i: int) -> None:
        async with gate:
            response = await client.post(TRAINJOBS.format(ns=BACKLOG_NAMESPACE),
                                         json=trainjob(BACKLOG_NAMESPACE, f"backlog-{i}"))
            if response.status_code != 201:
                raise SystemExit(f"backlog create {i}: HTTP {response.status_code} {response.text[:300]}")

    began = time.perf_counter()
    await asyncio.gather(*(create(i) for i in range(count)))
    return time.perf_counter() - began


async def unplanned(client: httpx.AsyncClient, count: int) -> int:
    """The backlog's TrainJobs that have no JobSet yet."""
    response = await client.get(JOBSETS.format(ns=BACKLOG_NAMESPACE))
    response.raise_for_status()
    return count - len(response.json()["items"])


async def measure(stack: Stack, args) -> None:
    cluster = stack.cluster
    group = stack.limited().get("planner")

    def planner_cpu() -> float:
        if group is not None:
            return group.usage_s()
        from e2e import cpu_seconds
        return cpu_seconds(stack.pids()["planner"][0])

    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    async with httpx.AsyncClient(base_url=cluster.url, verify=context, timeout=60,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as client:
        for namespace in (NAMESPACE, BACKLOG_NAMESPACE):
            await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": namespace}})
        (await client.post(RUNTIMES, json=RUNTIME)).raise_for_status()  # the one the TrainJobs use
        await asyncio.sleep(args.idle)
        backlog_line = ""
        if args.backlog:
            filled_s = await fill_backlog(client, args.backlog)
            waiting_before = await unplanned(client, args.backlog)
        runtime_ms, runtime_cpu = await creates(
            client, RUNTIMES, [runtime(f"bench-admission-{i}") for i in range(args.creates)], planner_cpu)
        if not args.backlog:
            await asyncio.sleep(args.idle)
        trainjob_ms, trainjob_cpu = await creates(
            client, TRAINJOBS.format(ns=NAMESPACE), [trainjob(NAMESPACE, f"adm-{i}") for i in range(args.creates)],
            planner_cpu)
        if args.backlog:
            backlog_line = (f"backlog: {args.backlog} TrainJobs created in {filled_s:.1f} s; without a JobSet when "
                            f"the measured creates began: {waiting_before}, when they ended: "
                            f"{await unplanned(client, args.backlog)}")
    limit = f"planner limited to {args.cpu_limit:g} CPU" if args.cpu_limit else "planner unlimited"
    print(f"machine: {os.cpu_count()} CPUs, /proc/loadavg {loadavg()}; {limit}")
    print(summary("ClusterTrainingRuntime", runtime_ms, runtime_cpu))
    print(summary("TrainJob", trainjob_ms, trainjob_cpu))
    if backlog_line:
        print(backlog_line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-limit", type=float, default=0.03, metavar="CORES",
                        help="the planner's CPU quota in cores (0: unlimited); needs root and a cgroup cpu controller")
    parser.add_argument("--creates", type=int, default=20, help="creates of each kind, one at a time")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle before each kind's creates")
    parser.add_argument("--backlog", type=int, default=0, metavar="N",
                        help="create N TrainJobs first (16 at a time) and measure while their plans are made")
    args = parser.parse_args()
    parse_limit(args.cpu_limit, "planner", ("planner",))
    if args.creates < 1:
        raise SystemExit("error: --creates: at least 1")
    if args.backlog < 0:
        raise SystemExit("error: --backlog: 0 or more")
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-admission-"))
    replicas = {"watcher": 1, "planner": 1, "applier": 1, "status": 1}
    roles = ("planner",) if args.cpu_limit else ()
    with Stack(replicas, workdir, cpu_limit=args.cpu_limit, limit_roles=roles) as stack:
        asyncio.run(measure(stack, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
