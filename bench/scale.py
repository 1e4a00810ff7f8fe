"""Scale benchmark: many live (suspended) TrainJobs through the services.

Starts nats-server, a devcluster and one replica of each service (bench/e2e.py's stack), then:
1. creates ``--count`` suspended TrainJobs through the API server with ``--generators``
   processes and waits until every one has its (suspended) JobSet: creation rate;
2. reports RSS per process and the KV buckets' message counts with that many live TrainJobs;
3. restarts the watcher, the planner and the status service one at a time and reports how long
   each takes to be ready and caught up: a TrainJob created right after the restart has its
   JobSet (watcher, planner) or its status written (status);
4. runs ``--cycles`` rounds of creating and deleting ``--churn`` more TrainJobs and reports
   RSS and KV message counts again: nothing should grow with history (tombstones purged).

Usage: .venv/bin/python bench/scale.py [--count 10000] [--generators 4] [--cycles 3] [--churn 500]
       [--tombstone-ttl 20 --wait-purge 30]
Prints figures; asserts nothing (targets: RSS < 200 MiB per service, catch-up < 10 s).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402

from e2e import (RUNTIME, SERVICES, TRAINJOBS, Generators, JobSetWatch, Stack, loadavg,  # noqa: E402
                 parse_replicas, trainjob)
from waiting import wait_until  # noqa: E402

NS = "scale"
PROBE_NS = "scale-probe"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory(stack: Stack) -> dict[str, float]:
    out = {}
    for name, group in stack.pids().items():
        for i, pid in enumerate(group):
            out[name if len(group) == 1 else f"{name}-{i + 1}"] = rss_mib(pid)
    return out


async def kv_messages(stack: Stack) -> dict[str, int]:
    """Messages held by each KV bucket's stream (live entries plus tombstones and markers)."""
    async with httpx.AsyncClient(timeout=10) as plain:
        jsz = (await plain.get(f"http://127.0.0.1:{stack.monitor_port}/jsz", params={"streams": "true"})).json()
    out = {}
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            if stream["name"].startswith("KV_"):
                out[stream["name"][3:]] = stream["state"]["messages"]
    return out


async def settle(stack: Stack, quiet_s: float = 1.0, limit_s: float = 120.0) -> float:
    """Waits until every service is idle (< 5 % CPU over ``quiet_s``); returns seconds waited."""
    from e2e import cpu_seconds

    start = time.perf_counter()
    pids = [pid for name, group in stack.pids().items() if name in SERVICES for pid in group]
    while time.perf_counter() - start < limit_s:
        before = {pid: cpu_seconds(pid) for pid in pids}
        await asyncio.sleep(quiet_s)
        if all(cpu_seconds(pid) - before[pid] < 0.05 * quiet_s for pid in pids):
            break
    return time.perf_counter() - start


def show_memory(title: str, mem: dict[str, float], kv: dict[str, int]) -> None:
    print(f"{title}: RSS MiB " + ", ".join(f"{n} {v:.0f}" for n, v in mem.items()) +
          "; KV messages " + ", ".join(f"{n} {v}" for n, v in sorted(kv.items())) + f"; load {loadavg()}")


