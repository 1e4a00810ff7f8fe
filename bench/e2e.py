"""End-to-end benchmark: TrainJob create -> JobSet applied, through the four services.

Starts a real nats-server, a devcluster and the four services (one replica each), then:
1. paced bursts at 20, 50 and 100 TrainJobs/s: latency from sending the create to the JobSet's
   ADDED event on a watch (p50/p99);
2. sustained throughput: TrainJobs created as fast as the API server takes them, until every
   JobSet exists (TrainJobs/s);
3. the same run's raw devcluster server-side-apply rate for JobSets (no trainyard in the path),
   and the ratio sustained / raw.

The sustained and raw phases are driven by ``--generators`` load-generating processes (one
in-process generator costs ~7 ms of CPU per create and would be the limit). Around the sustained
run it prints CPU per TrainJob and CPU % of every process (which one saturates), and per
TrainJob: NATS messages per service (nats-server's /connz), KV round trips per service and
bucket (``trainyard_kv_operations_total``) and API requests by verb and resource (devcluster's
``apiserver_request_total``). ``--profile DIR`` records every Python process with py-spy during
the sustained run (and the devcluster during the raw phase) and prints its top frames. ``--replicas planner=4,applier=4`` runs that many
replicas of those services; ``--table planner,applier`` runs the sustained (and raw) phases with
1, 2, 4 and 8 replicas (``--counts``) of the named services and prints a table: throughput, CPU
per TrainJob of each service, KV round trips and NATS messages per TrainJob, the busiest
process, and the targets (TrainJobs/s at 2, 4 and 8 replicas >= 1.9x, 3.6x and 6.5x one;
net CPU per TrainJob of each service at 4 and 8 replicas <= 1.1x and 1.2x its 1-replica figure;
devcluster, nats-server and watcher each below 70 % of a core). Before the sustained run it waits until every replica holds its share of the bus
partitions (docs/bus.md), then measures each process's idle CPU per second (``--idle``, 5 s) and
prints per service the fixed part (idle ms/s x the run's seconds, per TrainJob) and the rest.
``--nats-cluster 3`` runs the bus on a local 3-node JetStream cluster
with 3 copies of every stream and bucket, as ``trainyard up --nats-cluster 3`` (and deploy/)
does; nats-server's CPU and the messages per service are then summed over the nodes.
``--api-workers N`` runs the devcluster with N API worker processes over its store process
(``trainyard devcluster up --api-workers N``), so that the API server need not be the limit:
the devcluster's CPU is then the sum of its processes (``devcluster-store``,
``devcluster-api-1..N``), and every run and table row says which process saturates (one at
>= 85 % of a core: an API worker, the store process, a service) or that none does.

Usage: .venv/bin/python bench/e2e.py [--duration 3] [--sustained 300] [--concurrency 16]
       [--generators 4] [--replicas planner=2,...] [--profile DIR] [--skip-paced] [--table planner,...]
       [--nats-cluster 3] [--api-workers N]
       .venv/bin/python bench/e2e.py --raw-only [--sustained 2000] [--rounds 2] [--profile DIR]
       [--api-workers 1,2,4]
       (the raw devcluster SSA phase alone, on a devcluster without services; --api-workers: a table
       of one devcluster per API worker count; it ends with one line per worker count:
       "devcluster CPU per JobSet apply, N API workers: <each round> ms (median M ms)")
Prints figures; asserts nothing (targets: p50 < 50 ms, p99 < 250 ms at 100/s; ratio >= 0.8).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixtures.devcluster import start_devcluster  # noqa: E402
from fixtures.nats import NatsServer, free_port  # noqa: E402

import httpx  # noqa: E402

from trainyard.roles import CLUSTER_ROLES  # noqa: E402

from waiting import SAY_EVERY_S, GaveUp, missing, say, wait_until  # noqa: E402  (bench/)
from cpu_quota import (  # noqa: E402  (bench/)
    LimitedReplicas, add_arguments as add_limit_arguments, limit_lines, limit_shares, limited_saturation,
    parse_limit,
)

SERVICES = CLUSTER_ROLES
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "bench-torch"},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                 "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}}}]}}},
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def start_service(name: str, kubeconfig: Path, nats_url: str, workdir: Path, replica: int = 0,
                  webhook_port: int = 0) -> subprocess.Popen:
    """One replica. A planner with ``webhook_port`` serves admission behind the webhook Service
    (one EndpointSlice per replica, as `trainyard up` and deploy/ run it), so the API server
    spreads admission calls over every replica; without, it registers its own URL."""
    log = open(workdir / f"{name}-{replica}.log", "ab")
    args = [sys.executable, "-m", "trainyard.cli.main", name, "--kubeconfig", str(kubeconfig),
            "--nats-url", nats_url, "--http-port", "0", "--log-level", "warning"]
    if name == "planner" and webhook_port:
        from trainyard.supervisor import manifests

        args += ["--webhook-port", str(webhook_port), "--webhook-service", manifests.WEBHOOK_SERVICE,
                 "--webhook-namespace", manifests.SYSTEM_NAMESPACE, "--webhook-drain", "0"]
    elif name == "planner":
        args += ["--webhook-port", "0", "--webhook-namespace", "trainyard-system"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True)
    log.close()
    return proc


def wait_ready(proc: subprocess.Popen, name: str, budget_s: float = 120.0) -> int:
    """Waits for the service's /readyz (saying so every few seconds); returns its HTTP port.
    Ends the run (GaveUp) when the service exits or is not ready within ``budget_s``."""
    line = proc.stdout.readline()
    if ":" not in line:
        raise GaveUp(f"error: {name} exited with {proc.wait()} before listening (see its log)")
    port = int(line.rsplit(":", 1)[1])
    began = time.monotonic()
    next_say = began + SAY_EVERY_S
    while True:
        if proc.poll() is not None:
            raise GaveUp(f"error: {name} exited with {proc.returncode} while starting (see its log)")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return port
        except httpx.HTTPError:
            pass
        now = time.monotonic()
        if now - began > budget_s:
            raise GaveUp(f"error: gave up after {budget_s:g}s waiting for {name} to be ready (/readyz on {port})")
        if now >= next_say:
            say(f"waiting {now - began:.0f}s of {budget_s:g}s for {name} to be ready (/readyz on {port})")
            next_say = now + SAY_EVERY_S
        time.sleep(0.1)


def parse_replicas(spec: str) -> dict[str, int]:
    """``planner=4,applier=2`` -> replicas per service (1 for the ones not named)."""
    counts = {name: 1 for name in SERVICES}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, value = part.partition("=")
        if name not in counts:
            raise SystemExit(f"error: --replicas: unknown service {name!r} (one of {', '.join(SERVICES)})")
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"error: --replicas: {name} needs a count >= 1, got {value!r}")
        counts[name] = int(value)
    return counts


class JobSetWatch:
    """Records the arrival time of each JobSet ADDED (``seen``) and DELETED (``gone``) event
    (one watch over all namespaces)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self.seen: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self._new = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        listing = (await self._client.get("/apis/jobset.x-k8s.io/v1alpha2/jobsets")).json()
        rv = listing["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        params = {"watch": "true", "resourceVersion": rv, "timeoutSeconds": "3600"}
        async with self._client.stream("GET", "/apis/jobset.x-k8s.io/v1alpha2/jobsets", params=params,
                                       timeout=None) as response:
            async for line in response.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
                if event["type"] in ("ADDED", "DELETED"):
                    meta = event["object"]["metadata"]
                    into = self.seen if event["type"] == "ADDED" else self.gone
                    into.setdefault(f"{meta['namespace']}/{meta['name']}", time.perf_counter())
                    self._new.set()

    async def wait_all(self, keys: list[str], timeout: float, deleted: bool = False) -> bool:
        """Until every key's JobSet was ADDED (DELETED); says how far it got every few seconds and
        ends the run (GaveUp, exit 1) after ``timeout`` seconds."""
        into = self.gone if deleted else self.seen
        what = f"{len(keys)} JobSet{'s' if len(keys) != 1 else ''} to be {'deleted' if deleted else 'created'}"
        await wait_until(what, lambda: all(k in into for k in keys), timeout,
                         progress=lambda: missing(keys, into), wake=self._new)
        return True

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()


def trainjob(ns: str, name: str, suspend: bool = False) -> dict:
    spec: dict = {"runtimeRef": {"name": "bench-torch"}}
    if suspend:
        spec["suspend"] = True
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


async def paced(client: httpx.AsyncClient, watch: JobSetWatch, ns: str, rate: int, duration: float
                ) -> list[float]:
    count = int(rate * duration)
    sent: dict[str, float] = {}
    created: dict[str, float] = {}

    async def create(i: int) -> None:
        name = f"r{rate}-{i}"
        sent[f"{ns}/{name}"] = time.perf_counter()
        response = await client.post(TRAINJOBS.format(ns=ns), json=trainjob(ns, name))
        response.raise_for_status()
        created[f"{ns}/{name}"] = time.perf_counter()

    start = time.perf_counter()
    tasks = []
    for i in range(count):
        target = start + i / rate
        delay = target - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(create(i)))
    await asyncio.gather(*tasks)
    await watch.wait_all(list(sent), timeout=120)
    AFTER_CREATE_MS[:] = [(watch.seen[k] - t) * 1000 for k, t in created.items() if k in watch.seen]
    return [(watch.seen[k] - t) * 1000 for k, t in sent.items() if k in watch.seen]


