"""Benchmark of the devcluster API server (a real `trainyard devcluster up` process over HTTPS).

Prints: creates/s, SSA writes/s, list latency at 10,000 TrainJobs, watch delivery p50/p99 with
10 watchers at 200 writes/s, and the server's RSS with 10,000 TrainJobs stored.
Targets (issue 5): >= 1,000 SSA writes/s; list of 10,000 < 1 s; watch p99 < 50 ms; RSS < 300 MiB.

    .venv/bin/python bench/apiserver.py [--objects 10000] [--concurrency 32] [--parts ssa,inprocess]

`--parts` picks what runs (default: all of create, ssa, list, watch, inprocess); the creates
always run because the other parts need the objects.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from fixtures.devcluster import start_devcluster  # noqa: E402

TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
NAME_IN_EVENT = re.compile(rb'"name":"(w-\d{5})"')
CRD = REPO / "deploy" / "crds" / "trainer.kubeflow.org_trainjobs.yaml"


def trainjob(name: str, nodes: int = 1) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "labels": {"team": "bench"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": nodes, "image": "busybox"}}}


async def run_pool(count: int, concurrency: int, make_request) -> float:
    """Run ``count`` requests with ``concurrency`` workers; returns requests per second."""
    next_index = iter(range(count))

    async def worker() -> None:
        for i in next_index:
            await make_request(i)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - started)


def cpu_seconds(pid: int) -> float:
    """User + system CPU the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


PARTS = ("create", "ssa", "list", "watch", "inprocess")


async def bench(cluster, objects: int, concurrency: int, parts: set[str]) -> dict[str, float]:
    ctx = ssl.create_default_context(cafile=str(cluster.ca_cert))
    headers = {"Authorization": f"Bearer {cluster.token}"}
    connector = aiohttp.TCPConnector(limit=concurrency + 20, ssl=ctx)
    results: dict[str, float] = {}
    async with aiohttp.ClientSession(cluster.url, headers=headers, connector=connector) as session:
        async def create(i: int) -> None:
            async with session.post(TJ, json=trainjob(f"tj-{i:05d}")) as resp:
                assert resp.status == 201, await resp.text()
                await resp.read()
        cpu = cpu_seconds(cluster.pid)
        results["creates_per_s"] = await run_pool(objects, concurrency, create)
        results["create_cpu_ms"] = (cpu_seconds(cluster.pid) - cpu) / objects * 1000

        if "ssa" in parts:
            results.update(await ssa_writes(session, objects, concurrency, cluster.pid))
        if "list" in parts:
            results.update(await list_latency(session, cluster.pid))
        if "watch" in parts:
            results.update(await watch_latency(session, cluster, watchers=10, rate=200, seconds=5))
    return results


async def ssa_writes(session: aiohttp.ClientSession, objects: int, concurrency: int, pid: int) -> dict[str, float]:
    """Changing applies (numNodes 1 -> 2, forced, new manager), then the same applies again (no-ops)."""
    results: dict[str, float] = {}
    ssa_count = min(objects, 5000)

    async def apply(i: int) -> None:
        body = trainjob(f"tj-{i:05d}", nodes=2)
        async with session.patch(f"{TJ}/tj-{i:05d}", data=json.dumps(body),
                                 params={"fieldManager": "bench", "force": "true"},
                                 headers={"Content-Type": "application/apply-patch+yaml"}) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
    cpu = cpu_seconds(pid)
    results["ssa_writes_per_s"] = await run_pool(ssa_count, concurrency, apply)
    results["ssa_cpu_ms"] = (cpu_seconds(pid) - cpu) / ssa_count * 1000
    # the applier's usual case: re-applying an unchanged plan (a no-op, no new resourceVersion)
    cpu = cpu_seconds(pid)
    results["ssa_noop_per_s"] = await run_pool(ssa_count, concurrency, apply)
    results["ssa_noop_cpu_ms"] = (cpu_seconds(pid) - cpu) / ssa_count * 1000
    return results