async def run(stack: Stack, args) -> None:
    cluster = stack.cluster
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    async with httpx.AsyncClient(base_url=cluster.url, verify=context, timeout=60,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as client:
        (await client.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
         ).raise_for_status()
        for ns in (NS, PROBE_NS):
            await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": ns}})
        watch = JobSetWatch(client)
        await watch.start()
        show_memory("at start", memory(stack), await kv_messages(stack))

        names = [f"t-{i}" for i in range(args.count)]
        creators = Generators(cluster, "create-suspended", NS, names, args.generators, args.concurrency)
        await creators.start()
        start = time.perf_counter()
        creators.go()
        await creators.finish()
        created = time.perf_counter() - start
        done = await watch.wait_all([f"{NS}/{n}" for n in names], timeout=args.count)
        planned = time.perf_counter() - start
        print(f"created {args.count} suspended TrainJobs in {created:.1f} s ({args.count / created:.0f}/s); "
              f"every JobSet there after {planned:.1f} s ({args.count / planned:.0f}/s){'' if done else ' (TIMED OUT)'}")
        waited = await settle(stack)
        show_memory(f"{args.count} live TrainJobs (settled after {waited:.1f} s more)", memory(stack),
                    await kv_messages(stack))

        for service in ("watcher", "planner", "status"):
            started, ready = stack.restart(service)
            probe = f"probe-{service}"
            (await client.post(TRAINJOBS.format(ns=PROBE_NS), json=trainjob(PROBE_NS, probe, suspend=True))
             ).raise_for_status()
            if service == "status":
                caught = await wait_status(client, probe, limit=120)
            else:
                ok = await watch.wait_all([f"{PROBE_NS}/{probe}"], timeout=120)
                caught = watch.seen[f"{PROBE_NS}/{probe}"] if ok else float("nan")
            settled = await settle(stack)
            pid = stack.pids()[service][0]
            print(f"restarted {service}: ready after {ready:.1f} s, caught up (a new TrainJob "
                  f"{'has its status' if service == 'status' else 'has its JobSet'}) {caught - started:.1f} s "
                  f"after the start; all services idle {settled:.1f} s later; its RSS {rss_mib(pid):.0f} MiB; "
                  f"load {loadavg()}")

        before_mem, before_kv = memory(stack), await kv_messages(stack)
        show_memory("before the create/delete cycles", before_mem, before_kv)
        for cycle in range(args.cycles):
            batch = [f"c{cycle}-{i}" for i in range(args.churn)]
            makers = Generators(cluster, "create-suspended", NS, batch, args.generators, args.concurrency)
            await makers.start()
            makers.go()
            await makers.finish()
            await watch.wait_all([f"{NS}/{n}" for n in batch], timeout=600)
            removers = Generators(cluster, "delete", NS, batch, args.generators, args.concurrency)
            await removers.start()
            removers.go()
            await removers.finish()
            await watch.wait_all([f"{NS}/{n}" for n in batch], timeout=600, deleted=True)
            await settle(stack)
            print(f"  cycle {cycle + 1}: RSS MiB " + ", ".join(f"{n} {v:.0f}" for n, v in memory(stack).items()),
                  flush=True)
        if args.cycles:
            if args.wait_purge:
                print(f"waiting {args.wait_purge:.0f} s for tombstones to expire", flush=True)
                await asyncio.sleep(args.wait_purge)
            after_mem, after_kv = memory(stack), await kv_messages(stack)
            show_memory(f"after {args.cycles} cycles of {args.churn} created and deleted", after_mem, after_kv)
            total = args.cycles * args.churn
            print("growth per 1,000 TrainJobs created and deleted: RSS MiB " + ", ".join(
                f"{n} {(after_mem[n] - before_mem.get(n, 0)) * 1000 / total:+.1f}" for n in after_mem) +
                "; KV messages " + ", ".join(
                f"{n} {(after_kv.get(n, 0) - before_kv.get(n, 0)) * 1000 / total:+.0f}" for n in sorted(after_kv)))
        await watch.stop()


async def wait_status(client: httpx.AsyncClient, name: str, limit: float) -> float:
    """The moment TrainJob ``name`` first has conditions (saying so while it waits; the run ends
    when it has none after ``limit`` seconds)."""
    async def has_status() -> bool:
        job = (await client.get(TRAINJOBS.format(ns=PROBE_NS) + f"/{name}")).json()
        return bool((job.get("status") or {}).get("conditions"))

    await wait_until(f"TrainJob {PROBE_NS}/{name} to get its status", has_status, limit, poll_s=0.02)
    return time.perf_counter()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10000, help="live TrainJobs to create")
    parser.add_argument("--generators", type=int, default=4, help="load-generating processes")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight, over all generators")
    parser.add_argument("--cycles", type=int, default=3, help="create/delete rounds after the restarts")
    parser.add_argument("--churn", type=int, default=500, help="TrainJobs created and deleted per round")
    parser.add_argument("--wait-purge", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long after the cycles before measuring (tombstone expiry)")
    parser.add_argument("--tombstone-ttl", type=float, default=0.0, metavar="SECONDS",
                        help="the services' $TRAINYARD_TOMBSTONE_TTL (default: theirs, 600 s)")
    args = parser.parse_args()
    if args.count < 1 or args.generators < 1 or args.concurrency < args.generators:
        raise SystemExit("error: --count and --generators need >= 1, --concurrency >= --generators")
    if args.tombstone_ttl:
        if args.tombstone_ttl < 1:
            raise SystemExit("error: --tombstone-ttl: needs at least 1 second")
        os.environ["TRAINYARD_TOMBSTONE_TTL"] = str(args.tombstone_ttl)  # the services inherit it
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-scale-"))
    with Stack(parse_replicas(""), workdir) as stack:
        print(f"machine: {os.cpu_count()} CPUs, load {loadavg()}; {args.count} TrainJobs, "
              f"{args.generators} generator processes; logs in {workdir}", flush=True)
        asyncio.run(run(stack, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
