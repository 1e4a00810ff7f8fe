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
   - with --dispatchers 1,2,4: the sustained run again with that many dispatcher processes
     (the stack's own plus extra ones started like it), then a table: per count, delegated
     TrainJobs/s (and its multiple of the first row's), offered creates/s against taken, the
     dispatchers' CPU ms per TrainJob, the whole stack's CPU and, with --cpu-limit, each limited
     replica's CPU as a share of its limit and which are at it; under it, each replica's CPU
     and every cluster's API requests, per TrainJob. Each row starts once
     the dispatchers are idle, and its CPU counts until they are idle again (they go on
     mirroring statuses after the last JobSet exists). Two rates: the JobSets' (placed and
     created on a worker), and until every manager TrainJob shows its copy's state (Dispatched
     and Suspended), the work a delegated TrainJob costs whole: a replica at its limit places
     first and mirrors later, so only the second is its sustainable rate.
   - with --cpu-limit CORES: each process of --limit-roles (default: dispatcher; every extra
     dispatcher too) in a cgroup of its own with that CPU quota (bench/cpu_quota.py), as a pod's
     resources.limits.cpu; an extra replica's quota is lifted while it starts and applied once
     the partitions are split. Target (issue #33): 4 limited dispatchers >= 3.4x one.
TrainJobs are created suspended in both parts, so JobSets are created and no pod runs (and they
hold no worker slots, so any number of them is delegated): the figures are the control
planes', not the local data plane's.
3. --placement-workers 20: placement alone, in-process, against real API servers and a real
   nats-server: 20 MultiKueueClusters (sharing one worker API server, each with its own
   client), optionally --fleet-pods pods on it; prints the p50/p99 of the decision (choosing
   among the workers' summaries), of decision + the shared slot hold (one compare-and-set on
   ty_slots), and of the whole placement including the manager's annotation write.
``--api-workers N`` runs every devcluster (the single-cluster ones, the manager's and the
workers', the placement run's) with N API worker processes over its store process, as
`trainyard up --api-workers N`; a devcluster's CPU is then the sum of its processes.

Usage: .venv/bin/python bench/multicluster.py [--sustained 200] [--paced-seconds 5] [--concurrency 16]
           [--dispatchers 1,2,4] [--placement-workers 20 --placements 300 --fleet-pods 0]
           [--only placement|delegated] [--skip-single] [--api-workers N]
           [--cpu-limit CORES [--limit-roles dispatcher]]
Prints figures; asserts nothing (targets: delegated >= 0.4 x single-cluster on 2 cores,
p50 < 500 ms at 10/s; >= 30 delegated TrainJobs/s on a 16-core machine, >= 150 on the device;
placement p99 < 5 ms with 20 workers). Every wait says what it waits for and ends the run
(bench/waiting.py) instead of waiting silently.
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

from cpu_quota import (  # noqa: E402
    LimitedReplicas, add_arguments as add_limit_arguments, at_limit, limit_lines, parse_limit, share_list,
)
from e2e import (  # noqa: E402
    RUNTIME, SERVICES, JobSetWatch, api_worker_pids, as_fast_as_possible, cpu_seconds, loadavg, offered_taken,
    percentile, prometheus_samples, start_service, wait_ready,
)
from fixtures.devcluster import start_devcluster  # noqa: E402
from fixtures.nats import NatsServer  # noqa: E402
from fixtures.stack import start_stack  # noqa: E402
from waiting import missing, stop_process, wait_until  # noqa: E402

TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
MANAGED_BY = "kueue.x-k8s.io/multikueue"
NAMESPACE = "bench-mc"
ROLES = ("dispatcher", *SERVICES)  # what --limit-roles may name: a service is limited on every cluster
SCALE_TARGET = 3.4  # issue #33: delegated TrainJobs/s with 4 limited dispatchers over one


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


class MirroredWatch:
    """Records when each manager TrainJob first shows its worker copy's state: Dispatched and
    Suspended both True (the bench's TrainJobs are created suspended, so the copy's status has
    Suspended once the worker's status service folded it, and the dispatcher mirrored it)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self.mirrored: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        listing = (await self._client.get(TRAINJOBS.format(ns=NAMESPACE))).json()
        for item in listing.get("items") or []:
            self._observe(item)
        self._task = asyncio.create_task(self._run(listing["metadata"]["resourceVersion"]))

    def _observe(self, trainjob: dict) -> None:
        conditions = {c.get("type"): c.get("status") for c in (trainjob.get("status") or {}).get("conditions") or []}
        if conditions.get("Dispatched") == "True" and conditions.get("Suspended") == "True":
            meta = trainjob["metadata"]
            self.mirrored.setdefault(f"{meta['namespace']}/{meta['name']}", time.perf_counter())

    async def _run(self, rv: str) -> None:
        params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "3600"}
        async with self._client.stream("GET", TRAINJOBS.format(ns=NAMESPACE), params=params, timeout=None) as answer:
            async for line in answer.aiter_lines():
                if line:
                    event = json.loads(line)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._observe(event["object"])

    async def wait_all(self, keys: list[str], timeout: float) -> None:
        await wait_until(f"{len(keys)} manager TrainJobs to show their copies' state",
                         lambda: all(key in self.mirrored for key in keys), timeout,
                         progress=lambda: missing(keys, self.mirrored), poll_s=0.05, stall_s=60.0)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()


async def single_cluster(args) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-single-"))
    nats = NatsServer(workdir / "nats")
    nats.start()
    cluster = start_devcluster(workdir / "devcluster", api_workers_args(args))
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


def child_role(name: str, clusters) -> str:
    """The role of a `trainyard up` child: ``worker-1-planner-2`` -> ``planner``, ``dispatcher``
    -> ``dispatcher`` (the manager's children have no prefix, a worker's its cluster's name)."""
    for cluster in clusters:
        if cluster != "manager" and name.startswith(f"{cluster}-"):
            name = name[len(cluster) + 1:]
            break
    base, _, index = name.rpartition("-")
    return base if base and index.isdigit() else name


def limit_stack(stack, limits: LimitedReplicas, roles: tuple[str, ...]) -> list[str]:
    """The stack's processes of ``roles`` (by child name) each in its cgroup, limited now (they
    are ready); returns their names."""
    labels = [name for name in stack.state["children"] if child_role(name, stack.state["clusters"]) in roles]
    for label in labels:
        limits.starting(label, stack.state["children"][label]["pid"])
    limits.apply(*labels)
    return labels


def stack_pids(stack, extras) -> list[int]:
    """Every process of the stack (a devcluster's API workers too) and the extra dispatchers."""
    return [pid for info in stack.state["children"].values() for pid in child_processes(info["pid"])] + [
        proc.pid for proc, _ in extras]


def extra_label(index: int) -> str:
    """The name of extra dispatcher ``index`` (1, 2, ...) in the reports: the stack's own is
    ``dispatcher``, the extras ``dispatcher-2`` and on."""
    return f"dispatcher-{index + 1}"


def start_extra_dispatcher(stack, workdir: Path, index: int, limits: LimitedReplicas | None = None):
    """One more dispatcher replica, started as the stack started its own (same argv and
    environment, so the same identity and flags), on its own health port. With ``limits`` it
    starts in its own cgroup, unlimited (the caller applies the limit once it took its share)."""
    import subprocess

    from trainyard.supervisor.ports import free_port

    pid = stack.state["children"]["dispatcher"]["pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    argv = [part.decode() for part in argv]
    env = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
               if "=" in item)
    port = free_port()
    argv[argv.index("--http-port") + 1] = str(port)
    log = (workdir / f"dispatcher-extra-{index}.log").open("ab")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    if limits is not None:
        limits.starting(extra_label(index), proc.pid)
    began = time.monotonic()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() - began > 120:
            raise SystemExit(f"error: extra dispatcher {index} not ready (exit {proc.poll()}); see {log.name}")
        time.sleep(0.2)


def metric_value(port: int, sample: str) -> float | None:
    """The value of the sample ``sample`` (name and labels, as exposed) on the service's
    /metrics at ``port``; None when it is not there or the service does not answer."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def partitions_owned(port: int) -> int | None:
    """The partitions a dispatcher serves now (its trainyard_partitions_owned gauge); None
    when it does not say (a release before home replicas)."""
    value = metric_value(port, 'trainyard_partitions_owned{role="dispatcher"}')
    return None if value is None else int(value)


def slot_write_conflicts(ports: list[int]) -> float:
    """The dispatchers' slot-ledger writes that met another replica's write first, summed
    (trainyard_dispatcher_slot_write_conflicts_total; 0 from a release without the counter)."""
    return sum(metric_value(port, "trainyard_dispatcher_slot_write_conflicts_total") or 0.0 for port in ports)


async def api_requests(endpoints: dict[str, Endpoint]) -> dict[tuple[str, str, str], float]:
    """Every cluster's API requests so far (devcluster's apiserver_request_total), by (cluster,
    verb, resource); watches left out. Each API worker counts its own, so with --api-workers a
    scrape sees one worker's share."""
    counts: dict[tuple[str, str, str], float] = {}
    for cluster, endpoint in endpoints.items():
        text = (await endpoint.client.get("/metrics")).text
        for labels, value in prometheus_samples(text, "apiserver_request_total").items():
            found = dict(labels)
            if found.get("verb") == "WATCH":
                continue
            resource = found.get("resource", "") + (f"/{found['subresource']}" if found.get("subresource") else "")
            key = (cluster, found.get("verb", ""), resource)
            counts[key] = counts.get(key, 0.0) + value
    return counts


def request_lines(before: dict, after: dict, count: int) -> list[str]:
    """API requests per TrainJob of one row, per cluster, largest first."""
    per: dict[str, dict[tuple[str, str], float]] = {}
    for key in set(before) | set(after):
        delta = (after.get(key, 0.0) - before.get(key, 0.0)) / count
        if delta >= 0.005:
            per.setdefault(key[0], {})[key[1:]] = delta
    lines = []
    for cluster in sorted(per):
        found = sorted(per[cluster].items(), key=lambda item: -item[1])
        lines.append(f"API requests per TrainJob on {cluster} ({sum(per[cluster].values()):.1f}): " + ", ".join(
            f"{verb} {resource} {value:.2f}" for (verb, resource), value in found))
    return lines


async def wait_split(ports: list[int], timeout_s: float = 60.0) -> None:
    """Until the dispatchers serve every partition between them, each its share (a joining
    replica takes its share within a few heartbeats), so a row measures the split, not the
    hand-over; says so and goes on after ``timeout_s``."""
    from trainyard.bus.subjects import partitions_setting

    count = partitions_setting()
    deadline = time.monotonic() + timeout_s
    owned: list[int | None] = []
    while time.monotonic() < deadline:
        owned = [await asyncio.to_thread(partitions_owned, port) for port in ports]
        if None in owned:
            return  # a release without partitions: nothing to wait for
        if sum(owned) == count and max(owned) - min(owned) <= 1:  # type: ignore[type-var]
            return
        await asyncio.sleep(0.5)
    print(f"warning: dispatcher partitions not split after {timeout_s:.0f} s: {owned} of {count}", flush=True)


# A dispatcher replica using less CPU than this has no TrainJob work left (its idle loops use
# 1-4 ms/s).
SETTLED_MS_PER_S = 6.0


async def settle(pids: list[int], timeout_s: float = 120.0) -> float:
    """Until the dispatchers have nothing left to do (each under SETTLED_MS_PER_S for two
    seconds in a row), so that a row neither inherits the previous phase's work nor leaves its
    own to the next: the TrainJobs' statuses are still being mirrored when their JobSets exist.
    Returns the seconds waited."""
    began = time.monotonic()
    quiet = 0
    while time.monotonic() - began < timeout_s and quiet < 2:
        before = sum(cpu_seconds(pid) for pid in pids)
        await asyncio.sleep(1.0)
        used_ms = (sum(cpu_seconds(pid) for pid in pids) - before) * 1000
        quiet = quiet + 1 if used_ms <= SETTLED_MS_PER_S * len(pids) else 0
    return time.monotonic() - began


async def replica_rows(args, stack, workdir: Path, limits: LimitedReplicas,
                       limited: list[str]) -> list[dict]:
    """One row per dispatcher count (see ``dispatcher_table``); ``limited``: the stack's own
    limited processes (the extra dispatchers are limited too when the dispatcher is)."""
    clusters = stack.state["clusters"]
    endpoints = {name: Endpoint(Path(info["kubeconfig"]), args.concurrency) for name, info in clusters.items()}
    manager = endpoints["manager"].client
    watches = [JobSetWatch(endpoints[name].client) for name in clusters if name != "manager"]
    for watch in watches:
        await watch.start()
    mirrored = MirroredWatch(manager)
    await mirrored.start()

    async def create(doc):
        (await manager.post(TRAINJOBS.format(ns=NAMESPACE), json=doc)).raise_for_status()

    limit_extras = limits if "dispatcher" in args.limit_roles else None
    extras: list = []
    rows = []
    try:
        for count in args.dispatchers:
            while len(extras) > count - 1:  # a smaller count after a larger one
                stop_process(extras.pop()[0])
            while len(extras) < count - 1:
                extras.append(await asyncio.to_thread(start_extra_dispatcher, stack, workdir, len(extras) + 1,
                                                      limit_extras))
            pids = [stack.state["children"]["dispatcher"]["pid"], *(p.pid for p, _ in extras)]
            ports = [stack.state["ports"]["dispatcher"], *(port for _, port in extras)]
            await wait_split(ports)
            if limit_extras is not None:
                limits.apply(*(extra_label(i) for i in range(1, len(extras) + 1)))
            warm = [f"warm-r{count}-{i}" for i in range(2 * count)]  # each replica has placed
            for name in warm:
                await create(trainjob(name, True))
            await wait_all(watches, [f"{NAMESPACE}/{n}" for n in warm], timeout=120)
            settled_before = await settle(pids)
            everything = stack_pids(stack, extras)
            labels = limited + [extra_label(i) for i in range(1, len(extras) + 1)]
            limits_before = limits.snapshot(labels)
            total_before = sum(cpu_seconds(pid) for pid in everything)
            cpu_before = sum(cpu_seconds(pid) for pid in pids)
            conflicts_before = await asyncio.to_thread(slot_write_conflicts, ports)
            requests_before = await api_requests(endpoints)
            replica_cpu_before = [cpu_seconds(pid) for pid in pids]
            load_before = loadavg()
            names = [f"r{count}-{i}" for i in range(args.sustained)]
            start = time.perf_counter()
            created = await as_fast_as_possible([trainjob(n, True) for n in names], args.concurrency, create)
            done = await wait_all(watches, [f"{NAMESPACE}/{n}" for n in names], timeout=600)
            wall = time.perf_counter() - start
            await mirrored.wait_all([f"{NAMESPACE}/{n}" for n in names], timeout=600)
            mirrored_wall = time.perf_counter() - start
            shares = limits.shares(limits_before, mirrored_wall)
            stack_cpu = sum(cpu_seconds(pid) for pid in everything) - total_before
            # What is left after that (events of the row still in the queues) counts in its CPU.
            settled_after = await settle(pids)
            row = {"dispatchers": count, "rate": len(done) / wall, "created_s": created, "wall_s": wall,
                   "mirrored_rate": len(names) / mirrored_wall,
                   "dispatcher_cpu_ms": (sum(cpu_seconds(pid) for pid in pids) - cpu_before) * 1000 / args.sustained,
                   "stack_cpu_pct": 100 * stack_cpu / mirrored_wall,
                   "settled_s": [settled_before, settled_after],
                   "limits": shares, "load_before": load_before,
                   "conflicts": (await asyncio.to_thread(slot_write_conflicts, ports) - conflicts_before)
                   / args.sustained,
                   "replica_cpu_ms": [(cpu_seconds(pid) - was) * 1000 / args.sustained
                                      for pid, was in zip(pids, replica_cpu_before)]}
            requests = request_lines(requests_before, await api_requests(endpoints), args.sustained)
            rows.append(row)
            print(f"  {count} dispatcher(s): {row['rate']:.1f} delegated TrainJobs/s (their JobSets on the workers), "
                  f"{row['mirrored_rate']:.1f}/s with the copies' state on the manager, dispatchers "
                  f"{row['dispatcher_cpu_ms']:.1f} CPU ms per TrainJob, {row['conflicts']:.2f} slot-ledger write "
                  f"conflicts per TrainJob, the stack {row['stack_cpu_pct']:.0f}% CPU; the dispatchers settled "
                  f"{settled_before:.0f} s before the row and {settled_after:.0f} s after it, counted in its CPU "
                  f"(load before {load_before}, after {loadavg()})", flush=True)
            per_replica = ", ".join(f"{label} {cpu:.1f} ms" for label, cpu in zip(
                ["dispatcher", *(extra_label(i) for i in range(1, len(extras) + 1))], row["replica_cpu_ms"]))
            for line in [offered_taken(args.sustained, created, wall), *limit_lines(row["limits"], args.cpu_limit),
                         f"per TrainJob of the row, each replica's CPU: {per_replica}",
                         *requests]:
                print(f"    {line}", flush=True)
    finally:
        for proc, _ in extras:
            stop_process(proc)
        await mirrored.stop()
        for watch in watches:
            await watch.stop()
        for endpoint in endpoints.values():
            await endpoint.client.aclose()
    return rows


def dispatcher_table(rows: list[dict], sustained: int, cpu_limit: float, cores: int) -> list[str]:
    """The --dispatchers table: per dispatcher count, delegated TrainJobs/s and its multiple of
    the first row's, offered creates/s (while they were sent) against taken, the dispatchers'
    CPU ms per TrainJob, the whole stack's CPU % of one core, and with --cpu-limit each limited
    replica's CPU as a share of its limit (periods throttled) and the replicas at their limit;
    then the issue #33 target when the table has a 1 and a 4 row."""
    head = (f"{'dispatchers':>11} {'TJ/s':>7} {'x1':>5} {'mirrored/s':>10} {'x1':>5} {'offered/s':>9} "
            f"{'disp ms':>8} {'conflicts':>9} {'stack CPU %':>11}")
    lines = [head + ("   limited replicas: CPU % of the limit (periods throttled); at their limit" if cpu_limit else ""),
             f"  (TJ/s: delegated TrainJobs/s taken (their JobSets on the workers), {sustained} per row; mirrored/s: "
             f"the same until every manager TrainJob shows its copy's state; offered: creates/s while they were sent; "
             f"disp ms: all dispatchers' CPU ms per TrainJob; conflicts: slot-ledger writes per TrainJob that met "
             f"another replica's write first; stack CPU: every process of the stack, % of one of "
             f"{cores} cores)"]
    first = rows[0]["rate"] if rows else 0.0
    first_mirrored = rows[0].get("mirrored_rate", 0.0) if rows else 0.0
    for row in rows:
        scale = row["rate"] / first if first else 0.0
        mirrored = row.get("mirrored_rate", 0.0)
        mirrored_scale = mirrored / first_mirrored if first_mirrored else 0.0
        line = (f"{row['dispatchers']:>11} {row['rate']:>7.1f} {scale:>5.2f} {mirrored:>10.1f} {mirrored_scale:>5.2f} "
                f"{sustained / row['created_s']:>9.1f} "
                f"{row['dispatcher_cpu_ms']:>8.1f} {row.get('conflicts', 0.0):>9.2f} {row['stack_cpu_pct']:>11.0f}   ")
        if cpu_limit:
            busy = at_limit(row["limits"])
            line += share_list(row["limits"]) + "; at their limit: " + (", ".join(busy) if busy else "none")
        lines.append(line.rstrip())
    target = scale_target(rows, cpu_limit)
    return lines + ([target] if target else [])


def scale_target(rows: list[dict], cpu_limit: float) -> str | None:
    """Delegated TrainJobs/s with 4 dispatchers over 1 against the issue #33 target (>= 3.4x
    with limited replicas); None without both rows."""
    one = [row for row in rows if row["dispatchers"] == 1]
    four = [row for row in rows if row["dispatchers"] == 4]
    if not one or not four or not one[0]["rate"]:
        return None
    ratio = four[0]["rate"] / one[0]["rate"]
    limited = f"each limited to {cpu_limit:g} CPU" if cpu_limit else "not limited (the target is for limited ones)"
    line = (f"target: delegated TrainJobs/s with 4 dispatchers >= {SCALE_TARGET:g}x one ({limited}): "
            f"{ratio:.2f}x {'met' if ratio >= SCALE_TARGET else 'NOT met'} (JobSets on the workers)")
    if one[0].get("mirrored_rate") and four[0].get("mirrored_rate"):
        mirrored = four[0]["mirrored_rate"] / one[0]["mirrored_rate"]
        line += f", {mirrored:.2f}x {'met' if mirrored >= SCALE_TARGET else 'NOT met'} (copies' state on the manager)"
    return line


async def placement_bench(args) -> dict[str, float]:
    """Placement with --placement-workers registered workers, in-process (see the docstring)."""
    import base64

    import nats as nats_client

    from trainyard.bus.topology import SLOTS_BUCKET, ensure_topology
    from trainyard.kube import resources as r
    from trainyard.kube.client import KubeClient
    from trainyard.multicluster.registry import WorkerRegistry
    from trainyard.multicluster.slots import SlotLedger
    from trainyard_services.dispatcher.service import Dispatcher

    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-placement-"))
    nats = NatsServer(workdir / "nats")
    nats.start()
    manager_dc = start_devcluster(workdir / "manager", api_workers_args(args))
    worker_dc = start_devcluster(workdir / "worker", api_workers_args(args))
    try:
        crds = [arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))]
        for cluster in (manager_dc, worker_dc):
            cluster.kubectl("apply", "--server-side", *crds, timeout=120)
            cluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
            cluster.kubectl("apply", "-f", "-", input=json.dumps(RUNTIME))
        manager_dc.kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / "multicluster" / "crds"))
        manager_dc.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        manager = await KubeClient.from_kubeconfig(str(manager_dc.kubeconfig))
        worker = await KubeClient.from_kubeconfig(str(worker_dc.kubeconfig))
        await manager.create(r.NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NAMESPACE}})
        await manager.create(r.SECRET, "kubeflow-system", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "shared-kubeconfig", "namespace": "kubeflow-system"},
            "data": {"kubeconfig": base64.b64encode(Path(worker_dc.kubeconfig).read_bytes()).decode()}})
        for i in range(args.placement_workers):
            await manager.create(r.MULTIKUEUE_CLUSTER, None, {
                "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster",
                "metadata": {"name": f"worker-{i + 1}"},
                "spec": {"kubeConfig": {"locationType": "Secret", "location": "shared-kubeconfig"}}})
        room = {"cpu": "100000", "memory": "100000Gi", "pods": "1000000"}
        node = await worker.create(r.NODE, None, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "big"}})
        node["status"] = {"allocatable": room, "capacity": room, "conditions": [{"type": "Ready", "status": "True"}]}
        await worker.replace_status(r.NODE, node)
        await worker.create(r.NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for i in range(args.fleet_pods):  # pods of the fleet: placement must not scan them
            await worker.create(r.POD, NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"fleet-{i}", "namespace": NAMESPACE,
                                                                "labels": {"jobset.sigs.k8s.io/jobset-name": f"j{i}"}},
                "spec": {"containers": [{"name": "c", "image": "busybox",
                                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}})
        nc = await nats_client.connect(nats.url)
        js = nc.jetstream()
        await ensure_topology(js)
        slots = SlotLedger(await js.key_value(SLOTS_BUCKET), "manager")
        registry = WorkerRegistry(manager, "kubeflow-system", lost_timeout_s=900)
        await registry.refresh()
        # A worker is a candidate once its capacity watches listed its Nodes and Pods.
        await wait_until(f"{args.placement_workers} workers Active with their capacity listed",
                         lambda: len(registry.active()) == args.placement_workers, 120,
                         progress=lambda: f"{len(registry.active())} ready; " + "; ".join(
                             f"{w.name}: {w.message}" for w in registry.workers.values() if w not in registry.active()))
        dispatcher = Dispatcher(None, manager, "manager", registry, slots)
        await dispatcher.resync()  # as a live dispatcher's first pass: every worker's slots read once
        holds: list[float] = []
        real_reserve = slots.reserve

        async def timed_reserve(*a, **kw):
            began = time.perf_counter()
            try:
                return await real_reserve(*a, **kw)
            finally:
                holds.append(time.perf_counter() - began)

        slots.reserve = timed_reserve
        whole: list[float] = []
        trainjobs = [await manager.create(r.TRAINJOB, NAMESPACE, {
            **trainjob(f"place-{i}", True), "spec": {"runtimeRef": {"name": "bench-torch"},
                                                     "managedBy": MANAGED_BY}}) for i in range(args.placements)]
        dispatcher.placement_seconds.clear()
        for tj in trainjobs:
            began = time.perf_counter()
            _, chosen = await dispatcher._place(tj)
            whole.append(time.perf_counter() - began)
            if chosen is None:
                raise SystemExit(f"error: {tj['metadata']['name']} not placed: {await dispatcher.manager.get(r.TRAINJOB, NAMESPACE, tj['metadata']['name'])}")
        decisions = dispatcher.placement_seconds[-args.placements:]
        used = {}
        for w in registry.active():
            used[w.name] = len(slots.cached(w.name).holds)
        await nc.close()
        await registry.close()
        await manager.close()
        await worker.close()
        ms = lambda values, q: percentile([v * 1000 for v in values], q)  # noqa: E731
        with_hold = [d + h for d, h in zip(decisions, holds)]
        return {"workers": args.placement_workers, "fleet_pods": args.fleet_pods, "placements": args.placements,
                "decision_p50_ms": round(ms(decisions, 0.5), 3), "decision_p99_ms": round(ms(decisions, 0.99), 3),
                "with_hold_p50_ms": round(ms(with_hold, 0.5), 3), "with_hold_p99_ms": round(ms(with_hold, 0.99), 3),
                "whole_p50_ms": round(ms(whole, 0.5), 3), "whole_p99_ms": round(ms(whole, 0.99), 3),
                "spread_min": min(used.values()), "spread_max": max(used.values())}
    finally:
        worker_dc.stop()
        manager_dc.stop()
        nats.stop()


async def delegated(args, stack, limits: LimitedReplicas,
                    limited: list[str]) -> tuple[list[float], float, dict[str, float], dict]:
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

    pids = {name: child_processes(info["pid"]) for name, info in stack.state["children"].items()}
    cpu_before = {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}
    limits_before = limits.snapshot(limited)
    names = [f"sustained-{i}" for i in range(args.sustained)]
    start = time.perf_counter()
    created = await as_fast_as_possible([trainjob(n, True) for n in names], args.concurrency, create)
    done = await wait_all(watches, [f"{NAMESPACE}/{n}" for n in names], timeout=600)
    wall = time.perf_counter() - start
    rate = len(done) / wall
    shares = limits.shares(limits_before, wall)
    print(offered_taken(args.sustained, created, wall), flush=True)
    cpu = {name: (sum(cpu_seconds(pid) for pid in group) - cpu_before[name]) * 1000 / args.sustained
           for name, group in pids.items()}
    for watch in watches:
        await watch.stop()
    for endpoint in endpoints.values():
        await endpoint.client.aclose()
    return latencies, rate, cpu, shares


def api_workers_args(args) -> list[str]:
    """``devcluster up`` / ``trainyard up`` flags for --api-workers (none: their default)."""
    return ["--api-workers", str(args.api_workers)] if args.api_workers else []


def child_processes(pid: int) -> list[int]:
    """A stack child's processes: itself, and for a devcluster with API workers those workers
    (found from its --data-dir), so that its CPU is the sum of them all."""
    try:
        argv = [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return [pid]
    if "devcluster" not in argv or "--data-dir" not in argv:
        return [pid]
    return [pid, *api_worker_pids(Path(argv[argv.index("--data-dir") + 1]))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked: ``dispatchers`` a list of counts, ``limit_roles`` a tuple."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sustained", type=int, default=200, help="TrainJobs in each sustained run")
    parser.add_argument("--paced-seconds", type=float, default=5.0, help="seconds of the 10/s paced run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--dispatchers", "--replicas", dest="dispatchers", default="", metavar="COUNTS",
                        help="dispatcher replica counts to compare, e.g. 1,2,4: a table (default: none)")
    parser.add_argument("--placement-workers", type=int, default=20,
                        help="workers registered in the placement run (0: skip it)")
    parser.add_argument("--placements", type=int, default=300, help="TrainJobs placed in the placement run")
    parser.add_argument("--fleet-pods", type=int, default=0, help="pods on the placement run's worker")
    parser.add_argument("--skip-single", action="store_true",
                        help="skip the two single-cluster runs (no delegated/single ratio)")
    parser.add_argument("--only", choices=["placement", "delegated"], default=None,
                        help="run only the placement run, or only the delegated (multi-cluster) runs")
    parser.add_argument("--api-workers", type=int, default=0, metavar="N",
                        help="every devcluster (single-cluster, manager, workers, placement run) with N API worker processes, "
                             "as `trainyard up --api-workers N`; CPU per devcluster sums its processes "
                             "(default: the devcluster's own, one process on <= 4 cores)")
    add_limit_arguments(parser, "dispatcher", "the roles whose processes are limited in the multi-cluster stack: "
                        "dispatcher (the stack's and every extra replica) or a service (its process on every "
                        "cluster); the single-cluster and placement runs are not limited")
    args = parser.parse_args(argv)
    if args.api_workers < 0 or args.api_workers > 64:
        parser.error(f"--api-workers: must be between 1 and 64 (0: the devcluster's default), got {args.api_workers}")
    args.dispatchers = parse_dispatchers(args.dispatchers)
    args.limit_roles = parse_limit(args.cpu_limit, args.limit_roles, ROLES)
    return args


def main() -> int:
    args = parse_args()
    limits = LimitedReplicas(args.cpu_limit)  # without root or a cpu controller: ends here, nothing started
    try:
        return run(args, limits)
    finally:
        limits.close()


def parse_dispatchers(spec: str) -> list[int]:
    """``1,2,4`` -> [1, 2, 4]; ends the run with a message for anything else."""
    try:
        counts = [int(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: --dispatchers: expected counts such as 1,2,4, got {spec!r}") from None
    if any(v < 1 for v in counts):
        raise SystemExit(f"error: --dispatchers: every count must be at least 1, got {spec!r}")
    return counts


def run(args, limits: LimitedReplicas) -> int:
    limit = (f"; in the multi-cluster stack each process of {', '.join(args.limit_roles)} limited to "
             f"{args.cpu_limit:g} CPU ({limits.describe()})" if limits else "")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} (/proc/loadavg {loadavg()}); "
          f"devclusters "
          f"{f'--api-workers {args.api_workers}' if args.api_workers else 'at their default (one process on <= 4 cores)'}"
          f"{limit}", flush=True)
    if args.only != "delegated" and args.placement_workers > 0:
        figures = asyncio.run(placement_bench(args))
        print(f"placement with {figures['workers']} workers ({figures['fleet_pods']} pods in the fleet, "
              f"{figures['placements']} placements): decision p50 {figures['decision_p50_ms']} ms, "
              f"p99 {figures['decision_p99_ms']} ms; with the shared slot hold p50 {figures['with_hold_p50_ms']} ms, "
              f"p99 {figures['with_hold_p99_ms']} ms; whole placement incl. the manager write "
              f"p50 {figures['whole_p50_ms']} ms, p99 {figures['whole_p99_ms']} ms; "
              f"TrainJobs per worker {figures['spread_min']}..{figures['spread_max']}", flush=True)
        print(json.dumps({"placement": figures}), flush=True)
        if args.only == "placement":
            return 0
    single = single_up = float("nan")
    if not args.skip_single:
        single = asyncio.run(single_cluster(args))
        print(f"single-cluster sustained: {single:.1f} TrainJobs/s (bench/e2e.py's setup: devcluster without data "
              f"plane; create -> JobSet applied, {args.sustained} TrainJobs)")
        up_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-up-")) / "data"
        one = start_stack(up_dir, *api_workers_args(args), timeout=300)
        try:
            single_up = asyncio.run(single_cluster_up(args, one))
        finally:
            one.stop()
            one.kill()
        print(f"single-cluster sustained on `trainyard up` (data plane on, as each worker): {single_up:.1f} "
              "TrainJobs/s")
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-mc-")) / "data"
    stack = start_stack(data_dir, "--workers", "2", *api_workers_args(args), timeout=300)
    rows = []
    try:
        limited = limit_stack(stack, limits, args.limit_roles) if limits else []
        latencies, rate, cpu, shares = asyncio.run(delegated(args, stack, limits, limited))
        if args.dispatchers:
            print("delegated sustained by dispatcher replicas (2 workers):", flush=True)
            rows = asyncio.run(replica_rows(args, stack, data_dir.parent, limits, limited))
    finally:
        stack.stop()
        stack.kill()
    print(f"delegated at 10/s: p50 {percentile(latencies, 0.5):.1f} ms, p99 {percentile(latencies, 0.99):.1f} ms "
          f"(n={len(latencies)}; manager create -> JobSet on a worker)")
    print(f"delegated sustained: {rate:.1f} TrainJobs/s with 2 workers ({args.sustained} TrainJobs, "
          f"concurrency {args.concurrency}); ratio delegated/single-cluster = {rate / single:.2f} "
          f"(vs `trainyard up` single cluster: {rate / single_up:.2f})")
    busiest = sorted(cpu.items(), key=lambda item: -item[1])
    print("CPU ms per delegated TrainJob" + (f" (each devcluster: its store process + {args.api_workers} API workers)"
                                              if args.api_workers > 1 else "") + ": "
          + ", ".join(f"{name} {value:.1f}" for name, value in busiest) + f"; total {sum(cpu.values()):.1f}")
    for line in limit_lines(shares, args.cpu_limit):
        print(line)
    if rows:
        limited_to = f", each dispatcher limited to {args.cpu_limit:g} CPU" if "dispatcher" in args.limit_roles \
            and args.cpu_limit else ""
        print(f"\ndelegated TrainJobs/s by dispatcher replicas (2 workers, concurrency {args.concurrency}{limited_to}; "
              f"{os.cpu_count()} CPUs, load average now {loadavg()})")
        for line in dispatcher_table(rows, args.sustained, args.cpu_limit, os.cpu_count() or 1):
            print(line)
    print(json.dumps({"single_rate": None if single != single else round(single, 1),
                      "single_up_rate": None if single_up != single_up else round(single_up, 1),
                      "delegated_rate": round(rate, 1),
                      "p50_ms_at_10": round(percentile(latencies, 0.5), 1),
                      "p99_ms_at_10": round(percentile(latencies, 0.99), 1),
                      "cpu_limit": args.cpu_limit or None,
                      "by_dispatchers": {str(row["dispatchers"]): {
                          "rate": round(row["rate"], 1), "dispatcher_cpu_ms": round(row["dispatcher_cpu_ms"], 2),
                          "offered": round(args.sustained / row["created_s"], 1),
                          "stack_cpu_pct": round(row["stack_cpu_pct"]),
                          "limits": {name: [round(share, 3), round(throttled, 3)]
                                     for name, (share, throttled) in row["limits"].items()}}
                          for row in rows}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