async def list_latency(session: aiohttp.ClientSession, pid: int) -> dict[str, float]:
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        async with session.get(TJ) as resp:
            body = await resp.read()
        timings.append(time.perf_counter() - started)
    return {"list_items": len(json.loads(body)["items"]), "list_seconds_median": statistics.median(timings),
            "rss_mib": rss_mib(pid)}


async def _watchers(url: str, token: str, ca: str, rv: str, watchers: int, expected: int) -> dict[str, list[float]]:
    """Run ``watchers`` watch streams; returns each event's arrival (wall clock) per object name."""
    ctx = ssl.create_default_context(cafile=ca)
    arrivals: dict[str, list[float]] = {}
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"},
                                     connector=aiohttp.TCPConnector(ssl=ctx, limit=watchers + 2)) as session:
        async def watcher() -> None:
            got = 0
            async with session.get(TJ, params={"watch": "true", "resourceVersion": rv, "labelSelector": "team=watch"},
                                   timeout=aiohttp.ClientTimeout(total=None)) as resp:
                async for line in resp.content:
                    arrived = time.time()
                    # the client must not be the bottleneck: find the name without parsing the event
                    match = NAME_IN_EVENT.search(line)
                    if match is None:
                        continue
                    arrivals.setdefault(match.group(1).decode(), []).append(arrived)
                    got += 1
                    if got >= expected:
                        return
        await asyncio.wait_for(asyncio.gather(*(watcher() for _ in range(watchers))), timeout=120)
    return arrivals


def _watchers_process(url: str, token: str, ca: str, rv: str, watchers: int, expected: int, out: str) -> None:
    arrivals = asyncio.run(_watchers(url, token, ca, rv, watchers, expected))
    Path(out).write_text(json.dumps(arrivals))


