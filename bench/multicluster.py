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
   - with --replicas 1,2,4: the sustained run again with that many dispatcher processes
     (the stack's own plus extra ones started like it), delegated TrainJobs/s and the
     dispatchers' CPU ms per TrainJob for each.
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
           [--replicas 1,2,4] [--placement-workers 20 --placements 300 --fleet-pods 0]
           [--only placement|delegated] [--skip-single] [--api-workers N]
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

from e2e import (  # noqa: E402
    RUNTIME, SERVICES, JobSetWatch, api_worker_pids, as_fast_as_possible, cpu_seconds, percentile, start_service,
    wait_ready,
)
from fixtures.devcluster import start_devcluster  # noqa: E402
from fixtures.nats import NatsServer  # noqa: E402
from fixtures.stack import start_stack  # noqa: E402
from waiting import missing, stop_process, wait_until  # noqa: E402

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


def start_extra_dispatcher(stack, workdir: Path, index: int):
    """One more dispatcher replica, started as the stack started its own (same argv and
    environment, so the same identity and flags), on its own health port."""
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


def partitions_owned(port: int) -> int | None:
    """The partitions a dispatcher serves now (its trainyard_partitions_owned gauge); None
    when it does not say (a release before home replicas)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith('trainyard_partitions_owned{role="dispatcher"}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return None


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


async def replica_rows(args, stack, workdir: Path) -> list[tuple[int, float, float]]:
    """(dispatchers, delegated TrainJobs/s, dispatchers' CPU ms per TrainJob) for each count."""
    clusters = stack.state["clusters"]
    endpoints = {name: Endpoint(Path(info["kubeconfig"]), args.concurrency) for name, info in clusters.items()}
    manager = endpoints["manager"].client
    watches = [JobSetWatch(endpoints[name].client) for name in clusters if name != "manager"]
    for watch in watches:
        await watch.start()

    async def create(doc):
        (await manager.post(TRAINJOBS.format(ns=NAMESPACE), json=doc)).raise_for_status()

    extras: list = []
    rows = []
    try:
        for count in args.replicas:
            while len(extras) < count - 1:
                extras.append(await asyncio.to_thread(start_extra_dispatcher, stack, workdir, len(extras) + 1))
            pids = [stack.state["children"]["dispatcher"]["pid"], *(p.pid for p, _ in extras[:count - 1])]
            await wait_split([stack.state["ports"]["dispatcher"], *(port for _, port in extras[:count - 1])])
            warm = [f"warm-r{count}-{i}" for i in range(2 * count)]  # each replica has placed
            for name in warm:
                await create(trainjob(name, True))
            await wait_all(watches, [f"{NAMESPACE}/{n}" for n in warm], timeout=120)
            cpu_before = sum(cpu_seconds(pid) for pid in pids)
            names = [f"r{count}-{i}" for i in range(args.sustained)]
            start = time.perf_counter()
            await as_fast_as_possible([trainjob(n, True) for n in names], args.concurrency, create)
            done = await wait_all(watches, [f"{NAMESPACE}/{n}" for n in names], timeout=600)
            rate = len(done) / (time.perf_counter() - start)
            cpu = (sum(cpu_seconds(pid) for pid in pids) - cpu_before) * 1000 / args.sustained
            rows.append((count, rate, cpu))
            print(f"  {count} dispatcher(s): {rate:.1f} delegated TrainJobs/s, dispatchers {cpu:.1f} CPU ms "
                  f"per TrainJob (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        for proc, _ in extras:
            stop_process(proc)
        for watch in watches:
            await watch.stop()
        for endpoint in endpoints.values():
            await endpoint.client.aclose()
    return rows


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

    pids = {name: child_processes(info["pid"]) for name, info in stack.state["children"].items()}
    cpu_before = {name: sum(cpu_seconds(pid) for pid in group) for name, group in pids.items()}
    names = [f"sustained-{i}" for i in range(args.sustained)]
    start = time.perf_counter()
    await as_fast_as_possible([trainjob(n, True) for n in names], args.concurrency, create)
    done = await wait_all(watches, [f"{NAMESPACE}/{n}" for n in names], timeout=600)
    rate = len(done) / (time.perf_counter() - start)
    cpu = {name: (sum(cpu_seconds(pid) for pid in group) - cpu_before[name]) * 1000 / args.sustained
           for name, group in pids.items()}
    for watch in watches:
        await watch.stop()
    for endpoint in endpoints.values():
        await endpoint.client.aclose()
    return latencies, rate, cpu


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sustained", type=int, default=200, help="TrainJobs in each sustained run")
    parser.add_argument("--paced-seconds", type=float, default=5.0, help="seconds of the 10/s paced run")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--replicas", default="", help="dispatcher counts to compare, e.g. 1,2,4 (default: none)")
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
    args = parser.parse_args()
    if args.api_workers < 0 or args.api_workers > 64:
        parser.error(f"--api-workers: must be between 1 and 64 (0: the devcluster's default), got {args.api_workers}")
    try:
        args.replicas = [int(v) for v in args.replicas.split(",") if v.strip()]
    except ValueError:
        parser.error(f"--replicas: expected counts such as 1,2,4, got {args.replicas!r}")
    if any(v < 1 for v in args.replicas):
        parser.error("--replicas: every count must be at least 1")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; devclusters "
          f"{f'--api-workers {args.api_workers}' if args.api_workers else 'at their default (one process on <= 4 cores)'}")
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
        latencies, rate, cpu = asyncio.run(delegated(args, stack))
        if args.replicas:
            print("delegated sustained by dispatcher replicas (2 workers):", flush=True)
            rows = asyncio.run(replica_rows(args, stack, data_dir.parent))
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
    print(json.dumps({"single_rate": None if single != single else round(single, 1),
                      "single_up_rate": None if single_up != single_up else round(single_up, 1),
                      "delegated_rate": round(rate, 1),
                      "p50_ms_at_10": round(percentile(latencies, 0.5), 1),
                      "p99_ms_at_10": round(percentile(latencies, 0.99), 1),
                      "by_dispatchers": {str(n): {"rate": round(v, 1), "dispatcher_cpu_ms": round(c, 2)}
                                         for n, v, c in rows}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
