"""What the dashboard shows, kept live from the bus.

TrainJobs come from the snapshot bucket at start and then from the events stream (a plain
NATS subscription to ``ty.events.<cluster>.TrainJob``/``JobSet``: the dashboard never takes
messages from a durable consumer). Plans (``ty.desired``) and apply results (``ty.results``) are
watched the same way to time each TrainJob's hops: created → observed → planned → applied →
running → finished (and suspended/resumed as they happen). Progress reports (``ty.progress``)
are followed the same way; a TrainJob's earlier reports are read back from the ``TY_PROGRESS``
stream when a page asks (``trainyard.bus.progress``). Every change is pushed to the connected
browsers (server-sent events), with the stack's throughput and latency series and, with
worker clusters, each worker's state and capacity.
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

from trainyard.bus.backlog import CONSUMERS, read_backlogs
from trainyard.bus.envelopes import ApplyResult, EnvelopeError, ObjectEvent, ProgressReport, decode
from trainyard.bus.progress import read_history
from trainyard.bus.session import BusSession
from trainyard.bus.subjects import (
    EVENTS_PREFIX, PLANS_PREFIX, PROGRESS_PREFIX, RESULTS_PREFIX, ObjectKey, encode_token, key_from_subject,
)
from trainyard.bus.topology import durable_name
from trainyard.clock import parse_epoch
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.multicluster.delegation import WORKER_ANNOTATION
from trainyard.multicluster.placement import node_allocatable, pods_in_use
from trainyard.pipeline.trainjobs import finished_condition, owner_reference, state_of
from trainyard.roles import CONTROL_PLANE_ROLES
from trainyard_services.dashboard.charts import Lifetime, progress_point, stack_series, worker_row

log = logging.getLogger(__name__)

STAGES = ("created", "observed", "planned", "applied", "running", "finished")
SERVICE_NAMES = CONTROL_PLANE_ROLES


@dataclass(frozen=True)
class StepReport:
    """What a trainer's report says of its step: when it reported (``lastUpdatedTime``), the
    step it was at (metric ``step``) and, for a run that went on from a checkpoint, the step it
    went on from (metric ``resumedFromStep``)."""

    at: float
    step: int | None
    resumed_from: int | None


def step_report(trainer_status: dict[str, Any]) -> StepReport | None:
    """The step facts of one ``status.trainerStatus`` (None: it names no step)."""
    metrics = {m.get("name"): m.get("value") for m in trainer_status.get("metrics") or []
               if isinstance(m, dict)}
    at = parse_epoch(trainer_status.get("lastUpdatedTime"))
    step, resumed_from = _int(metrics.get("step")), _int(metrics.get("resumedFromStep"))
    if at is None or (step is None and resumed_from is None):
        return None
    return StepReport(at, step, resumed_from)


# Reports kept per TrainJob for the notes' steps: enough for any number of interruptions of a
# trainer that reports at most once a second (the oldest go first).
MAX_STEP_REPORTS = 4096
# How far a pod's clock (``lastUpdatedTime``, whole seconds) may lag the dashboard's when a
# report is matched with a resume the dashboard saw.
CLOCK_SLACK_S = 1.0
# After the last snapshot asked (a browser that polls, a script), the probes keep running this
# long; a browser on the live stream keeps them running as long as it stays.
WATCH_WINDOW_S = 60.0


def note_steps(notes: list[dict[str, Any]], reports: list[StepReport]) -> list[int | None]:
    """The step of each suspended/resumed note (in ``notes``' order), from every report seen,
    whatever order the notes and the reports arrived in: a suspension shows the last step its
    run reported before the resume (the report sent while stopping often lands after the
    Suspended condition), a resume the ``resumedFromStep`` of the first report of the run it
    started. A run is told from the others by its ``resumedFromStep`` (a checkpoint-aware
    trainer reports it in every report; docs/preemption.md) and by time: the first report of a
    resumed run can be written before the dashboard sees the TrainJob leave Suspended."""
    order = sorted(range(len(notes)), key=lambda i: notes[i]["at"])
    steps: list[int | None] = [None] * len(notes)
    if not order:
        return steps
    # The run in progress at the first note: the one the reports before it belong to (a
    # dashboard started after a resume sees that run's resumedFromStep, not None).
    before = [report for report in reports if report.at <= notes[order[0]]["at"]]
    run_from = max(before, key=lambda report: report.at).resumed_from if before else None
    run_start = float("-inf")         # when that run began, as the dashboard saw it
    for position, i in enumerate(order):
        note = notes[i]
        if note["stage"] == "suspended":
            resume = next((notes[j]["at"] for j in order[position + 1:] if notes[j]["stage"] == "resumed"), None)
            seen = [report.step for report in reports
                    if report.step is not None and report.resumed_from == run_from
                    and report.at >= run_start - CLOCK_SLACK_S and (resume is None or report.at < resume)]
            steps[i] = max(seen) if seen else None
        elif note["stage"] == "resumed":
            suspended_at = max((notes[j]["at"] for j in order[:position] if notes[j]["stage"] == "suspended"),
                               default=float("-inf"))
            later = sorted((report for report in reports
                            if report.resumed_from is not None and report.at >= suspended_at - CLOCK_SLACK_S
                            and (report.resumed_from != run_from or report.at >= note["at"] - CLOCK_SLACK_S)),
                           key=lambda report: report.at)
            steps[i] = later[0].resumed_from if later else None
            run_from, run_start = steps[i], note["at"]
    return steps


@dataclass
class Timeline:
    """One TrainJob's path: the ``STAGES`` (each reached once, at its first time) and notes,
    moments that may repeat (suspended, resumed; ``detail`` says the step: where the trainer
    stopped, where a resumed trainer went on from). ``live`` names the stages seen as they
    happened, not inferred from the object when the dashboard started (only those time the
    create → running chart). ``reports`` are the trainer's step reports seen so far, from the
    TrainJob's status and from the progress stream, from which the notes' steps are derived."""

    stages: dict[str, float] = field(default_factory=dict)
    notes: list[dict[str, Any]] = field(default_factory=list)
    live: set[str] = field(default_factory=set)
    reports: list[StepReport] = field(default_factory=list)

    def mark(self, stage: str, at: float | None = None, live: bool = True) -> bool:
        if stage in self.stages:
            return False
        self.stages[stage] = at if at is not None else time.time()
        if live:
            self.live.add(stage)
        return True

    def note(self, stage: str, at: float | None = None) -> None:
        self.notes.append({"stage": stage, "at": at if at is not None else time.time(), "detail": "",
                           "step": None})
        self._derive_steps()

    def note_step(self, trainer_status: dict[str, Any]) -> bool:
        """Takes one trainer report (``status.trainerStatus`` or a progress report's fields);
        True when a note's step changed."""
        report = step_report(trainer_status)
        if report is None or report in self.reports:
            return False
        self.reports.append(report)
        if len(self.reports) > MAX_STEP_REPORTS:
            del self.reports[0]
        return self._derive_steps()

    def _derive_steps(self) -> bool:
        changed = False
        for note, step in zip(self.notes, note_steps(self.notes, self.reports)):
            if step != note["step"]:
                changed = True
                note["step"] = step
                note["detail"] = "" if step is None else \
                    (f"at step {step}" if note["stage"] == "suspended" else f"from step {step}")
        return changed

    def lifetime(self) -> Lifetime:
        return Lifetime(created=self.stages.get("created"),
                        running=self.stages.get("running") if "running" in self.live else None,
                        finished=self.stages.get("finished"))

    def to_json(self) -> list[dict[str, Any]]:
        """Each known stage with its time and the hop latency from the stage before it, and the
        notes among them in time order."""
        out, previous = [], None
        for stage in STAGES:
            at = self.stages.get(stage)
            if at is None:
                continue
            out.append({"stage": stage, "at": at,
                        "hop_s": round(max(at - previous, 0.0), 3) if previous is not None else None})
            previous = at
        for note in sorted(self.notes, key=lambda note: note["at"]):
            index = next((i for i, entry in enumerate(out) if entry["at"] > note["at"]), len(out))
            out.insert(index, {"stage": note["stage"], "at": note["at"], "hop_s": None, "detail": note["detail"],
                               "step": note["step"]})
        return out


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def suspended_since(status: dict[str, Any]) -> float | None:
    condition = next((c for c in status.get("conditions") or []
                      if c.get("type") == "Suspended" and c.get("status") == "True"), None)
    return parse_epoch(condition.get("lastTransitionTime")) if condition is not None else None


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
        # A manager's delegated TrainJob: the worker whose copy trains (and reports progress).
        "worker": (meta.get("annotations") or {}).get(WORKER_ANNOTATION, ""),
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
        self.stack: dict[str, Any] = stack_series([], time.time())
        self.workers: list[dict[str, Any]] = []
        self._states: dict[str, str] = {}  # by TrainJob uid: the state last shown
        # By TrainJob uid: the newest resourceVersion taken. A JobSet event re-reads its TrainJob
        # from the snapshot bucket while TrainJob events go on being handled (two subscriptions,
        # each its own task): an answer older than what was shown must not turn the state back.
        self._versions: dict[str, int] = {}
        self._listeners: set[asyncio.Queue[tuple[str, Any]]] = set()
        # The probes (services, backlog, workers, the stack's window) run while someone looks:
        # a browser on the live stream, or a snapshot asked within WATCH_WINDOW_S. Unwatched they
        # wait for the next look instead of polling (an idle stack's dashboard probed every
        # service and listed every consumer every 2 s for no one).
        self._asked_at = float("-inf")
        self._asked = asyncio.Event()
        self._rounds: dict[str, int] = {}  # per probe loop: rounds done (a snapshot waits for one)
        self._subscriptions: list[Any] = []
        self._runtimes: dict[tuple[str, str, str], dict[str, Any]] = {}

    # -- the browsers ----------------------------------------------------------------------

    def listen(self) -> asyncio.Queue[tuple[str, Any]]:
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(maxsize=1000)
        self._listeners.add(queue)
        self._ask()
        return queue

    def watched(self) -> bool:
        return bool(self._listeners) or time.monotonic() - self._asked_at < WATCH_WINDOW_S

    def _ask(self) -> None:
        self._asked_at = time.monotonic()
        self._asked.set()

    async def fresh_snapshot(self, timeout_s: float = 5.0) -> dict[str, Any]:
        """The snapshot, with the probes brought up to date first when nobody was watching
        (they were paused): each probe loop finishes one round after this ask, or ``timeout_s``."""
        paused = not self.watched()
        before = dict(self._rounds)
        self._ask()
        if paused:
            deadline = time.monotonic() + timeout_s
            while any(self._rounds.get(name, 0) <= done for name, done in before.items()) \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        return self.snapshot()

    async def _next_round(self, name: str, stop: asyncio.Event, interval_s: float) -> None:
        """Between two rounds of probe loop ``name``: ``interval_s`` while watched; unwatched,
        until someone looks again."""
        self._rounds[name] = self._rounds.get(name, 0) + 1
        try:
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        except asyncio.TimeoutError:
            pass
        while not self.watched() and not stop.is_set():
            self._asked.clear()
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._asked.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()

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
                "services": self.services, "consumers": self.consumers, "clusters": self.clusters,
                "stack": self.stack, "workers": self.workers}

    # -- the bus ---------------------------------------------------------------------------

    async def start(self) -> None:
        nc = self.bus.nc
        for cluster in self.clusters:
            token = encode_token(cluster)
            for kind in ("TrainJob", "JobSet", "ClusterTrainingRuntime", "TrainingRuntime"):
                self._subscriptions.append(await nc.subscribe(f"{EVENTS_PREFIX}.{token}.*.{kind}.*.*",
                                                              cb=self._on_event))
            self._subscriptions.append(await nc.subscribe(f"{PLANS_PREFIX}.{token}.>", cb=self._on_plan))
            self._subscriptions.append(await nc.subscribe(f"{RESULTS_PREFIX}.{token}.>", cb=self._on_result))
            self._subscriptions.append(await nc.subscribe(f"{PROGRESS_PREFIX}.{token}.>", cb=self._on_progress))
        # Subscribed first, then loaded: nothing falls between the two.
        for cluster in self.clusters:
            for kind in ("ClusterTrainingRuntime", "TrainingRuntime"):
                for runtime in await self.bus.snapshots.list(cluster, kind):
                    meta = runtime.get("metadata") or {}
                    self._runtimes[(cluster, meta.get("namespace") or "", meta.get("name", ""))] = runtime
            for trainjob in await self.bus.snapshots.list(cluster, "TrainJob"):
                self._update(cluster, trainjob, observed_at=None, live=False)
        self.stack = stack_series(self.lifetimes(), time.time())

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

    def _update(self, cluster: str, trainjob: dict[str, Any], observed_at: float | None, live: bool = True) -> None:
        """``live``: the change happens now (an event); False while loading what the bus held
        at start, when only the object's own timestamps are known."""
        row = row_of(cluster, trainjob, self._runtime_for(cluster, trainjob))
        if self._older(row["uid"], (trainjob.get("metadata") or {}).get("resourceVersion")):
            return
        timeline = self.timelines.setdefault(row["uid"], Timeline())
        status = trainjob.get("status") or {}
        created = parse_epoch(row["created"])
        if created is not None:
            timeline.mark("created", created)
        if observed_at is not None:
            timeline.mark("observed", observed_at)
        if live and row["state"] in ("Running", "Complete", "Failed") \
                and (row["active"] or row["succeeded"] or row["failed"]):
            timeline.mark("running", observed_at)
        finished = finished_condition(status)
        if finished is not None:
            timeline.mark("finished", parse_epoch(finished.get("lastTransitionTime")) or observed_at, live=live)
        self._note_transition(timeline, row["uid"], row["state"], status, observed_at if live else None)
        timeline.note_step(status.get("trainerStatus") or {})
        row["timeline"] = timeline.to_json()
        if self.rows.get(row["key"]) != row:
            self.rows[row["key"]] = row
            self._push("trainjob", row)

    def _older(self, uid: str, resource_version: Any) -> bool:
        """True for a copy of the TrainJob older than one already shown; remembers the newest.
        resourceVersions are compared as numbers where both are (devcluster's and etcd's are);
        an opaque one is always taken."""
        version = _int(resource_version)
        if not uid or version is None:
            return False
        if version < self._versions.get(uid, -1):
            return True
        self._versions[uid] = version
        return False

    def _note_transition(self, timeline: Timeline, uid: str, state: str, status: dict[str, Any],
                         at: float | None) -> None:
        """Suspended and resumed as notes on the timeline (they may repeat)."""
        before = self._states.get(uid)
        self._states[uid] = state
        if state == "Suspended" and before != "Suspended":
            timeline.note("suspended", suspended_since(status) or at)
        elif before == "Suspended" and state != "Suspended":
            timeline.note("resumed", at)

    def lifetimes(self) -> list[Lifetime]:
        return [timeline.lifetime() for timeline in self.timelines.values()]

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
                    self._states.pop(event.uid, None)
                    self._versions.pop(event.uid, None)
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
        try:
            found = key_from_subject(subject)
        except ValueError:
            return
        key = f"{found.cluster}/{found.namespace}/{found.name}"
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

    async def _on_progress(self, msg: Any) -> None:
        try:
            report = decode(ProgressReport, msg.data)
        except EnvelopeError:
            return
        key = f"{report.cluster}/{report.namespace}/{report.name}"
        self._push("progress", {"key": key, "uid": report.uid, "point": progress_point(report)})
        # Each report also reaches the timeline here, not only through the TrainJob's status,
        # which shows the last report only: the one sent while stopping stays known even when
        # a later write replaced it before the dashboard read the TrainJob.
        row, timeline = self.rows.get(key), self.timelines.get(report.uid)
        if row is not None and row["uid"] == report.uid and timeline is not None and timeline.note_step(
                {"lastUpdatedTime": report.last_updated_time,
                 "metrics": [{"name": m.name, "value": m.value} for m in report.metrics]}):
            row = dict(row, timeline=timeline.to_json())
            self.rows[key] = row
            self._push("trainjob", row)

    async def progress(self, cluster: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One TrainJob's progress history as kept on the bus (None: no such TrainJob).

        A manager's delegated TrainJob trains as a copy on its worker (same namespace and name,
        its own uid), whose trainer reports to the worker's endpoint: its history is the copy's.
        ``source`` and ``source_uid`` say whose reports these are, for the live ones to match."""
        row = self.rows.get(f"{cluster}/{namespace}/{name}")
        if row is None:
            return None
        source = self.rows.get(f"{row['worker']}/{namespace}/{name}") if row.get("worker") else None
        source = source or row
        reports = await read_history(self.bus.js, source["cluster"], namespace, name, uid=source["uid"] or None)
        return {"key": row["key"], "uid": row["uid"], "source": source["key"], "source_uid": source["uid"],
                "points": [progress_point(report) for report in reports]}

    # -- the stack and its workers ------------------------------------------------------------

    async def watch_stack(self, stop: asyncio.Event, interval_s: float = 2.0) -> None:
        """TrainJobs created and finished per second, create → running latency: recomputed
        every ``interval_s`` (the window moves even when nothing happens)."""
        while not stop.is_set():
            stack = stack_series(self.lifetimes(), time.time())
            if stack != self.stack:
                self.stack = stack
                self._push("stack", stack)
            await self._next_round("stack", stop, interval_s)

    async def watch_workers(self, stop: asyncio.Event, kube_for: Any, interval_s: float = 3.0) -> None:
        """The manager's MultiKueueClusters (the first cluster is the manager): each worker's
        Active condition, its capacity (nodes and pods read from the worker's API server when
        the dashboard has a client for it) and its TrainJobs."""
        manager = kube_for(self.clusters[0]) if self.clusters else None
        while manager is not None and not stop.is_set():
            try:
                workers = await self._workers(manager, kube_for)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - shown as stale, tried again
                log.debug("worker probe failed: %s", describe(err))
            else:
                if workers != self.workers:
                    self.workers = workers
                    self._push("workers", workers)
            await self._next_round("workers", stop, interval_s)

    async def _workers(self, manager: KubeClient, kube_for: Any) -> list[dict[str, Any]]:
        try:
            listed = await manager.request("GET", r.MULTIKUEUE_CLUSTER.path(), timeout_s=5.0)
        except KubeError as err:
            if err.not_found:  # no MultiKueueCluster kind: a stack without workers
                return []
            raise
        declared = sorted((item.get("metadata") or {}).get("name", "") for item in listed.get("items") or [])
        conditions = {(item.get("metadata") or {}).get("name", ""): next(
            (c for c in (item.get("status") or {}).get("conditions") or [] if c.get("type") == "Active"), None)
            for item in listed.get("items") or []}

        async def one(name: str) -> dict[str, Any]:
            allocatable = used = None
            client = kube_for(name)
            if client is not None:
                try:
                    nodes, pods = await asyncio.gather(client.request("GET", "/api/v1/nodes", timeout_s=5.0),
                                                       client.request("GET", "/api/v1/pods", timeout_s=5.0))
                    allocatable = node_allocatable(nodes.get("items") or [])
                    used = pods_in_use(pods.get("items") or [])
                except KubeError as err:
                    log.debug("capacity of worker %s unknown: %s", name, describe(err))
            states: dict[str, int] = {}
            for row in self.rows.values():
                if row["cluster"] == name:
                    states[row["state"]] = states.get(row["state"], 0) + 1
            return worker_row(name, conditions.get(name), allocatable, used, states)

        return list(await asyncio.gather(*(one(name) for name in declared)))

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
                await self._next_round("services", stop, interval_s)

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
        """Each role's backlog per cluster: its partitions' consumers added up (one listing
        request per stream, not one per partition: trainyard.bus.backlog)."""
        found = {(b.consumer, b.cluster): b for b in await read_backlogs(self.bus.js)}
        out = []
        for cluster in self.clusters:
            for role, _ in CONSUMERS:
                backlog = found.get((role, cluster))
                if backlog is None:
                    continue
                out.append({"cluster": cluster, "consumer": durable_name(role, cluster),
                            "pending": backlog.pending, "ack_pending": backlog.ack_pending,
                            "redelivered": backlog.redelivered})
        return out
