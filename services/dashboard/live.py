"""What the dashboard shows, kept live from the bus.

TrainJobs come from the snapshot bucket at start and then from the events stream (a plain
NATS subscription to ``ty.events.<cluster>.TrainJob``/``JobSet``: the dashboard never takes
messages from a durable consumer). Plans (``ty.desired``) and apply results (``ty.results``) are
watched the same way to time each TrainJob's hops: created → observed → planned → applied →
running → finished. Every change is pushed to the connected browsers (server-sent events).
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from trainyard.bus.envelopes import ApplyResult, EnvelopeError, ObjectEvent, decode
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import EVENTS_PREFIX, PLANS_PREFIX, RESULTS_PREFIX, ObjectKey, decode_token, encode_token
from trainyard.bus.topology import EVENTS_STREAM, PLANS_STREAM, RESULTS_STREAM, durable_name
from trainyard.clock import parse_epoch
from trainyard.errortext import describe
from trainyard.pipeline.trainjobs import finished_condition, owner_reference, state_of

log = logging.getLogger(__name__)

STAGES = ("created", "observed", "planned", "applied", "running", "finished")
# The consumers whose backlog is shown, per cluster: (role, stream).
CONSUMERS = (("planner", EVENTS_STREAM), ("applier", PLANS_STREAM), ("status", EVENTS_STREAM),
             ("status-results", RESULTS_STREAM), ("dispatcher", EVENTS_STREAM))
SERVICE_NAMES = ("watcher", "planner", "applier", "status", "dispatcher")


@dataclass
class Timeline:
    stages: dict[str, float] = field(default_factory=dict)

    def mark(self, stage: str, at: float | None = None) -> bool:
        if stage in self.stages:
            return False
        self.stages[stage] = at if at is not None else time.time()
        return True

    def to_json(self) -> list[dict[str, Any]]:
        """Each known stage with its time and the hop latency from the stage before it."""
        out, previous = [], None
        for stage in STAGES:
            at = self.stages.get(stage)
            if at is None:
                continue
            out.append({"stage": stage, "at": at,
                        "hop_s": round(max(at - previous, 0.0), 3) if previous is not None else None})
            previous = at
        return out


def row_of(cluster: str, trainjob: dict[str, Any], runtime: dict[str, Any] | None) -> dict[str, Any]:
    meta = trainjob.get("metadata") or {}
    spec = trainjob.get("spec") or {}
    status = trainjob.get("status") or {}
    nodes = (spec.get("trainer") or {}).get("numNodes") \
        or ((runtime or {}).get("spec") or {}).get("mlPolicy", {}).get("numNodes")
    jobs = status.get("jobsStatus") or []
    progress = (status.get("trainerStatus") or {}).get("progressPercentage")
    return {
        "key": f"{cluster}/{meta.get('namespace', '')}/{meta.get('name', '')}",
        "cluster": cluster, "namespace": meta.get("namespace", ""), "name": meta.get("name", ""),
        "uid": meta.get("uid", ""), "runtime": (spec.get("runtimeRef") or {}).get("name", ""),
        "state": state_of(status), "nodes": nodes, "created": meta.get("creationTimestamp"),
        "active": sum(int(j.get("active") or 0) for j in jobs),
        "succeeded": sum(int(j.get("succeeded") or 0) for j in jobs),
        "failed": sum(int(j.get("failed") or 0) for j in jobs),
        "progress": progress,
        "message": (finished_condition(status) or {}).get("message", ""),
    }


class Live:
    def __init__(self, bus: BusSession, clusters: list[str], stack_state: Path | None = None) -> None:
        self.bus = bus
        self.clusters = clusters
        self.stack_state = stack_state
        self.rows: dict[str, dict[str, Any]] = {}
        self.timelines: dict[str, Timeline] = {}   # by TrainJob uid
        self.services: list[dict[str, Any]] = []
        self.consumers: list[dict[str, Any]] = []
        self._listeners: set[asyncio.Queue[tuple[str, Any]]] = set()
        self._subscriptions: list[Any] = []
        self._runtimes: dict[tuple[str, str, str], dict[str, Any]] = {}

    # -- the browsers ----------------------------------------------------------------------

    def listen(self) -> asyncio.Queue[tuple[str, Any]]:
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=1000)
        self._listeners.add(queue)
        return queue

    def forget(self, queue: asyncio.Queue[tuple[str, Any]]) -> None:
        self._listeners.discard(queue)

    def _push(self, kind: str, data: Any) -> None:
        for queue in list(self._listeners):
            try:
                queue.put_nowait((kind, data))
            except asyncio.QueueFull:  # a stalled browser: it reloads the snapshot on reconnect
                self._listeners.discard(queue)

    def snapshot(self) -> dict[str, Any]:
        return {"trainjobs": sorted(self.rows.values(), key=lambda r: r.get("created") or "", reverse=True),
                "services": self.services, "consumers": self.consumers, "clusters": self.clusters}

    # -- the bus ---------------------------------------------------------------------------

    async def start(self) -> None:
        nc = self.bus.nc
        for cluster in self.clusters:
            token = encode_token(cluster)
            for kind in ("TrainJob", "JobSet", "ClusterTrainingRuntime", "TrainingRuntime"):
                self._subscriptions.append(await nc.subscribe(f"{EVENTS_PREFIX}.{token}.{kind}.*.*",
                                                              cb=self._on_event))
            self._subscriptions.append(await nc.subscribe(f"{PLANS_PREFIX}.{token}.>", cb=self._on_plan))
            self._subscriptions.append(await nc.subscribe(f"{RESULTS_PREFIX}.{token}.>", cb=self._on_result))
        # Subscribed first, then loaded: nothing falls between the two.
        for cluster in self.clusters:
            for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
                for runtime in await self.bus.snapshots.list(cluster, kind):
                    meta = runtime.get("metadata") or {}
                    self._runtimes[(cluster, meta.get("namespace") or "", meta.get("name", ""))] = runtime
            for trainjob in await self.bus.snapshots.list(cluster, "TrainJob"):
                self._update(cluster, trainjob, observed_at=None)

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception:  # connection already closed
                pass

    def _runtime_for(self, cluster: str, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
        namespace = (trainjob.get("metadata") or {}).get("namespace", "") \
            if ref.get("kind") == "TrainingRuntime" else ""
        return self._runtimes.get((cluster, namespace, ref.get("name", "")))

    def _update(self, cluster: str, trainjob: dict[str, Any], observed_at: float | None) -> None:
        row = row_of(cluster, trainjob, self._runtime_for(cluster, trainjob))
        timeline = self.timelines.setdefault(row["uid"], Timeline())
        created = parse_epoch(row["created"])
        if created is not None:
            timeline.mark("created", created)
        if observed_at is not None:
            timeline.mark("observed", observed_at)
        if row["state"] in ("Running", "Complete", "Failed") and (row["active"] or row["succeeded"] or row["failed"]):
            timeline.mark("running", observed_at if observed_at is not None else None)
        finished = finished_condition(trainjob.get("status") or {})
        if finished is not None:
            timeline.mark("finished", parse_epoch(finished.get("lastTransitionTime")) or observed_at)
        row["timeline"] = timeline.to_json()
        if self.rows.get(row["key"]) != row:
            self.rows[row["key"]] = row
            self._push("trainjob", row)

    async def _on_event(self, msg: Any) -> None:
        received = time.time()
        try:
            event = decode(ObjectEvent, msg.data)
        except EnvelopeError:
            return
        if event.kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
            self._runtimes[(event.cluster, event.namespace, event.name)] = event.object
            return
        if event.kind == "TrainJob":
            key = f"{event.cluster}/{event.namespace}/{event.name}"
            if event.type == "DELETED":
                if self.rows.pop(key, None) is not None:
                    self.timelines.pop(event.uid, None)
                    self._push("deleted", {"key": key})
                return
            self._update(event.cluster, event.object, observed_at=received)
            return
        # A JobSet change: re-read its TrainJob (its status follows) to refresh counts.
        owner = owner_reference(event.object)
        if owner is not None:
            trainjob = await self.bus.snapshots.get(ObjectKey(event.cluster, "TrainJob", event.namespace,
                                                              owner.get("name", "")))
            if trainjob is not None:
                self._update(event.cluster, trainjob, observed_at=None)

    def _mark(self, subject: str, stage: str, uid: str | None = None) -> None:
        tokens = subject.split(".")
        if len(tokens) < 6:
            return
        key = f"{decode_token(tokens[2])}/{decode_token(tokens[4])}/{decode_token(tokens[5])}"
        row = self.rows.get(key)
        if row is None or (uid and row["uid"] != uid):
            return
        timeline = self.timelines.setdefault(row["uid"], Timeline())
        if timeline.mark(stage):
            row = dict(row, timeline=timeline.to_json())
            self.rows[key] = row
            self._push("trainjob", row)

    async def _on_plan(self, msg: Any) -> None:
        uid = None
        try:
            uid = json.loads(msg.data).get("uid")
        except ValueError:
            pass
        self._mark(msg.subject, "planned", uid)

    async def _on_result(self, msg: Any) -> None:
        try:
            result = decode(ApplyResult, msg.data)
        except EnvelopeError:
            return
        if result.outcome == "applied":
            self._mark(msg.subject, "applied", result.uid)

    # -- services and backlog ----------------------------------------------------------------

    async def watch_services(self, stop: asyncio.Event, interval_s: float = 2.0) -> None:
        async with httpx.AsyncClient(timeout=1.5) as http:
            while not stop.is_set():
                try:
                    services, consumers = await self._services(http), await self._consumers()
                except asyncio.CancelledError:
                    raise
                except Exception as err:  # noqa: BLE001 - shown as stale, tried again
                    log.debug("service probe failed: %s", describe(err))
                else:
                    if (services, consumers) != (self.services, self.consumers):
                        self.services, self.consumers = services, consumers
                        self._push("services", {"services": services, "consumers": consumers})
                try:
                    await asyncio.wait_for(stop.wait(), timeout=interval_s)
                except asyncio.TimeoutError:
                    pass

    async def _services(self, http: httpx.AsyncClient) -> list[dict[str, Any]]:
        """From the local stack's stack.json: each service process, ready or not, restarts."""
        if self.stack_state is None:
            return []
        try:
            state = json.loads(self.stack_state.read_text())
        except (OSError, ValueError):
            return []
        ports, restarts = state.get("ports") or {}, state.get("restarts") or {}
        names = [name for name in ports if any(name == s or name.endswith(f"-{s}") for s in SERVICE_NAMES)]

        async def probe(name: str) -> dict[str, Any]:
            try:
                ready = (await http.get(f"http://127.0.0.1:{ports[name]}/readyz")).status_code == 200
            except httpx.HTTPError:
                ready = False
            return {"name": name, "replicas": 1, "ready": ready, "restarts": int(restarts.get(name, 0)),
                    "pid": ((state.get("children") or {}).get(name) or {}).get("pid")}

        return list(await asyncio.gather(*(probe(name) for name in sorted(names))))

    async def _consumers(self) -> list[dict[str, Any]]:
        out = []
        for cluster in self.clusters:
            for role, stream in CONSUMERS:
                name = durable_name(role, cluster)
                try:
                    info = await self.bus.js.consumer_info(stream, name, timeout=1.0)
                except Exception:  # not created yet
                    continue
                out.append({"cluster": cluster, "consumer": name, "pending": info.num_pending or 0,
                            "ack_pending": info.num_ack_pending or 0, "redelivered": info.num_redelivered or 0})
        return out