async def watch_latency(session: aiohttp.ClientSession, cluster, watchers: int, rate: int, seconds: int
                        ) -> dict[str, float]:
    """Watchers run in their own process (they must not compete with the writer's event loop)."""
    import multiprocessing
    async with session.get(TJ, params={"labelSelector": "team=watch"}) as resp:
        rv = (await resp.json())["metadata"]["resourceVersion"]
    total = rate * seconds
    out = Path(tempfile.mkdtemp()) / "arrivals.json"
    child = multiprocessing.get_context("spawn").Process(
        target=_watchers_process, args=(cluster.url, cluster.token, str(cluster.ca_cert), rv, watchers, total, str(out)))
    child.start()
    await asyncio.sleep(2.0)  # let every watch connect
    sent: dict[str, float] = {}
    interval = 1 / rate

    async def write(name: str) -> None:
        body = trainjob(name)
        body["metadata"]["labels"]["team"] = "watch"
        sent[name] = time.time()
        async with session.post(TJ, json=body) as resp:
            assert resp.status == 201
            await resp.read()

    writes = []
    start = time.perf_counter()
    for i in range(total):  # writes are issued on a fixed schedule, not one after the other
        target = start + i * interval
        now = time.perf_counter()
        if target > now:
            await asyncio.sleep(target - now)
        writes.append(asyncio.create_task(write(f"w-{i:05d}")))
    await asyncio.gather(*writes)
    achieved = total / (time.perf_counter() - start)
    waited = 0.0
    while child.is_alive() and waited < 150:  # said every 5 s, as every bench wait (bench/waiting.py)
        await asyncio.get_running_loop().run_in_executor(None, child.join, 5)
        waited += 5
        if child.is_alive():
            print(f"waiting {waited:.0f}s of 150s for {watchers} watchers to receive {total} events each",
                  file=sys.stderr, flush=True)
    if child.is_alive():  # never leave the watcher process behind
        child.terminate()
        child.join(10)
        raise SystemExit(f"error: gave up after 150s waiting for {watchers} watchers to receive {total} events each")
    arrivals = json.loads(out.read_text())
    delays = sorted(t - sent[name] for name, times in arrivals.items() for t in times)
    return {"watch_write_rate": achieved, "watch_events": len(delays),
            "watch_p50_ms": delays[len(delays) // 2] * 1000, "watch_p99_ms": delays[int(len(delays) * 0.99)] * 1000}


async def in_process_costs(count: int = 2000) -> dict[str, float]:
    """CPU per operation of the API logic alone (no HTTP/TLS, no client): what the server needs per
    write when it has a core to itself. Shown beside the end-to-end figures, which on a shared
    machine mostly measure how much CPU the server got."""
    import yaml
    from trainyard_services.devcluster.apiserver.registry.store import WriteOptions
    from trainyard_services.devcluster.apiserver.server import ApiServer

    with tempfile.TemporaryDirectory() as tmp:
        server = ApiServer(Path(tmp), None)
        await server.start()
        api = server.api
        crd_type = server.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        await api.create(crd_type, None, yaml.safe_load(CRD.read_text()), WriteOptions(manager="bench"))
        rt = server.registry.lookup("trainer.kubeflow.org", "v1alpha1", "trainjobs")
        costs: dict[str, float] = {}

        async def measure(label: str, operations) -> None:
            started = time.process_time()
            await asyncio.gather(*operations)
            costs[label] = (time.process_time() - started) / count * 1000

        await measure("create", (api.create(rt, "default", trainjob(f"tj-{i:05d}"), WriteOptions(manager="bench"))
                                 for i in range(count)))
        bodies = [json.dumps(trainjob(f"tj-{i:05d}", nodes=2)).encode() for i in range(count)]
        await measure("apply", (api.patch(rt, "default", f"tj-{i:05d}", "apply", bodies[i],
                                          WriteOptions(manager="bench-ssa", force=True)) for i in range(count)))
        await measure("apply_noop", (api.patch(rt, "default", f"tj-{i:05d}", "apply", bodies[i],
                                               WriteOptions(manager="bench-ssa", force=True)) for i in range(count)))
        await server.stop()
    return costs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="comma-separated parts to run (create always runs): " + ", ".join(PARTS))
    args = parser.parse_args()
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    if parts - set(PARTS):
        parser.error(f"--parts: unknown part(s) {', '.join(sorted(parts - set(PARTS)))}; choose from {', '.join(PARTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        cluster = start_devcluster(Path(tmp) / "data", ["--log-level", "WARNING"])
        try:
            cluster.kubectl("create", "-f", str(CRD))
            cluster.kubectl("wait", "--for=condition=Established", "crd/trainjobs.trainer.kubeflow.org")
            results = asyncio.run(bench(cluster, args.objects, args.concurrency, parts))
        finally:
            cluster.stop()
    print(f"creates/s:                     {results['creates_per_s']:8.0f}   ({args.objects} TrainJobs, {args.concurrency} concurrent; "
          f"server CPU {results['create_cpu_ms']:.2f} ms/request)")
    if "ssa" in parts:
        print(f"SSA writes/s:                  {results['ssa_writes_per_s']:8.0f}   (each apply changes the object; target >= 1000; "
              f"server CPU {results['ssa_cpu_ms']:.2f} ms/request = {1000 / results['ssa_cpu_ms']:.0f}/s per core)")
        print(f"SSA no-op re-applies/s:        {results['ssa_noop_per_s']:8.0f}   (same manager, same configuration; "
              f"server CPU {results['ssa_noop_cpu_ms']:.2f} ms/request)")
    if "list" in parts:
        print(f"list {results['list_items']:.0f} TrainJobs:          {results['list_seconds_median'] * 1000:8.1f} ms (median of 5; target < 1000 ms)")
    if "watch" in parts:
        print(f"watch p50 / p99:               {results['watch_p50_ms']:6.1f} / {results['watch_p99_ms']:.1f} ms "
              f"(10 watchers, {results['watch_write_rate']:.0f} writes/s, {results['watch_events']:.0f} events; target p99 < 50 ms)")
    if "list" in parts:
        print(f"server RSS with {args.objects} TrainJobs:  {results['rss_mib']:8.1f} MiB (target < 300 MiB)")
    if "inprocess" in parts:
        costs = asyncio.run(in_process_costs())
        print(f"API logic CPU per op (in process, no HTTP): create {costs['create']:.2f} ms, "
              f"apply {costs['apply']:.2f} ms, no-op re-apply {costs['apply_noop']:.2f} ms")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
