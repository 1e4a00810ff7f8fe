"""End-to-end benchmark: TrainJob create -> JobSet applied, through the four services.

Starts a real nats-server, a devcluster and the four services (one replica each), then:
1. paced bursts at 20, 50 and 100 TrainJobs/s: latency from sending the create to the JobSet's
   ADDED event on a watch (p50/p99);
2. sustained throughput: TrainJobs created as fast as the API server takes them, until every
   JobSet exists (TrainJobs/s);
3. the same run's raw devcluster server-side-apply rate for JobSets (no trainyard in the path),
   and the ratio sustained / raw.

Usage: .venv/bin/python bench/e2e.py [--duration 3] [--sustained 300] [--concurrency 16]
Prints figures; asserts nothing (targets: p50 < 50 ms, p99 < 250 ms at 100/s; ratio >= 0.8).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
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
from fixtures.nats import NatsServer  # noqa: E402

import httpx  # noqa: E402

SERVICES = ("watcher", "planner", "applier", "status")
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


def start_service(name: str, kubeconfig: Path, nats_url: str, workdir: Path) -> subprocess.Popen:
    log = open(workdir / f"{name}.log", "ab")
    args = [sys.executable, "-m", "trainyard.cli.main", name, "--kubeconfig", str(kubeconfig),
            "--nats-url", nats_url, "--http-port", "0", "--log-level", "warning"]
    if name == "planner":
        args += ["--webhook-port", "0", "--webhook-namespace", "trainyard-system"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True)
    log.close()
    return proc


def wait_ready(proc: subprocess.Popen, name: str) -> None:
    line = proc.stdout.readline()
    port = int(line.rsplit(":", 1)[1])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} not ready")


class JobSetWatch:
    """Records the arrival time of each JobSet ADDED event (one watch over all namespaces)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client
        self.seen: dict[str, float] = {}
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
                if event["type"] == "ADDED":
                    meta = event["object"]["metadata"]
                    self.seen.setdefault(f"{meta['namespace']}/{meta['name']}", time.perf_counter())
                    self._new.set()

    async def wait_all(self, keys: list[str], timeout: float) -> bool:
        deadline = time.perf_counter() + timeout
        while not all(k in self.seen for k in keys):
            self._new.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._new.wait(), timeout=remaining)
            except asyncio.TimeoutError:
                return False
        return True

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()


def trainjob(ns: str, name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns}, "spec": {"runtimeRef": {"name": "bench-torch"}}}


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


async def as_fast_as_possible(client: httpx.AsyncClient, ns: str, docs: list[dict], concurrency: int,
                              send) -> float:
    queue: asyncio.Queue = asyncio.Queue()
    for doc in docs:
        queue.put_nowait(doc)

    async def worker() -> None:
        while not queue.empty():
            await send(queue.get_nowait())

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


async def bench(cluster, args, pids: dict[str, int]) -> None:
    context = ssl.create_default_context(cafile=str(cluster.ca_cert))
    limits = httpx.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
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

        async def create(doc):
            (await client.post(TRAINJOBS.format(ns="bench-sustained"), json=doc)).raise_for_status()

        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        start = time.perf_counter()
        await as_fast_as_possible(client, "bench-sustained",
                                  [trainjob("bench-sustained", n) for n in names], args.concurrency, create)
        await watch.wait_all([f"bench-sustained/{n}" for n in names], timeout=300)
        sustained = args.sustained / (time.perf_counter() - start)
        cpu = {name: (cpu_seconds(pid) - cpu_before[name]) * 1000 / args.sustained for name, pid in pids.items()}

        # The same JobSets applied straight to the API server (field manager trainer, forced).
        sample = (await client.get(JOBSETS.format(ns="bench-sustained") + "/s-0")).json()
        spec = sample["spec"]

        async def apply(name):
            doc = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                   "metadata": {"name": name, "namespace": "bench-raw"}, "spec": spec}
            response = await client.patch(
                JOBSETS.format(ns="bench-raw") + f"/{name}", params={"fieldManager": "trainer", "force": "true"},
                content=json.dumps(doc), headers={"Content-Type": "application/apply-patch+yaml"})
            response.raise_for_status()

        elapsed = await as_fast_as_possible(client, "bench-raw", names, args.concurrency, apply)
        raw = args.sustained / elapsed
        await watch.stop()
    print(f"sustained: {sustained:.1f} TrainJobs/s (create -> JobSet applied, {args.sustained} TrainJobs, "
          f"concurrency {args.concurrency})")
    print(f"raw devcluster SSA: {raw:.1f} JobSets/s; ratio sustained/raw = {sustained / raw:.2f}")
    print("CPU ms per TrainJob in the sustained run: " +
          ", ".join(f"{name} {value:.1f}" for name, value in cpu.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per paced rate")
    parser.add_argument("--sustained", type=int, default=300, help="TrainJobs in the sustained run")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    nats = NatsServer(workdir / "nats")
    nats.start()
    cluster = start_devcluster(workdir / "devcluster")
    procs: list[subprocess.Popen] = []
    try:
        cluster.kubectl("apply", "--server-side",  # every CRD file (not the kustomization)
                        *(arg for path in sorted((REPO / "deploy" / "crds").glob("*_*.yaml")) for arg in ("-f", str(path))))
        procs = [start_service(name, cluster.kubeconfig, nats.url, workdir) for name in SERVICES]
        for proc, name in zip(procs, SERVICES):
            wait_ready(proc, name)
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; logs in {workdir}")
        pids = {name: proc.pid for name, proc in zip(SERVICES, procs)}
        pids["devcluster"] = cluster.pid
        pids["nats-server"] = nats.proc.pid
        asyncio.run(bench(cluster, args, pids))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        cluster.stop()
        nats.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