AFTER_CREATE_MS: list[float] = []


CREATE_MS: list[float] = []


async def one(client: httpx.AsyncClient, watch: JobSetWatch, ns: str, name: str) -> list[float]:
    sent = time.perf_counter()
    (await client.post(TRAINJOBS.format(ns=ns), json=trainjob(ns, name))).raise_for_status()
    CREATE_MS.append((time.perf_counter() - sent) * 1000)
    await watch.wait_all([f"{ns}/{name}"], timeout=60)
    return [(watch.seen[f"{ns}/{name}"] - sent) * 1000]


async def as_fast_as_possible(docs: list, concurrency: int, send, rate: float = 0.0) -> float:
    """Sends every item of ``docs`` with ``concurrency`` workers; returns the seconds it took.
    With ``rate`` (items per second) item i is not sent before i / rate seconds from the start:
    an offered load, the same whatever the server does with it (as long as it keeps up)."""
    queue: asyncio.Queue = asyncio.Queue()
    for index, doc in enumerate(docs):
        queue.put_nowait((index, doc))

    async def worker() -> None:
        while not queue.empty():
            index, doc = queue.get_nowait()
            if rate > 0:
                delay = start + index / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await send(doc)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU time of one thread of a process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ------------------------------------------------------------------ load-generating processes

def _generator_main(kind: str, url: str, token: str, ca: str, ns: str, items: list, spec: dict | None,
                    concurrency: int, ready, go, results, rate: float = 0.0) -> None:
    asyncio.run(_generate(kind, url, token, ca, ns, items, spec, concurrency, ready, go, results, rate))


async def _generate(kind, url, token, ca, ns, items, spec, concurrency, ready, go, results, rate=0.0) -> None:
    """aiohttp with every body encoded before the clock starts: the generator's own cost per
    request (printed) has to stay well below the server's, or on a shared machine it measures
    itself (httpx cost 1.0 ms of client CPU per 2-KiB create against 0.27-0.33 ms for aiohttp,
    measured one request at a time against devcluster)."""
    import aiohttp

    context = ssl.create_default_context(cafile=ca)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency + 2, enable_cleanup_closed=True)
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=connector, headers=auth,
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        # Open every connection before the clock starts (TLS handshakes are not the bench).
        async def warm() -> None:
            async with session.get(url + "/version") as response:
                await response.read()

        await asyncio.gather(*(warm() for _ in range(concurrency)))

        async def send(method: str, path: str, body: bytes | None, content_type: str | None,
                       missing_ok: bool = False) -> None:
            headers = {"Content-Type": content_type} if content_type else None
            async with session.request(method, url + path, data=body, headers=headers) as response:
                await response.read()
                if response.status >= 400 and not (missing_ok and response.status == 404):
                    raise RuntimeError(f"{method} {path}: HTTP {response.status}")

        collection = (JOBSETS if kind == "apply" else TRAINJOBS).format(ns=ns)
        if kind in ("create", "create-suspended"):
            work = [("POST", collection, json.dumps(trainjob(ns, name, suspend=kind == "create-suspended")).encode(),
                     "application/json", False) for name in items]
        elif kind == "delete":
            work = [("DELETE", f"{collection}/{name}", None, None, True) for name in items]
        else:
            work = [("PATCH", f"{collection}/{name}?fieldManager=trainer&force=true", json.dumps(
                {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                 "metadata": {"name": name, "namespace": ns}, "spec": spec}).encode(),
                "application/apply-patch+yaml", False) for name in items]

        ready.put(os.getpid())
        await asyncio.get_running_loop().run_in_executor(None, go.wait)
        cpu_before = time.process_time()
        elapsed = await as_fast_as_possible(work, concurrency, lambda item: send(*item), rate)
        results.put((elapsed, time.process_time() - cpu_before))


