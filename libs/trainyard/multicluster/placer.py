"""Choosing a worker for a delegated TrainJob and holding its slots there (docs/multicluster.md,
"Placement").

What a decision reads: the TrainJob's requests (planned with the manager's copy of its
runtime), which active workers have the runtime, each worker's capacity summary (kept from
its watches by the registry) and the holds of the shared ``ty_slots`` entry. The choice itself
is trainyard.multicluster.placement's (pure); this module does the lookups it needs, caches
them, and takes the hold with compare-and-set, trying the next worker when another replica
took the room first.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.multicluster.placement import REASON_NO_CAPACITY, Amounts, Placement, Worker, choose_worker, \
    plan_requests, render_amounts, unheld_use
from trainyard.multicluster.registry import WorkerRegistry, WorkerState
from trainyard.multicluster.slots import Reservation, SlotLedger, hold_key
from trainyard.pipeline.curve_keys import deferred_curve_key
from trainyard.pipeline.errors import PlanningError
from trainyard.pipeline.planning import plan
from trainyard.pipeline.ssh_keys import deferred_ssh_key

log = logging.getLogger(__name__)

# How long a runtime lookup (on the manager for requests, on a worker for presence) is reused:
# a burst of TrainJobs for one runtime asks once, a new runtime is seen within seconds.
RUNTIME_CACHE_S = 2.0
# Decision times kept for benchmarks (bench/multicluster.py --only placement).
DECISIONS_KEPT = 10000


def trainjob_key(trainjob: dict[str, Any]) -> tuple[str, str]:
    return trainjob["metadata"]["namespace"], trainjob["metadata"]["name"]


@dataclass
class Placer:
    """One process's placement: lookups cached here, holds shared on the bus (``slots``)."""

    manager: KubeClient
    cluster: str
    registry: WorkerRegistry
    slots: SlotLedger
    # Per worker: (summary generation, holds removed, use of the pods of no held TrainJob).
    _unheld: dict[str, tuple[int, int, Amounts]] = field(default_factory=dict)
    _runtimes: dict[tuple, tuple[float, Any]] = field(default_factory=dict)  # key -> (expiry, answer)
    _runtime_lookups: dict[tuple, asyncio.Future] = field(default_factory=dict)  # key -> the GET in flight
    placement_seconds: list[float] = field(default_factory=list)  # the last decisions' times

    async def runtime(self, cluster: str, client: KubeClient, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        """The TrainJob's runtime on one cluster (None when absent), looked up at most once per
        RUNTIME_CACHE_S for each cluster and runtime."""
        ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        resource = r.TRAINING_RUNTIME if kind == "TrainingRuntime" else r.CLUSTER_TRAINING_RUNTIME
        runtime_ns = trainjob["metadata"]["namespace"] if kind == "TrainingRuntime" else None
        key = (cluster, kind, runtime_ns, ref.get("name") or "")
        cached = self._runtimes.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        # One lookup in flight per cluster and runtime: a resync reconciles hundreds of waiting
        # TrainJobs at once, and as many GETs at once made a loaded API server time them out.
        pending = self._runtime_lookups.get(key)
        if pending is None:
            pending = self._runtime_lookups[key] = asyncio.ensure_future(
                self._look_up(key, client, resource, runtime_ns, ref.get("name") or ""))
        return await asyncio.shield(pending)

    async def _look_up(self, key: tuple, client: KubeClient, resource: r.Resource,
                       namespace: str | None, name: str) -> dict[str, Any] | None:
        """The GET behind runtime(). Its answer is kept before the lookup stops being "in flight":
        kept by its waiters instead, a caller arriving between the two would ask again."""
        try:
            # A failed lookup raises (unknown is not absent) and is not kept: asked again next time.
            runtime = await client.get(resource, namespace, name, timeout_s=5.0)
            self._runtimes[key] = (time.monotonic() + RUNTIME_CACHE_S, runtime)
            return runtime
        finally:
            self._runtime_lookups.pop(key, None)

    def forget_runtimes(self) -> None:
        """Every cached runtime answer is asked again at its next use."""
        self._runtimes.clear()

    async def requests(self, trainjob: dict[str, Any]) -> Amounts:
        """What the TrainJob's pods will request, planned with the manager's copy of its runtime.
        Raises KubeError when the manager cannot tell (e.g. a timeout under load): counting such a
        TrainJob as requesting nothing would let every placement after it overcommit its worker."""
        runtime = await self.runtime(self.cluster, self.manager, trainjob)
        if runtime is None:
            return {}
        try:
            return plan_requests(plan(trainjob, runtime, new_ssh_key=deferred_ssh_key,
                                      new_curve_key=deferred_curve_key).objects)
        except PlanningError:
            return {}  # the worker's trainyard reports the planning error on the copy

    async def has_runtime(self, worker: str, client: KubeClient, trainjob: dict[str, Any]) -> bool | None:
        """Whether the worker has the TrainJob's runtime; None when it did not say (a timeout)."""
        try:
            return await self.runtime(worker, client, trainjob) is not None
        except KubeError as err:
            log.debug("runtime lookup on %s failed: %s", worker, describe(err))
            return None

    def _unheld_use(self, worker: WorkerState) -> Amounts:
        """What the worker's pods of no held TrainJob request (held ones count whole, as held),
        recounted only when a new summary came or a hold went away."""
        entry = self.slots.cached(worker.name)
        known = self._unheld.get(worker.name)
        if known is None or known[:2] != (worker.generation, entry.removals):
            held = {tuple(key.split("/", 1)) for key in entry.holds}
            known = self._unheld[worker.name] = (worker.generation, entry.removals, unheld_use(worker.pod_use, held))
        return known[2]

    def view(self, worker: WorkerState, has_runtime: bool, held: Amounts | None = None) -> Worker:
        """The worker as placement sees it: allocatable, and in use what its other pods request
        plus what the held TrainJobs reserve, whether their pods exist yet or not."""
        used = dict(self._unheld_use(worker))
        for resource, amount in (self.slots.cached(worker.name).total if held is None else held).items():
            used[resource] = used.get(resource, 0) + amount
        return Worker(worker.name, worker.allocatable, used, has_runtime)

    def fits(self, worker: WorkerState, need: Amounts) -> Callable[[Amounts], bool]:
        """For the ledger's compare-and-set: whether ``need`` fits beside the holds it read."""
        return lambda held: self.view(worker, True, held).fits(need)

    def no_room(self, worker: str, need: Amounts) -> str:
        """Why a resumed TrainJob stays suspended on ``worker``."""
        state = self.registry.workers.get(worker)
        free = render_amounts(self.view(state, True).free()) if state is not None else ""
        return (f"worker cluster {worker} has no free capacity for {render_amounts(need)} "
                f"(free {free or 'nothing'}), nor any other worker; the TrainJob stays suspended there until one has")

    async def choose_and_hold(self, trainjob: dict[str, Any], need: Amounts, suspended: bool,
                              exclude: str | None = None) -> tuple[Placement, bool, bool]:
        """The worker chosen (with ``need`` held there unless ``suspended``), or why none;
        whether a worker could not say if it has the runtime; and whether this pass took the
        hold (rather than finding it held by a pass racing this one)."""
        key = trainjob_key(trainjob)
        runtime = ((trainjob.get("spec") or {}).get("runtimeRef") or {}).get("name") or ""
        active = [w for w in self.registry.active() if w.name != exclude]
        presence = await asyncio.gather(*(self.has_runtime(w.name, w.client, trainjob) for w in active))
        candidates = [(w, has) for w, has in zip(active, presence) if has is not None]
        refused: set[str] = set()
        took = False
        while True:
            began = time.perf_counter()
            placement = choose_worker(need, [self.view(w, has) for w, has in candidates if w.name not in refused],
                                      runtime, spread_key=hold_key(*key) if suspended else None)
            self._timed(time.perf_counter() - began)
            if placement.worker is None or suspended:
                break
            # The hold is taken before the placement is written (and given back if the write
            # fails); a replica that took the room first makes it fail: choose again.
            chosen = next(w for w, _ in candidates if w.name == placement.worker)
            reservation = await self.slots.reserve(chosen.name, hold_key(*key), need, self.fits(chosen, need))
            if reservation:
                took = reservation is Reservation.TOOK
                break
            refused.add(chosen.name)
        if placement.worker is None and refused:
            # Why not, over every worker as the holds just read show them.
            placement = choose_worker(need, [self.view(w, has) for w, has in candidates], runtime)
            if placement.worker is not None:  # its room went while this pass ran
                placement = Placement(None, REASON_NO_CAPACITY,
                                      f"no worker cluster has free capacity for {render_amounts(need)}; "
                                      "waiting for capacity")
        return placement, None in presence, took

    def _timed(self, seconds: float) -> None:
        self.placement_seconds.append(seconds)
        if len(self.placement_seconds) > DECISIONS_KEPT:
            del self.placement_seconds[:DECISIONS_KEPT // 2]
