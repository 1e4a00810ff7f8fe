"""``/metrics`` of the devcluster API server, in kube-apiserver's vocabulary.

Served like kube-apiserver's: behind authentication (the kubeconfig's bearer token), in the
Prometheus text format. Request counts and latency are measured around the whole handler
chain; storage figures are read from the store when scraped.

With API workers (``devcluster up --api-workers N``) the port hands each connection, a scrape's
too, to any one worker: so each worker keeps its counts in prometheus_client's multiprocess
files (the store process points ``PROMETHEUS_MULTIPROC_DIR`` at ``<data-dir>/metrics`` for
them), and whichever worker answers a scrape answers for the whole server: the workers' counts
summed, the gauges of the live ones summed, ``process_*`` of the store process and the workers
together.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client import ProcessCollector, PlatformCollector
from prometheus_client.multiprocess import MultiProcessCollector

from ...storage.datadir import PIDS_NAME

if TYPE_CHECKING:
    from trainyard_services.devcluster.storage.store import Store

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

REQUESTS = Counter(
    "apiserver_request_total", "API requests by verb, group, resource, subresource and HTTP code",
    ["verb", "group", "resource", "subresource", "code"], registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "apiserver_request_duration_seconds",
    "Response latency by verb, group, resource and subresource (WATCH excluded, as upstream)",
    ["verb", "group", "resource", "subresource"], buckets=_BUCKETS, registry=REGISTRY,
)
INFLIGHT = Gauge(
    "apiserver_current_inflight_requests", "Requests being served, read-only or mutating",
    ["request_kind"], registry=REGISTRY, multiprocess_mode="livesum",
)
LONGRUNNING = Gauge(
    "apiserver_longrunning_requests", "Long-running requests (watches, log follows) being served",
    ["verb", "group", "resource"], registry=REGISTRY, multiprocess_mode="livesum",
)
WATCH_EVENTS = Counter(
    "apiserver_watch_events_total", "Events sent to watch clients", ["group", "resource"], registry=REGISTRY,
)
for _kind in ("readOnly", "mutating"):
    INFLIGHT.labels(_kind).set(0)

_MUTATING = {"POST": "POST", "PUT": "PUT", "PATCH": "PATCH", "DELETE": "DELETE"}
KNOWN_CODES = ("200", "201", "404", "409", "422", "500")


def verb_of(method: str, has_name: bool, watch: bool, content_type: str) -> str:
    """kube-apiserver's verbs: GET, LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION."""
    if method == "GET":
        return "WATCH" if watch else ("GET" if has_name else "LIST")
    if method == "PATCH" and content_type.startswith("application/apply-patch"):
        return "APPLY"
    if method == "DELETE" and not has_name:
        return "DELETECOLLECTION"
    return _MUTATING.get(method, method)


def request_kind(verb: str) -> str:
    return "readOnly" if verb in ("GET", "LIST", "WATCH") else "mutating"


class StorageCollector:
    """``apiserver_storage_objects{resource}`` and the store's resource version, at scrape time."""

    def __init__(self) -> None:
        self.store: "Store | None" = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.store is None:
            return
        self._store = self.store
        objects = GaugeMetricFamily("apiserver_storage_objects", "Stored objects per resource", labels=["resource"])
        for group, resource in sorted(self._store.keys()):
            objects.add_metric([f"{resource}.{group}" if group else resource], self._store.count((group, resource)))
        yield objects
        rv = GaugeMetricFamily("trainyard_devcluster_storage_resource_version",
                               "Current resource version of the store (grows by one per write)")
        rv.add_metric([], float(getattr(self._store, "rv", 0) or 0))
        yield rv

    def describe(self) -> list:
        return []


_STORAGE = StorageCollector()
REGISTRY.register(_STORAGE)


def register_store(store: "Store") -> None:
    """The store the storage figures are read from (the one API server of this process)."""
    _STORAGE.store = store


MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
_COUNTED = (REQUESTS, REQUEST_DURATION, INFLIGHT, LONGRUNNING, WATCH_EVENTS)


class WorkersCollector:
    """This server's own metrics as every API worker counted them (multiprocess files)."""

    def __init__(self, directory: str) -> None:
        self.files = MultiProcessCollector(None, directory)
        self.names = {family.name for metric in _COUNTED for family in metric.collect()}

    def collect(self) -> Iterable[Metric]:
        # Only the API server's: anything else a worker's libraries count is not its to report.
        return [family for family in self.files.collect() if family.name in self.names]


class ServerProcessesCollector:
    """``process_*`` of the store process and its API workers as one server: CPU time and
    memory summed, the start time the store process's (a restart of the devcluster is its
    change), open file descriptors summed."""

    SUMMED = ("process_cpu_seconds", "process_virtual_memory_bytes", "process_resident_memory_bytes",
              "process_open_fds")  # family names (a counter's without _total)

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def worker_pids(self) -> list[int]:
        try:
            return [int(line) for line in (self.data_dir / PIDS_NAME).read_text().split()]
        except (OSError, ValueError):
            return [os.getpid()]  # still starting: the pids are written once all serve

    @staticmethod
    def of(pid: int) -> list[Metric]:
        return list(ProcessCollector(pid=lambda: pid, registry=None).collect())

    def collect(self) -> Iterator[Metric]:
        # The store process's figures (start time and limits included), the workers' added in.
        totals = {family.name: family for family in self.of(os.getppid())}
        for pid in self.worker_pids():
            for family in self.of(pid):
                if family.name in self.SUMMED and family.name in totals:
                    first = totals[family.name].samples[0]
                    totals[family.name].samples[0] = first._replace(value=first.value + family.samples[0].value)
        yield from totals.values()


def _serving_registry() -> CollectorRegistry:
    directory = os.environ.get(MULTIPROCESS_DIR_ENV)
    if not directory:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector(directory))
    registry.register(_STORAGE)
    registry.register(ServerProcessesCollector(Path(directory).parent))
    PlatformCollector(registry=registry)
    return registry


_SERVING = _serving_registry()


def response() -> web.Response:
    return web.Response(body=generate_latest(_SERVING), headers={"Content-Type": CONTENT_TYPE_LATEST})