class Generators:
    """``count`` processes sending ``items`` (split round robin) as fast as the server takes them,
    or, with ``rate``, at that many per second over all of them."""

    def __init__(self, cluster, kind: str, ns: str, items: list[str], count: int, concurrency: int,
                 spec: dict | None = None, rate: float = 0.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._ready, self._results, self._go = ctx.Queue(), ctx.Queue(), ctx.Event()
        per = max(1, concurrency // count)
        self.procs = [ctx.Process(target=_generator_main, daemon=True, args=(
            kind, cluster.url, cluster.token, str(cluster.ca_cert), ns, items[i::count], spec, per,
            self._ready, self._go, self._results, rate / count)) for i in range(count)]

    async def start(self) -> None:
        """Starts the processes and waits until each has its connections open."""
        for proc in self.procs:
            proc.start()
        loop = asyncio.get_running_loop()
        for _ in self.procs:
            await loop.run_in_executor(None, self._ready.get, True, 120)

    def go(self) -> None:
        self._go.set()

    async def finish(self) -> None:
        """Waits for every process; ``cpu_s`` then holds their CPU seconds while sending."""
        loop = asyncio.get_running_loop()
        self.cpu_s = 0.0
        try:
            for proc in self.procs:
                _, cpu = await loop.run_in_executor(None, self._results.get, True, 600)
                self.cpu_s += cpu
        finally:
            for proc in self.procs:
                proc.join(timeout=10)
                if proc.is_alive():
                    proc.kill()


# ------------------------------------------------------------------ counters

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$')


def prometheus_samples(text: str, name: str) -> dict[tuple, float]:
    """Samples of one metric: {sorted label tuple: value}."""
    out: dict[tuple, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name:
            labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")))
            out[labels] = out.get(labels, 0.0) + float(match.group(3))
    return out


# Per service, the counter of what a replica did once per TrainJob of its partitions: the
# replicas' shares of a run's TrainJobs (metric, label, value).
HANDLED = {"planner": ("trainyard_plans_total", "result", "published"),
           "applier": ("trainyard_applies_total", "outcome", "applied"),
           "status": ("trainyard_status_writes_total", "result", "written")}


def share_lines(before: dict, after: dict) -> list[str]:
    """Each partitioned service's replicas' shares of the run's TrainJobs, and the busiest one's
    share over an even one: a run's TrainJobs hash unevenly onto the partitions (300 of them onto
    16: a few percent at 2 replicas, a fifth at 8), and the busiest replica's share bounds the
    run's rate however well the rest scales."""
    lines = []
    for service in HANDLED:
        counts = [after["handled"].get(key, 0.0) - before["handled"].get(key, 0.0)
                  for key in sorted(k for k in after["handled"] if k[0] == service)]
        total = sum(counts)
        if len(counts) < 2 or total <= 0:
            continue
        busiest = max(counts) * len(counts) / total
        lines.append(f"{service} replicas' shares of the TrainJobs: {', '.join(f'{c:.0f}' for c in counts)}; "
                     f"the busiest over an even share {busiest:.2f} (a rate ceiling of {len(counts) / busiest:.2f}x "
                     f"one replica's)")
    return lines


class Counters:
    """What one sustained run costs per TrainJob: NATS messages, KV round trips, API requests."""

    def __init__(self, client: httpx.AsyncClient, ports: dict[str, list[int]], monitor_ports: list[int]) -> None:
        self._client = client
        self._ports = ports
        self._monitors = monitor_ports  # every NATS node's: a client's connection is on one of them

    async def snapshot(self) -> dict:
        snap: dict = {"nats": {}, "kv": {}, "api": {}, "published": {}, "timing": {}, "handled": {}}
        async with httpx.AsyncClient(timeout=10) as plain:
            for monitor in self._monitors:
                conns = (await plain.get(f"http://127.0.0.1:{monitor}/connz", params={"limit": 4096})).json()
                for conn in conns.get("connections") or []:
                    name = conn.get("name") or "?"
                    got = snap["nats"].setdefault(name, [0, 0])
                    got[0] += conn.get("in_msgs", 0)
                    got[1] += conn.get("out_msgs", 0)
            for service, ports in self._ports.items():
                for port in ports:
                    text = (await plain.get(f"http://127.0.0.1:{port}/metrics")).text
                    for labels, value in prometheus_samples(text, "trainyard_kv_operations_total").items():
                        key = (service, dict(labels)["bucket"], dict(labels)["op"])
                        snap["kv"][key] = snap["kv"].get(key, 0) + value
                    if service in HANDLED:  # what this replica did for its share of the TrainJobs
                        metric, label, value_of = HANDLED[service]
                        snap["handled"][(service, port)] = sum(
                            value for labels, value in prometheus_samples(text, metric).items()
                            if dict(labels).get(label) == value_of)
                    for labels, value in prometheus_samples(text, "trainyard_published_messages_total").items():
                        key = (service, dict(labels)["stream"])
                        snap["published"][key] = snap["published"].get(key, 0) + value
                    for part in ("sum", "count"):  # the TrainJob admission webhook, all replicas
                        for labels, value in prometheus_samples(
                                text, f"controller_runtime_webhook_latency_seconds_{part}").items():
                            if dict(labels).get("webhook", "").endswith("-trainjob"):
                                key = ("webhook", part)
                                snap["timing"][key] = snap["timing"].get(key, 0) + value
        text = (await self._client.get("/metrics")).text  # the whole server's, API workers too
        for part in ("sum", "count"):
            for labels, value in prometheus_samples(text, f"apiserver_request_duration_seconds_{part}").items():
                d = dict(labels)
                if d.get("verb") == "POST" and d.get("resource") == "trainjobs" and not d.get("subresource"):
                    snap["timing"][("create", part)] = snap["timing"].get(("create", part), 0) + value
        for labels, value in prometheus_samples(text, "apiserver_request_total").items():
            d = dict(labels)
            resource = d["resource"] + (f"/{d['subresource']}" if d.get("subresource") else "")
            key = (d["verb"], resource)
            snap["api"][key] = snap["api"].get(key, 0) + value
        return snap

    @staticmethod
    def per(before: dict, after: dict, section: str, count: int) -> dict:
        """``section``'s counts per TrainJob between two snapshots."""
        out = {}
        for key in set(before[section]) | set(after[section]):
            a, b = after[section].get(key), before[section].get(key)
            if isinstance(a, list):
                b = b or [0, 0]
                out[key] = [(a[0] - b[0]) / count, (a[1] - b[1]) / count]
            elif (a or 0) - (b or 0):
                out[key] = ((a or 0) - (b or 0)) / count
        return out

    @staticmethod
    def report(before: dict, after: dict, count: int) -> list[str]:
        def per(section: str) -> dict:
            keys = set(before[section]) | set(after[section])
            out = {}
            for key in keys:
                a, b = after[section].get(key), before[section].get(key)
                if isinstance(a, list):
                    b = b or [0, 0]
                    out[key] = [(a[0] - b[0]) / count, (a[1] - b[1]) / count]
                else:
                    delta = ((a or 0) - (b or 0)) / count
                    if delta:
                        out[key] = delta
            return out

        lines = []
        timing = {key: after["timing"].get(key, 0) - before["timing"].get(key, 0) for key in after["timing"]}
        means = {what: 1000 * timing.get((what, "sum"), 0) / timing[(what, "count")]
                 for what in ("create", "webhook") if timing.get((what, "count"))}
        if means:
            lines.append("  mean time of a TrainJob create in the API server: " + (
                f"{means['create']:.1f} ms" if "create" in means else "?") + ", of which the planner's webhook "
                "handler: " + (f"{means['webhook']:.1f} ms" if "webhook" in means else "?"))
        nats = per("nats")
        if nats:
            lines.append("  NATS messages client->server / server->client: " + ", ".join(
                f"{name} {v[0]:.1f}/{v[1]:.1f}" for name, v in sorted(nats.items()) if v[0] or v[1]))
        published = per("published")
        lines.append("  published: " + ", ".join(
            f"{svc} {stream} {v:.2f}" for (svc, stream), v in sorted(published.items())))
        kv = per("kv")
        for service in SERVICES:
            ops = {k: v for k, v in kv.items() if k[0] == service}
            if ops:
                lines.append(f"  KV round trips, {service} ({sum(ops.values()):.1f}): " + ", ".join(
                    f"{bucket} {op} {v:.2f}" for (_, bucket, op), v in sorted(ops.items())))
        api = per("api")
        if not api:
            lines.append("  API requests: not counted (each devcluster API worker counts its own, and a scrape "
                         "of the port reaches one of them)")
            return lines
        lines.append(f"  API requests ({sum(v for k, v in api.items() if k[0] != 'WATCH'):.1f}): " + ", ".join(
            f"{verb} {resource} {v:.2f}" for (verb, resource), v in sorted(api.items()) if verb != "WATCH"))
        return lines


# ------------------------------------------------------------------ profiling

def start_profiles(directory: Path, pids: dict[str, int]) -> list[tuple[str, subprocess.Popen, Path]]:
    spy = Path(sys.executable).parent / "py-spy"
    directory.mkdir(parents=True, exist_ok=True)
    running = []
    for name, pid in pids.items():
        if name.startswith("nats-server"):
            continue  # Go
        out = directory / f"{name}.txt"
        proc = subprocess.Popen([str(spy), "record", "--nonblocking", "--format", "raw", "--rate", "200",
                                 "-o", str(out), "-p", str(pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        running.append((name, proc, out))
    time.sleep(0.5)
    return running


def stop_profiles(running: list[tuple[str, subprocess.Popen, Path]], top: int = 12) -> None:
    for _, proc, _ in running:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGINT)
    for name, proc, out in running:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        if not out.exists():
            print(f"profile {name}: no samples (py-spy needs ptrace permission)")
            continue
        summarize_profile(name, out, top)


def _frame(text: str) -> str:
    """``func (path/to/file.py:12)`` -> ``func (file.py)``."""
    match = re.match(r"(.*) \((.*?):\d+\)$", text)
    if not match:
        return text
    path = match.group(2)
    short = "/".join(path.split("/")[-2:]) if "site-packages" in path or "/lib/python" in path else path.split("/")[-1]
    return f"{match.group(1)} ({short})"


def summarize_profile(name: str, path: Path, top: int) -> None:
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    if not total:
        print(f"profile {name}: no samples")
        return
    print(f"profile {name}: {total} samples ({path})")
    print("  self:      " + "; ".join(f"{100 * v / total:.0f}% {k}" for k, v in
                                      sorted(own.items(), key=lambda kv: -kv[1])[:top]))
    interesting = [(k, v) for k, v in inclusive.items() if v < total * 0.97]
    print("  inclusive: " + "; ".join(f"{100 * v / total:.0f}% {k}" for k, v in
                                      sorted(interesting, key=lambda kv: -kv[1])[:top]))


# ------------------------------------------------------------------ the bench

class Stack:
    """nats-server, a devcluster and the services (with replicas), for one bench."""

    def __init__(self, replicas: dict[str, int], workdir: Path, nats_nodes: int = 1, api_workers: int = 0,
                 cpu_limit: float = 0.0, limit_roles: tuple[str, ...] = ()) -> None:
        self.replicas = replicas
        self.workdir = workdir
        # --cpu-limit: each replica of limit_roles in a cgroup of its own with this many cores
        # (bench/cpu_quota.py), lifted while it starts and applied once the stack is ready.
        self.cpu_limit = cpu_limit
        self.limit_roles = limit_roles
        # Made first: without root or a cpu controller the run ends here, before anything starts.
        self.limits = LimitedReplicas(cpu_limit)  # replica name (process_names) -> its cgroup
        self.api_workers = api_workers  # 0: the devcluster's default (one process on <= 4 cores)
        self.monitor_ports = [free_port() for _ in range(nats_nodes)]
        if nats_nodes == 1:
            self.nodes = [NatsServer(workdir / "nats", monitor_port=self.monitor_ports[0])]
        else:
            # A local JetStream cluster as `trainyard up --nats-cluster N` runs it (its route
            # flags), every stream and bucket with that command's number of copies.
            from trainyard.bus.topology import REPLICAS_ENV, replicas_for_nodes
            from trainyard.supervisor.stack import nats_route_args

            routes = [free_port() for _ in range(nats_nodes)]
            self.nodes = [NatsServer(workdir / f"nats-{index}", monitor_port=self.monitor_ports[index - 1],
                                     extra_args=["--server_name", f"trainyard-{index}", *nats_route_args(index, routes)])
                          for index in range(1, nats_nodes + 1)]
            os.environ[REPLICAS_ENV] = str(replicas_for_nodes(nats_nodes))  # inherited by the services
        self.nats_url = ",".join(node.url for node in self.nodes)
        self.cluster = None
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.ports: dict[str, list[int]] = {}
        self.webhook_ports: list[int] = []

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        self.cluster = start_devcluster(self.workdir / "devcluster",
                                        ["--api-workers", str(self.api_workers)] if self.api_workers else [])
        self.cluster.kubectl("apply", "--server-side",  # every CRD file (not the kustomization)
                             *(arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml"))
                               for arg in ("-f", str(path))))
        webhook_ports = self.prepare_webhook_service(self.replicas["planner"])
        for name in SERVICES:
            for replica in range(self.replicas[name]):
                proc = start_service(name, self.cluster.kubeconfig, self.nats_url, self.workdir, replica,
                                     webhook_ports[replica] if name == "planner" else 0)
                self.procs.append((name, proc))
                if name in self.limit_roles:  # no limit yet: starting costs seconds of CPU
                    self.limits.starting(self.label(name, replica), proc.pid)
        for name, proc in self.procs:
            self.ports.setdefault(name, []).append(wait_ready(proc, name))
        asyncio.run(wait_balanced(self.nats_url, self.replicas))
        self.limits.apply()

    def label(self, name: str, replica: int) -> str:
        """A replica's name in the reports (process_names): ``planner``, or ``planner-2`` of several."""
        return name if self.replicas[name] == 1 else f"{name}-{replica + 1}"

    def prepare_webhook_service(self, planners: int) -> list[int]:
        """The webhook Service and one EndpointSlice per planner replica (each its own port);
        returns the ports, one per replica."""
        from trainyard.supervisor import manifests

        ports = [free_port() for _ in range(planners)]
        documents = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": manifests.SYSTEM_NAMESPACE}},
                     manifests.webhook_service(),
                     *(manifests.webhook_endpoint_slice(str(replica), "127.0.0.1", port)
                       for replica, port in enumerate(ports, 1))]
        self.cluster.kubectl("apply", "--server-side", "-f", "-",
                             input="\n---\n".join(json.dumps(doc) for doc in documents))
        self.webhook_ports = ports
        return ports

    def limited(self) -> dict[str, object]:
        """The limited replicas' cgroups by replica name (empty without --cpu-limit)."""
        return dict(self.limits.groups)

    def __enter__(self) -> "Stack":
        """Started; stopped again (whatever did start) if starting fails."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def restart(self, name: str) -> tuple[float, float]:
        """Stops the first replica of ``name`` (SIGTERM) and starts a new one; returns the
        moment it was started (perf_counter) and the seconds until its /readyz answered."""
        index = next(i for i, (n, _) in enumerate(self.procs) if n == name)
        old = self.procs[index][1]
        os.kill(old.pid, signal.SIGTERM)
        old.wait(timeout=30)
        started = time.perf_counter()
        proc = start_service(name, self.cluster.kubeconfig, self.nats_url, self.workdir, replica=100 + index,
                             webhook_port=self.webhook_ports[0] if name == "planner" else 0)
        self.procs[index] = (name, proc)
        port = wait_ready(proc, name)
        self.ports[name][0] = port
        return started, time.perf_counter() - started

    def pids(self) -> dict[str, list[int]]:
        """Process ids by service (replicas together), devcluster and nats-server."""
        out: dict[str, list[int]] = {}
        for name, proc in self.procs:
            out.setdefault(name, []).append(proc.pid)
        out["devcluster"] = devcluster_pids(self.cluster)  # the store process first, then its API workers
        out["nats-server"] = [node.proc.pid for node in self.nodes]
        return out

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for _, proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        self.limits.close()
        if self.cluster is not None:
            self.cluster.stop()
        for node in self.nodes:
            node.stop()


async def wait_balanced(url: str, replicas: dict[str, int], timeout_s: float = 60.0) -> None:
    """Until every partitioned role's replicas hold all partitions between them, each its
    share (docs/bus.md); a release before partitions has no lease bucket: nothing to wait for."""
    import nats

    try:
        from trainyard.bus.subjects import partitions_setting
        from trainyard.bus.topology import LEASES_BUCKET
    except ImportError:
        return
    count = partitions_setting()
    nc = await nats.connect(servers=url.split(","))
    try:
        kv = await nc.jetstream().key_value(LEASES_BUCKET)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                keys = await kv.keys()
            except Exception:  # no keys yet
                keys = []
            holders: dict[str, dict[str, int]] = {}
            for key in keys:
                role, _, kind, _ = key.split(".", 3)
                if kind == "p":
                    try:
                        holder = (await kv.get(key)).value.decode()
                    except Exception:  # handed over between the listing and the read
                        continue
                    holders.setdefault(role, {}).setdefault(holder, 0)
                    holders[role][holder] += 1
            balanced = all(
                len(holders.get(role, {})) == replicas[role] and sum(holders[role].values()) == count
                and max(holders[role].values()) - min(holders[role].values()) <= 1
                for role in ("planner", "applier", "status"))
            if balanced:
                return
            await asyncio.sleep(0.5)
        print(f"warning: partitions not balanced after {timeout_s:.0f} s: {holders}", flush=True)
    finally:
        await nc.close()


SATURATED_PCT = 85.0  # of one core: a process this busy is the limit (each runs one event loop)


def same_service(process: str, service: str) -> bool:
    """Whether ``process`` (a :func:`process_names` name) is a replica of ``service`` (for the
    devcluster: its store process or one of its API workers)."""
    if process == service:
        return True
    rest = process[len(service) + 1:] if process.startswith(f"{service}-") else ""
    if service == "devcluster" and (rest == "store" or rest.startswith("api-")):
        rest = rest.removeprefix("api-") if rest != "store" else "0"
    return rest.isdigit()


def saturation(percent: dict[str, float], cores: int, others_pct: float = 0.0, load: float = 0.0) -> str:
    """Which process is the limit of a run, from each process's CPU % of one core: one at
    >= SATURATED_PCT (and, for the devcluster's, whether the API server is the limit), else
    all of them (with ``others_pct``, the load generators) near the machine's cores, else none
    (and, with a 1-minute ``load`` average above the cores, that other work held them)."""
    busiest = max(percent, key=percent.get)
    top = percent[busiest]
    if top >= SATURATED_PCT:
        if busiest == "devcluster":
            role = "the API server, one process: it is the limit"
        elif busiest == "devcluster-store":
            role = "the devcluster's store process: the API server is the limit"
        elif same_service(busiest, "devcluster"):
            role = "a devcluster API worker: the API server is the limit"
        else:
            role = "not the API server"
        return f"{busiest} {top:.0f}% ({role})"
    total = sum(percent.values()) + others_pct
    if total >= SATURATED_PCT * cores:
        return (f"no one process; all {total:.0f}% of {100 * cores}% (the cores are the limit; "
                f"busiest {busiest} {top:.0f}%)")
    if load > cores:
        return (f"none (busiest {busiest} {top:.0f}%; load average {load:.1f} on {cores} cores: "
                "other work held the cores)")
    return f"none (busiest {busiest} {top:.0f}%)"


async def lease_health(client: httpx.AsyncClient, stack: Stack) -> dict[str, tuple[float, float]]:
    """Per replica of a partitioned role: partitions taken from it while its presence was gone,
    and how often it withdrew its presence because its event loop stalled (docs/bus.md)."""
    out = {}
    for name, ports in stack.ports.items():
        if name == "watcher":
            continue
        for index, port in enumerate(ports):
            label = name if len(ports) == 1 else f"{name}-{index + 1}"
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            lost = sum(prometheus_samples(text, "trainyard_partition_leases_lost_total").values())
            withdrawn = sum(prometheus_samples(text, "trainyard_partition_presence_withdrawn_total").values())
            out[label] = (lost, withdrawn)
    return out


def lease_lines(health: dict[str, tuple[float, float]]) -> list[str]:
    if not health:
        return []
    lost = sum(v[0] for v in health.values())
    withdrawn = {name: v[1] for name, v in health.items() if v[1]}
    return [f"leases lost while a presence was gone: {lost:.0f}" + (" (" + ", ".join(
        f"{name} {v[0]:.0f}" for name, v in health.items() if v[0]) + ")" if lost else "") +
        "; presences withdrawn (a stalled event loop): " + (", ".join(f"{name} {n:.0f}" for name, n in withdrawn.items())
                                                            if withdrawn else "none")]


def offered_taken(count: int, created: float, wall: float) -> str:
    """Offered load (creates/s while they were sent) against taken (TrainJobs/s through the
    whole pipeline): the creates must outrun the stack, or the figure is the load generators'
    rate, not the stack's."""
    taken_by = "the stack (creates outran it)" if created < 0.8 * wall else "the load generators, not the stack"
    return (f"offered {count / created:.1f} creates/s, taken {count / wall:.1f} TrainJobs/s: the figure is "
            f"bounded by {taken_by}")


def devcluster_split(percent: dict[str, float]) -> str:
    """The devcluster's CPU: its processes summed, and each (store process, API workers)."""
    own = {name: value for name, value in percent.items() if same_service(name, "devcluster")}
    if len(own) <= 1:
        return f"{sum(own.values()):.0f}"
    return f"{sum(own.values()):.0f} (" + ", ".join(
        f"{name.removeprefix('devcluster-')} {value:.0f}" for name, value in own.items()) + ")"


async def idle_cpu(flat: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU ms per second of each process while no TrainJob flows."""
    if seconds <= 0:
        return {name: 0.0 for name in flat}
    await asyncio.sleep(2.0)  # the warm-up's last events settle
    before = {name: cpu_seconds(pid) for name, pid in flat.items()}
    await asyncio.sleep(seconds)
    idle = {name: 1000 * (cpu_seconds(pid) - before[name]) / seconds for name, pid in flat.items()}
    print("idle CPU ms per second (no TrainJobs flowing, " + f"{seconds:.0f} s): " +
          ", ".join(f"{name} {value:.1f}" for name, value in idle.items()), flush=True)
    return idle


def process_names(pids: dict[str, list[int]]) -> dict[str, int]:
    """One name per process: ``planner`` or ``planner-2`` when there are replicas; a devcluster
    with API workers is ``devcluster-store`` and ``devcluster-api-1``..N."""
    out = {}
    for name, group in pids.items():
        if name == "devcluster" and len(group) > 1:
            out["devcluster-store"] = group[0]
            out.update({f"devcluster-api-{i}": pid for i, pid in enumerate(group[1:], 1)})
            continue
        for i, pid in enumerate(group):
            out[name if len(group) == 1 else f"{name}-{i + 1}"] = pid
    return out


async def bench(stack: Stack, args) -> dict:
    cluster = stack.cluster
    pids = stack.pids()
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    figures: dict = {}
    async with httpx.AsyncClient(base_url=cluster.url, verify=context, limits=limits, timeout=60,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as client:
        (await client.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
         ).raise_for_status()
        for ns in ("bench-paced", "bench-sustained", "bench-raw"):
            (await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}}))
        watch = JobSetWatch(client)
        await watch.start()
        # Warm-up (first requests pay imports and connection set-up in every process).
        await paced(client, watch, "bench-paced", 5, 1.0)
        if not args.skip_paced:
            idle = []
            for i in range(10):  # one at a time: the pipeline's own latency, no queueing
                idle += await one(client, watch, "bench-paced", f"idle-{i}")
            print(f"one at a time: p50 {percentile(idle, 0.5):.1f} ms, max {max(idle):.1f} ms (n={len(idle)}); "
                  f"of which the create request itself (API server + admission webhook): "
                  f"p50 {percentile(CREATE_MS, 0.5):.1f} ms")
            print(f"{'rate (TrainJobs/s)':>20} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}"
                  f"   {'after create returned: p50':>28} {'p99':>8}")
            for rate in (20, 50, 100):
                latencies = await paced(client, watch, "bench-paced", rate, args.duration)
                print(f"{rate:>20} {len(latencies):>5} {percentile(latencies, 0.5):>8.1f} "
                      f"{percentile(latencies, 0.99):>8.1f} {max(latencies):>8.1f}"
                      f"   {percentile(AFTER_CREATE_MS, 0.5):>28.1f} {percentile(AFTER_CREATE_MS, 0.99):>8.1f}")

        names = [f"s-{i}" for i in range(args.sustained)]
        counters = Counters(client, stack.ports, stack.monitor_ports)
        creators = Generators(cluster, "create", "bench-sustained", names, args.generators, args.concurrency,
                              rate=args.rate)
        await creators.start()
        flat = process_names(pids)
        # Idle: the fixed work of every process per second (heartbeats, pulls, timers), measured
        # before the run and charged separately from the work each TrainJob costs.
        idle = await idle_cpu(flat, args.idle)
        figures["idle"] = {name: sum(v for n, v in idle.items() if same_service(n, name)) for name in pids}
        before = await counters.snapshot()
        profiles = start_profiles(Path(args.profile), process_names(pids)) if args.profile else []
        limited = stack.limited()
        # (Read before the CPU is: a scrape of every replica's /metrics is not a TrainJob's work.)
        leases_before = await lease_health(client, stack) if limited else {}
        cpu_before = {name: cpu_seconds(pid) for name, pid in flat.items()}
        throttled_before = {name: group.throttled() for name, group in limited.items()}
        load_before = loadavg()
        start = time.perf_counter()
        creators.go()
        await creators.finish()
        created = time.perf_counter() - start
        await watch.wait_all([f"bench-sustained/{n}" for n in names], timeout=300)
        wall = time.perf_counter() - start
        sustained = args.sustained / wall
        cpu_each = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in flat.items()}
        figures["limits"] = limit_shares(limited, throttled_before, cpu_each, wall, stack.cpu_limit)
        # During the run only (the replicas' start and first balancing are not counted).
        leases_after = await lease_health(client, stack) if limited else {}
        figures["leases"] = {name: (lost - leases_before.get(name, (0.0, 0.0))[0],
                                    late - leases_before.get(name, (0.0, 0.0))[1])
                             for name, (lost, late) in leases_after.items()}
        if profiles:
            stop_profiles(profiles)
        await asyncio.sleep(1.0)  # status writes and the events they cause finish
        after = await counters.snapshot()
        cpu = {}
        for name, group in pids.items():
            members = [n for n in flat if same_service(n, name)]
            cpu[name] = sum(cpu_each[m] for m in members) * 1000 / args.sustained
        # What each TrainJob costs beyond the fixed per-second work (idle ms/s x the run's seconds).
        figures["net"] = {name: max(cpu[name] - figures["idle"][name] * wall / args.sustained, 0.0) for name in pids}

        if args.skip_raw:
            await watch.stop()
            return await _summary(args, figures, cpu_each, wall, created, load_before, sustained, cpu, before, after,
                                  None, None, (1000 * creators.cpu_s / args.sustained, 0.0))
        # The same JobSets applied straight to the API server (field manager trainer, forced).
        sample = (await client.get(JOBSETS.format(ns="bench-sustained") + "/s-0")).json()
        appliers = Generators(cluster, "apply", "bench-raw", names, args.generators, args.concurrency,
                              spec=sample["spec"])
        await appliers.start()
        dev_pids = pids["devcluster"]  # the store process and its API workers, summed
        raw_profile = start_profiles(Path(args.profile), {
            f"devcluster-raw-ssa{'' if i == 0 else f'-api-{i}'}": pid for i, pid in enumerate(dev_pids)
        }) if args.profile else []
        dev_before = sum(cpu_seconds(pid) for pid in dev_pids)
        start = time.perf_counter()
        appliers.go()
        await appliers.finish()
        elapsed = time.perf_counter() - start
        if raw_profile:
            stop_profiles(raw_profile)
        raw = args.sustained / elapsed
        dev_raw_pct = 100 * (sum(cpu_seconds(pid) for pid in dev_pids) - dev_before) / elapsed
        generator_ms = (1000 * creators.cpu_s / args.sustained, 1000 * appliers.cpu_s / args.sustained)
        await watch.stop()
    return await _summary(args, figures, cpu_each, wall, created, load_before, sustained, cpu, before, after,
                          raw, dev_raw_pct, generator_ms)


async def _summary(args, figures: dict, cpu_each: dict, wall: float, created: float, load_before: str,
                   sustained: float, cpu: dict, before: dict, after: dict, raw: float | None,
                   dev_raw_pct: float | None, generator_ms: tuple[float, float]) -> dict:
    percent = {name: 100 * used / wall for name, used in cpu_each.items()}
    busiest = max(percent, key=percent.get)
    generators_pct = 100 * generator_ms[0] * args.sustained / 1000 / wall
    saturates = limited_saturation(figures.get("limits") or {}, args.cpu_limit) or saturation(
        percent, os.cpu_count() or 1, others_pct=generators_pct,
        load=max(float(load_before.split()[0]), os.getloadavg()[0]))
    offered = f"offered {args.rate:g}/s, " if args.rate else ""
    print(f"sustained: {sustained:.1f} TrainJobs/s (create -> JobSet applied, {args.sustained} TrainJobs, {offered}"
          f"concurrency {args.concurrency}, {args.generators} generator processes, every create answered "
          f"after {created:.1f} s of {wall:.1f} s; load average before {load_before}, after {loadavg()})")
    print(offered_taken(args.sustained, created, wall))
    for line in limit_lines(figures.get("limits") or {}, args.cpu_limit) + lease_lines(figures.get("leases") or {}) \
            + share_lines(before, after):
        print(line)
    if raw is not None:
        print(f"raw devcluster SSA: {raw:.1f} JobSets/s (devcluster at {dev_raw_pct:.0f}% CPU, all its processes); "
              f"ratio sustained/raw = {sustained / raw:.2f}")
    print(f"load generators (same machine): {generator_ms[0]:.2f} ms CPU per create in the sustained run, "
          f"{generator_ms[1]:.2f} ms per apply in the raw run")
    print("CPU ms per TrainJob in the sustained run: " +
          ", ".join(f"{name} {value:.1f}" for name, value in cpu.items()))
    control = sum(v for k, v in cpu.items() if k != "devcluster")
    print(f"control plane (services + nats-server): {control:.1f} ms per TrainJob")
    if args.idle > 0:
        print(f"of which fixed (idle ms/s x {wall:.1f} s / {args.sustained}): " +
              ", ".join(f"{name} {cpu[name] - figures['net'][name]:.1f}" for name in cpu) +
              "; per TrainJob beyond it: " + ", ".join(f"{name} {figures['net'][name]:.1f}" for name in cpu))
    print("CPU % of one core during the sustained run: " +
          ", ".join(f"{name} {value:.0f}" for name, value in percent.items()) + f"; busiest: {busiest}")
    print(f"devcluster CPU % (all its processes): {devcluster_split(percent)}; saturates: {saturates}")
    print("per TrainJob in the sustained run (counted after it settled):")
    for line in Counters.report(before, after, args.sustained):
        print(line)
    kv = Counters.per(before, after, "kv", args.sustained)
    nats = Counters.per(before, after, "nats", args.sustained)
    kv_per = {s: sum(v for k, v in kv.items() if k[0] == s) for s in SERVICES}
    msgs_per = {s: sum(v[0] + v[1] for name, v in nats.items() if name.removeprefix("trainyard-") == s)
                for s in SERVICES}  # connections are named trainyard-<service>, replicas alike
    figures.update(sustained=sustained, raw=raw, cpu=cpu, percent=percent, busiest=busiest, saturates=saturates,
                   kv=kv_per, msgs=msgs_per)
    return figures


def devcluster_pids(cluster) -> list[int]:
    """The devcluster's processes: the store process and its API workers (--api-workers)."""
    return [cluster.pid, *api_worker_pids(cluster.data_dir)]


def api_worker_pids(data_dir: Path) -> list[int]:
    """The API workers of the devcluster on ``data_dir`` (it writes their pids to
    ``<data-dir>/api-workers`` before it is ready; none when it runs as one process)."""
    workers = data_dir / "api-workers"
    return [int(p) for p in workers.read_text().split()] if workers.exists() else []


async def raw_only(cluster, args) -> list[dict]:
    """The raw phase alone: a devcluster with the CRDs and no services. The JobSet is the one the
    planner would apply for the sustained run's TrainJob (``plan()`` in this process), applied
    once and read back, so the bodies carry the stored spec with its defaults, as in the full
    run; one watch over all JobSets is open, as the full run's is. Repeated ``--rounds`` times,
    each round into a fresh namespace (every apply a create, as in the full run)."""
    from trainyard.pipeline import plan

    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    async with httpx.AsyncClient(base_url=cluster.url, verify=context, timeout=60,
                                 headers={"Authorization": f"Bearer {cluster.token}"}) as client:
        (await client.post("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", json=RUNTIME)
         ).raise_for_status()
        runtime = (await client.get("/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/bench-torch")).json()
        (await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": "bench-sample"}})).raise_for_status()
        job = (await client.post(TRAINJOBS.format(ns="bench-sample"), json=trainjob("bench-sample", "s-0"))).json()
        jobset = next(o for o in plan(job, runtime).objects if o["kind"] == "JobSet")
        (await client.patch(JOBSETS.format(ns="bench-sample") + "/s-0", params={"fieldManager": "trainer", "force": "true"},
                            content=json.dumps(jobset), headers={"Content-Type": "application/apply-patch+yaml"})
         ).raise_for_status()
        spec = (await client.get(JOBSETS.format(ns="bench-sample") + "/s-0")).json()["spec"]
        watch = JobSetWatch(client)
        await watch.start()
        names = [f"s-{i}" for i in range(args.sustained)]
        pids = devcluster_pids(cluster)
        rounds = []
        for round_ in range(args.rounds):
            ns = f"bench-raw-{round_}"
            (await client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": ns}})).raise_for_status()
            appliers = Generators(cluster, "apply", ns, names, args.generators, args.concurrency, spec=spec)
            await appliers.start()
            profile = start_profiles(Path(args.profile), {f"devcluster-raw-ssa-{round_}": cluster.pid}) \
                if args.profile else []
            load_before = loadavg()
            each_before = [cpu_seconds(pid) for pid in pids]
            dev_before = sum(each_before)
            loop_before = sum(thread_cpu_seconds(pid, pid) for pid in pids)  # the event loops' threads
            start = time.perf_counter()
            appliers.go()
            await appliers.finish()
            elapsed = time.perf_counter() - start
            each = [cpu_seconds(pid) - before for pid, before in zip(pids, each_before)]
            dev_cpu = sum(each)
            loop_cpu = sum(thread_cpu_seconds(pid, pid) for pid in pids) - loop_before
            rounds.append({"rate": args.sustained / elapsed, "cpu_ms": 1000 * dev_cpu / args.sustained,
                           "percent": 100 * dev_cpu / elapsed, "load_before": load_before, "load_after": loadavg()})
            if profile:
                stop_profiles(profile)
            print(f"raw devcluster SSA: {args.sustained / elapsed:.1f} JobSets/s (devcluster at "
                  f"{100 * dev_cpu / elapsed:.0f}% CPU, its event-loop thread {100 * loop_cpu / elapsed:.0f}%; "
                  f"{1000 * dev_cpu / args.sustained:.2f} ms CPU per apply, {1000 * loop_cpu / args.sustained:.2f} "
                  f"in the event loop; "
                  f"{args.sustained} JobSets, {args.generators} generator processes, concurrency {args.concurrency}, "
                  f"{1000 * appliers.cpu_s / args.sustained:.2f} ms generator CPU per apply; "
                  f"load average before {load_before}, after {loadavg()})", flush=True)
            if len(pids) > 1:
                print(f"  of which the store process {1000 * each[0] / args.sustained:.2f} ms per apply, the API workers "
                      + " / ".join(f"{1000 * cpu / args.sustained:.2f}" for cpu in each[1:]), flush=True)
        await watch.stop()
    return rounds


def parse_api_workers(value: str, raw_only: bool) -> list[int]:
    """``--api-workers``: with --raw-only a comma list (one devcluster each), else one count
    for the whole stack; empty: the devcluster's default."""
    if not value.strip():
        return []
    try:
        counts = [int(c) for c in value.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"error: --api-workers: expected {'a comma list of numbers' if raw_only else 'a number'}, "
                         f"got {value!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"error: --api-workers: every count must be 1 or more, got {value!r}")
    if len(counts) > 1 and not raw_only:
        raise SystemExit(f"error: --api-workers: one count for the stack (a list only with --raw-only), got {value!r}")
    return counts


def cpu_per_apply_line(workers: int, rounds: list[dict]) -> str:
    """The figure issue 24 sets a target for, on one line: the devcluster's CPU (the store
    process's and every API worker's) per JobSet apply, each round and the rounds' median."""
    per_apply = sorted(r["cpu_ms"] for r in rounds)
    middle = len(per_apply) // 2
    median = per_apply[middle] if len(per_apply) % 2 else (per_apply[middle - 1] + per_apply[middle]) / 2
    return (f"devcluster CPU per JobSet apply, {workers} API worker{'s' if workers > 1 else ''}: "
            + " / ".join(f"{r['cpu_ms']:.2f}" for r in rounds) + f" ms (median {median:.2f} ms)")


def run_raw_only(args) -> None:
    counts = parse_api_workers(args.api_workers, raw_only=True)
    if not counts:
        print(cpu_per_apply_line(1, run_raw_once(args, [])))
        return
    table = [(count, run_raw_once(args, ["--api-workers", str(count)])) for count in counts]
    print(f"\nraw SSA of JobSets by devcluster API workers ({args.sustained} JobSets per round, {args.generators} "
          f"generator processes, concurrency {args.concurrency}; {os.cpu_count()} CPUs, shared: load average now "
          f"{loadavg()})")
    print(f"{'workers':>7} {'JobSets/s':>22} {'devcluster CPU %':>18} {'ms CPU per apply':>18}   load average (1, 5, 15 min) before each round")
    for count, rounds in table:
        rates = " / ".join(f"{r['rate']:.0f}" for r in rounds)
        percents = " / ".join(f"{r['percent']:.0f}" for r in rounds)
        per_apply = " / ".join(f"{r['cpu_ms']:.2f}" for r in rounds)
        loads = " | ".join(r["load_before"] for r in rounds)
        print(f"{count:>7} {rates:>22} {percents:>18} {per_apply:>18}   {loads}")
    for count, rounds in table:
        print(cpu_per_apply_line(count, rounds))


def run_raw_once(args, extra_args: list[str]) -> list[dict]:
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    cluster = start_devcluster(workdir / "devcluster", extra_args)
    try:
        cluster.kubectl("apply", "--server-side",  # every CRD file (not the kustomization)
                        *(arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))))
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
              f"(/proc/loadavg {loadavg()}); raw phase only (devcluster {' '.join(extra_args) or '--api-workers 1'}, "
              f"no services); logs in {workdir}", flush=True)
        return asyncio.run(raw_only(cluster, args))
    finally:
        cluster.stop()


def run_once(args, replicas: dict[str, int]) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    with Stack(replicas, workdir, args.nats_cluster, args.stack_api_workers, args.cpu_limit,
               args.limit_roles) as stack:
        shown = ", ".join(f"{name}={count}" for name, count in replicas.items())
        bus = (f"NATS cluster of {args.nats_cluster} nodes, {os.environ.get('TRAINYARD_BUS_REPLICAS')} copies of every "
               "stream and bucket" if args.nats_cluster > 1 else "one NATS node, 1 copy")
        dev = len(stack.pids()["devcluster"])
        api = f"devcluster of {dev} processes (store + {dev - 1} API workers)" if dev > 1 else "devcluster one process"
        limit = (f"; each replica of {', '.join(args.limit_roles)} limited to {args.cpu_limit:g} CPU "
                 f"({stack.limits.describe()})" if stack.limits else "")
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
              f"(/proc/loadavg {loadavg()}); replicas {shown}; {bus}; {api}{limit}; logs in {workdir}", flush=True)
        return asyncio.run(bench(stack, args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per paced rate")
    parser.add_argument("--sustained", type=int, default=300, help="TrainJobs in the sustained run")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight, over all generators")
    parser.add_argument("--generators", type=int, default=4, help="load-generating processes (sustained, raw)")
    parser.add_argument("--replicas", default="", help="replicas per service, e.g. planner=4,applier=4")
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="py-spy record every Python process during the sustained run into DIR")
    parser.add_argument("--skip-paced", action="store_true", help="only the sustained and raw phases")
    parser.add_argument("--table", default="", metavar="SERVICES",
                        help="sustained and raw phases with 1, 2, 4 and 8 replicas (--counts) of these services "
                             "(comma list)")
    parser.add_argument("--counts", default="1,2,4,8", help="with --table: the replica counts, comma list")
    parser.add_argument("--repeat", type=int, default=1, metavar="K",
                        help="with --table: run the counts K times, interleaved (1,2,4,1,2,4,...); the targets "
                             "use each count's median, so a drift of the machine during the table weighs on "
                             "every count alike")
    parser.add_argument("--skip-raw", action="store_true", help="no raw devcluster SSA phase")
    parser.add_argument("--rate", type=float, default=0.0, metavar="TJ/S",
                        help="the sustained run offers this many TrainJob creates per second (over all generators) "
                             "instead of as many as the server takes: every --table row then carries the same "
                             "load, so CPU per TrainJob compares work, not how saturated the cores were "
                             "(0: as fast as possible)")
    parser.add_argument("--idle", type=float, default=5.0, metavar="SECONDS",
                        help="measure each process's idle CPU per second for this long before the sustained run "
                             "(0: not measured)")
    parser.add_argument("--raw-only", action="store_true",
                        help="only the raw devcluster SSA phase (no nats-server, no services): --sustained JobSets, "
                             "--rounds times")
    parser.add_argument("--rounds", type=int, default=1, help="with --raw-only: how many raw phases in a row")
    parser.add_argument("--nats-cluster", type=int, default=1, metavar="N",
                        help="run the bus on a local JetStream cluster of N nodes with 3 copies of every stream and "
                             "bucket, as `trainyard up --nats-cluster N` (nats-server CPU and messages: all nodes)")
    parser.add_argument("--api-workers", default="", metavar="N",
                        help="run the devcluster as `devcluster up --api-workers N` (a store process and N API "
                             "workers), so the API server need not be the limit; its CPU is the sum of its "
                             "processes and each run and --table row says which process saturates (default: "
                             "the devcluster's own, one process on <= 4 cores). With --raw-only a comma list "
                             "(e.g. 1,2,4): a table, one devcluster each")
    add_limit_arguments(parser, "planner,applier,status", "the services whose replicas are limited")
    args = parser.parse_args()
    args.limit_roles = parse_limit(args.cpu_limit, args.limit_roles, SERVICES)
    if args.nats_cluster < 1 or (args.nats_cluster > 1 and args.nats_cluster % 2 == 0):
        raise SystemExit(f"error: --nats-cluster: 1 or an odd number of nodes, got {args.nats_cluster}")
    if args.generators < 1 or args.concurrency < args.generators:
        raise SystemExit("error: --generators: needs 1 <= generators <= concurrency")
    if args.sustained < 1:
        raise SystemExit("error: --sustained: needs at least 1")
    if args.rate < 0:
        raise SystemExit(f"error: --rate: TrainJobs per second, 0 or more, got {args.rate}")
    if args.raw_only:
        run_raw_only(args)
        return 0
    args.stack_api_workers = next(iter(parse_api_workers(args.api_workers, raw_only=False)), 0)
    if not args.table:
        run_once(args, parse_replicas(args.replicas))
        return 0
    services = [s.strip() for s in args.table.split(",") if s.strip()]
    parse_replicas(",".join(f"{s}=1" for s in services))  # names checked
    args.skip_paced = True
    try:
        counts = [int(c) for c in args.counts.split(",") if c.strip()]
    except ValueError:
        raise SystemExit(f"error: --counts: expected a comma list of numbers, got {args.counts!r}") from None
    if not counts or min(counts) < 1:
        raise SystemExit(f"error: --counts: every count must be 1 or more, got {args.counts!r}")
    if args.repeat < 1:
        raise SystemExit(f"error: --repeat: 1 or more, got {args.repeat}")
    rows = []
    for count in counts * args.repeat:
        replicas = parse_replicas(",".join(f"{s}={count}" for s in services))
        rows.append((count, run_once(args, replicas)))
        print(flush=True)
    print_table(services, rows, args)
    return 0


def table_lines(services: list[str], rows: list[tuple[int, dict]]) -> list[str]:
    """The --table rows: per replica count, throughput (and its multiple of the first row's),
    CPU per TrainJob of the control plane, of the devcluster (all its processes) and of each
    named service, KV round trips and messages per TrainJob, which process saturates, and the
    devcluster's CPU % split over its store process and API workers."""
    head = f"{'replicas':>8} {'TJ/s':>7} {'x1':>5} {'raw/s':>6} {'ctl ms':>7} {'dev ms':>7} "
    head += " ".join(f"{s[:7] + ' ms':>10} {'net':>5} {'idle':>5} {'KV':>5} {'msgs':>5}" for s in services)
    lines = [head + "   saturates; devcluster CPU % (store, API workers); busiest processes (CPU %)",
             "  (ms: CPU ms per TrainJob; dev: the devcluster's, all its processes; net: the same less the idle "
             "per-second work over the run; idle: CPU ms per second of all replicas with no TrainJob flowing; "
             "x1: TJ/s over the first row's)"]
    first = rows[0][1]["sustained"] if rows else 0.0
    for count, fig in rows:
        control = sum(v for k, v in fig["cpu"].items() if k != "devcluster")
        top = sorted(fig["percent"].items(), key=lambda kv: -kv[1])[:3]
        raw = f"{fig['raw']:>6.1f}" if fig.get("raw") else f"{'-':>6}"
        scale = fig["sustained"] / first if first else 0.0
        line = (f"{count:>8} {fig['sustained']:>7.1f} {scale:>5.2f} {raw} {control:>7.1f} "
                f"{fig['cpu'].get('devcluster', 0):>7.2f} ")
        line += " ".join(f"{fig['cpu'].get(s, 0):>10.2f} {fig['net'].get(s, 0):>5.2f} {fig['idle'].get(s, 0):>5.1f} "
                         f"{fig['kv'].get(s, 0):>5.1f} {fig['msgs'].get(s, 0):>5.1f}" for s in services)
        saturates = fig.get("saturates") or saturation(fig["percent"], os.cpu_count() or 1)
        lines.append(line + f"   {saturates}; devcluster {devcluster_split(fig['percent'])}; "
                     + ", ".join(f"{n} {v:.0f}" for n, v in top))
    return lines


def print_table(services: list[str], rows: list[tuple[int, dict]], args) -> None:
    workers = args.stack_api_workers
    dev = f"devcluster --api-workers {workers}" if workers else "devcluster its default (one process on <= 4 cores)"
    offered = f", offered {args.rate:g}/s" if args.rate else ""
    print(f"replicas of {', '.join(services)} (sustained {args.sustained} TrainJobs{offered}, {args.generators} generators, "
          f"{dev}, {os.cpu_count()} CPUs, load average now {loadavg()}; CPU, KV and messages per TrainJob)")
    for line in table_lines(services, rows):
        print(line)
    for line in target_lines(services, rows):
        print(line)


# Issue #33's targets for a --table of limited replicas: TrainJobs/s at N replicas over one,
# and net CPU per TrainJob (idle work subtracted) at N over one, each count's median.
SCALE_TARGETS = {2: 1.9, 4: 3.6, 8: 6.5}
CPU_GROWTH_TARGETS = {4: 1.1, 8: 1.2}
# The processes that are not limited must not be the limit: each below this share of a core.
UNLIMITED_CEILING_PERCENT = 70.0


def target_lines(services: list[str], rows: list[tuple[int, dict]]) -> list[str]:
    """The table's targets, each count's median over its rows: throughput at 2, 4 and 8
    replicas over 1; net CPU per TrainJob of each service at 4 and 8 over 1; the busiest of
    the processes not replicated (devcluster, nats-server, watcher); and, as a control, the
    devcluster's CPU per TrainJob at 4 over 1: its work per TrainJob is the same in every row,
    so its ratio is how much the machine alone moved the CPU figures between the rows."""
    def median(values: list[float]) -> float | None:
        values = sorted(values)
        if not values:
            return None
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def median_of(count: int, section: str, name: str) -> float | None:
        return median([fig[section].get(name, 0.0) for c, fig in rows if c == count])

    def ratios(section: str, names: list[str], count: int) -> dict[str, float]:
        found = {}
        for name in names:
            one, other = median_of(1, section, name), median_of(count, section, name)
            if one and other is not None:
                found[name] = other / one
        return found

    counts = {c for c, _ in rows}
    if 1 not in counts:
        return []
    runs = sum(1 for c, _ in rows if c == 1)
    of = f" (median of {runs} rows each)" if runs > 1 else ""
    one = median([fig["sustained"] for c, fig in rows if c == 1]) or 0.0
    lines = []
    scale = [(n, (median([fig["sustained"] for c, fig in rows if c == n]) or 0.0) / one, goal)
             for n, goal in SCALE_TARGETS.items() if n in counts and one]
    if scale:
        lines.append(f"target: TrainJobs/s over 1 replica{of}: " + ", ".join(
            f"{n} replicas {x:.2f}x (>= {goal}x {'met' if x >= goal else 'NOT met'})" for n, x, goal in scale))
    for n, goal in CPU_GROWTH_TARGETS.items():
        if n not in counts:
            continue
        net = ratios("net", services, n)
        lines.append(f"target: net CPU per TrainJob at {n} replicas <= {goal}x at 1{of}: " + ", ".join(
            f"{s} {r:.2f}x {'met' if r <= goal else 'NOT met'}" for s, r in net.items())
            + "; with the idle work: " + ", ".join(f"{s} {r:.2f}x" for s, r in ratios("cpu", services, n).items()))
    busiest = {}
    for c, fig in rows:
        for name, percent in fig["percent"].items():
            if name.startswith(("devcluster", "nats-server", "watcher")):
                busiest[name] = max(busiest.get(name, 0.0), percent)
    if busiest:
        top = max(busiest.values())
        lines.append(f"target: devcluster, nats-server and watcher each below {UNLIMITED_CEILING_PERCENT:g}% of a core "
                     f"in every row: " + ", ".join(f"{n} at most {p:.0f}%" for n, p in sorted(busiest.items()))
                     + (" met" if top < UNLIMITED_CEILING_PERCENT else " NOT met"))
    if 4 in counts:
        control = ratios("cpu", ["devcluster"], 4).get("devcluster")
        if control is not None:
            lines.append(f"control: the devcluster's CPU per TrainJob (the same work in every row) at 4 over 1: "
                         f"{control:.2f}x")
    return lines


if __name__ == "__main__":
    sys.exit(main())
