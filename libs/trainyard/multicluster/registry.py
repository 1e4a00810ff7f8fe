"""The manager's worker clusters: MultiKueueCluster objects, their kubeconfigs, reachability.

Each refresh lists the MultiKueueClusters, reads each kubeconfig from its Secret (in the
secrets namespace) or file, keeps one client per worker (rebuilt when the kubeconfig changes),
probes the worker's API, and writes the ``Active`` condition as Kueue does. A worker that has
not answered for ``lost_timeout_s`` is *lost*: its TrainJobs may be re-dispatched. Kubeconfigs
are read from the API server by this process only; they never go on the bus.

The registry also keeps each worker's capacity summary (what its nodes can allocate, and what
its pods request summed per owning JobSet) from a watch of its Nodes and Pods, started with
the worker's client (trainyard.multicluster.capacity): placement reads a few sums per worker,
and a probe is one GET of /version, whatever the number of pods in the fleet.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml

from trainyard.clock import now_rfc3339
from trainyard.api.multikueue import KUBECONFIG_SECRET_KEY
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.watch import list_and_watch
from trainyard.multicluster.capacity import CapacitySummary
from trainyard.multicluster.placement import Amounts, Owner, node_allocatable, pod_use_by_owner

log = logging.getLogger(__name__)

CONDITION_ACTIVE = "Active"
# Kueue's reasons for the Active condition.
REASON_ACTIVE = "Active"
REASON_BAD_CONFIG = "BadConfig"
REASON_CONNECTION_FAILED = "ClientConnectionFailed"
PROBE_TIMEOUT_S = 3.0
# A reachable worker's kubeconfig is read again after this long (and at once when the worker
# stops answering, or its MultiKueueCluster names another one): reading its Secret at every
# probe made most of an idle dispatcher's API requests.
KUBECONFIG_REREAD_S = 30.0


@dataclass
class WorkerState:
    name: str
    client: KubeClient | None = None
    kubeconfig_digest: str = ""
    kubeconfig_source: str = ""  # the MultiKueueCluster's spec.kubeConfig it was read from
    kubeconfig_read_at: float = 0.0  # monotonic
    reachable: bool = False
    unreachable_since: float | None = None  # monotonic; None while reachable
    reason: str = REASON_CONNECTION_FAILED
    message: str = "not probed yet"
    allocatable: Amounts = field(default_factory=dict)
    pod_use: dict[Owner, Amounts] = field(default_factory=dict)
    generation: int = 0  # bumped by each change of the capacity summary
    synced: bool = False  # a summary exists (the watches listed Nodes and Pods once)
    watch_stop: asyncio.Event | None = None
    watch_tasks: list[asyncio.Task] = field(default_factory=list)

    def observe(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Keeps the capacity summary of a Node and Pod listing (not the listing itself)."""
        self.summarised(node_allocatable(nodes), pod_use_by_owner(pods))

    def summarised(self, allocatable: Amounts, pod_use: dict[Owner, Amounts]) -> None:
        self.allocatable, self.pod_use, self.synced = allocatable, pod_use, True
        self.generation += 1

    async def stop_watches(self) -> None:
        if self.watch_stop is not None:
            self.watch_stop.set()
        tasks, self.watch_tasks = self.watch_tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def start_watches(self) -> None:
        """Nodes and Pods of the worker, into its summary, until the client changes."""
        assert self.client is not None
        self.watch_stop = asyncio.Event()
        self.synced = False
        summary = CapacitySummary(self.summarised)
        self.watch_tasks = [asyncio.ensure_future(list_and_watch(self.client, resource, summary, self.watch_stop))
                            for resource in (r.NODE, r.POD)]


class WorkerRegistry:
    def __init__(self, manager: KubeClient, secrets_namespace: str, lost_timeout_s: float,
                 on_reachable: Callable[[str], None] | None = None) -> None:
        self.manager = manager
        self.secrets_namespace = secrets_namespace
        self.lost_timeout_s = lost_timeout_s
        self.workers: dict[str, WorkerState] = {}
        self.on_reachable = on_reachable  # called with a worker's name when it answers again
        self.listed = False  # the MultiKueueCluster list was read at least once

    # -- what the dispatcher asks --------------------------------------------------------------

    def active(self) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.reachable and w.client is not None and w.synced]

    def client(self, name: str) -> KubeClient | None:
        worker = self.workers.get(name)
        return worker.client if worker is not None and worker.reachable else None

    def is_lost(self, name: str) -> bool:
        """A worker no longer declared, or unreachable for longer than the lost timeout."""
        if not self.listed:
            return False
        worker = self.workers.get(name)
        if worker is None:
            return True
        return (worker.unreachable_since is not None
                and time.monotonic() - worker.unreachable_since >= self.lost_timeout_s)

    # -- refresh -------------------------------------------------------------------------------

    async def refresh(self) -> None:
        try:
            listed = await self.manager.request("GET", r.MULTIKUEUE_CLUSTER.path())
        except KubeError as err:
            log.warning("cannot list MultiKueueClusters: %s", describe(err))
            return
        declared = {item["metadata"]["name"]: item for item in listed.get("items") or []}
        for name in list(self.workers):
            if name not in declared:
                await self._forget(name)
        await asyncio.gather(*(self._refresh_one(obj) for obj in declared.values()))
        self.listed = True

    async def close(self) -> None:
        for name in list(self.workers):
            await self._forget(name)

    async def _forget(self, name: str) -> None:
        worker = self.workers.pop(name, None)
        if worker is not None:
            await worker.stop_watches()
        if worker is not None and worker.client is not None:
            await worker.client.close()

    async def _refresh_one(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        worker = self.workers.setdefault(name, WorkerState(name, unreachable_since=time.monotonic()))
        was_reachable = worker.reachable
        try:
            if self._kubeconfig_due(worker, obj):
                await self._connect(worker, await self._kubeconfig_text(obj))
                worker.kubeconfig_source = _source(obj)
                worker.kubeconfig_read_at = time.monotonic()
        except _BadConfig as err:
            self._mark_unreachable(worker, REASON_BAD_CONFIG, str(err))
        else:
            await self._probe(worker)
        await self._write_condition(obj, worker)
        if worker.reachable and not was_reachable:
            log.info("worker cluster %s reachable", name)
            if self.on_reachable is not None:
                self.on_reachable(name)
        elif was_reachable and not worker.reachable:
            log.warning("worker cluster %s unreachable: %s", name, worker.message)

    @staticmethod
    def _kubeconfig_due(worker: WorkerState, obj: dict[str, Any]) -> bool:
        return worker.client is None or not worker.reachable or worker.kubeconfig_source != _source(obj) \
            or time.monotonic() - worker.kubeconfig_read_at >= KUBECONFIG_REREAD_S

    async def _kubeconfig_text(self, obj: dict[str, Any]) -> str:
        spec = (obj.get("spec") or {}).get("kubeConfig") or {}
        location, location_type = spec.get("location"), spec.get("locationType") or "Secret"
        if not location:
            raise _BadConfig("spec.kubeConfig.location is empty")
        if location_type == "Path":
            try:
                with open(location, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError as err:
                raise _BadConfig(f"cannot read kubeconfig file {location}: {err.strerror}") from None
        else:
            try:
                secret = await self.manager.get(r.SECRET, self.secrets_namespace, location)
            except KubeError as err:
                raise _BadConfig(f"cannot read Secret {self.secrets_namespace}/{location}: {err}") from None
            if secret is None:
                raise _BadConfig(f"Secret {self.secrets_namespace}/{location} not found")
            encoded = (secret.get("data") or {}).get(KUBECONFIG_SECRET_KEY)
            if not encoded:
                raise _BadConfig(f"Secret {self.secrets_namespace}/{location} has no key {KUBECONFIG_SECRET_KEY!r}")
            try:
                text = base64.b64decode(encoded).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                raise _BadConfig(f"Secret {self.secrets_namespace}/{location}: {KUBECONFIG_SECRET_KEY} "
                                 "is not base64-encoded UTF-8") from None
        return text

    async def _connect(self, worker: WorkerState, text: str) -> None:
        """A client from the kubeconfig ``text``, kept while the text stays the same: it is
        read every refresh (every 2 s), and parsing its YAML each time cost 5-6 ms of CPU per
        worker and replica, a fifth of a dispatcher at 0.03 CPU with two workers (issue #33)."""
        digest = hashlib.sha256(text.encode()).hexdigest()
        if worker.client is not None and digest == worker.kubeconfig_digest:
            return
        try:
            kubeconfig = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise _BadConfig(f"kubeconfig of {worker.name} is not valid YAML: {err}") from None
        if not isinstance(kubeconfig, dict) or not kubeconfig.get("clusters"):
            raise _BadConfig(f"kubeconfig of {worker.name} has no clusters")
        try:
            client = await KubeClient.from_kubeconfig_dict(kubeconfig)
        except Exception as err:  # the config loader raises many types for a bad kubeconfig
            raise _BadConfig(f"kubeconfig of {worker.name} cannot be used: {err}") from None
        await worker.stop_watches()
        if worker.client is not None:
            await worker.client.close()
        worker.client, worker.kubeconfig_digest = client, digest
        worker.start_watches()

    async def _probe(self, worker: WorkerState) -> None:
        assert worker.client is not None
        try:
            await worker.client.request("GET", "/version", timeout_s=PROBE_TIMEOUT_S)
        except KubeError as err:
            self._mark_unreachable(worker, REASON_CONNECTION_FAILED, str(err.message or err))
            return
        worker.reachable, worker.unreachable_since = True, None
        worker.reason, worker.message = REASON_ACTIVE, "Connected"

    @staticmethod
    def _mark_unreachable(worker: WorkerState, reason: str, message: str) -> None:
        if worker.reachable or worker.unreachable_since is None:
            worker.unreachable_since = time.monotonic()
        worker.reachable, worker.reason, worker.message = False, reason, message

    async def _write_condition(self, obj: dict[str, Any], worker: WorkerState) -> None:
        conditions = list((obj.get("status") or {}).get("conditions") or [])
        current = next((c for c in conditions if c.get("type") == CONDITION_ACTIVE), None)
        status = "True" if worker.reachable else "False"
        if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == \
                (status, worker.reason, worker.message):
            return
        changed = current is None or current.get("status") != status
        condition = {"type": CONDITION_ACTIVE, "status": status, "reason": worker.reason,
                     "message": worker.message,
                     "lastTransitionTime": now_rfc3339() if changed else current.get("lastTransitionTime", now_rfc3339()),
                     "observedGeneration": obj["metadata"].get("generation", 1)}
        body = dict(obj)
        body["status"] = {**(obj.get("status") or {}),
                          "conditions": [c for c in conditions if c.get("type") != CONDITION_ACTIVE] + [condition]}
        try:
            await self.manager.replace_status(r.MULTIKUEUE_CLUSTER, body)
        except KubeError as err:
            if not err.conflict:  # a conflict: another dispatcher wrote it; the next refresh sees it
                log.warning("cannot write status of MultiKueueCluster %s: %s", worker.name, describe(err))


class _BadConfig(Exception):
    pass


def _source(obj: dict[str, Any]) -> str:
    spec = (obj.get("spec") or {}).get("kubeConfig") or {}
    return f"{spec.get('locationType') or 'Secret'}:{spec.get('location') or ''}"
