"""Where a delegated TrainJob runs: runtime presence and free capacity decide (pure).

A worker's free capacity is what its Ready, schedulable nodes can allocate minus what its
non-terminal pods request, minus what TrainJobs already dispatched to it will request once
their pods exist (otherwise a burst would send every TrainJob to the worker that looked
emptiest before the first pod appeared). Of the workers that fit, the least loaded wins:
the one whose busiest resource would be least full after placing the TrainJob.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable, Mapping

from trainyard.apimachinery.quantity import QuantityError, parse_quantity
from trainyard.pipeline.resources import single_pod_requests

Amounts = dict[str, Fraction]

# Reasons of the manager's "Dispatched" condition while no worker is chosen.
REASON_NO_WORKER = "NoActiveWorker"
REASON_NO_RUNTIME = "RuntimeNotFound"
REASON_NO_CAPACITY = "InsufficientCapacity"


def _add(total: Amounts, more: Mapping[str, Fraction], factor: int = 1) -> None:
    for name, amount in more.items():
        total[name] = total.get(name, Fraction(0)) + amount * factor


def pod_requests(pod_spec: Mapping[str, Any]) -> Amounts:
    """One pod's effective requests (Kubernetes' rules), plus one of the node's ``pods``."""
    amounts = {name: quantity.value for name, quantity in single_pod_requests(pod_spec).items()}
    amounts["pods"] = Fraction(1)
    return amounts


def jobset_requests(jobset: Mapping[str, Any]) -> Amounts:
    """Everything a JobSet's pods request together: replicas × parallelism × one pod, summed
    over replicated jobs. Initializer jobs count too (they run before the trainer, but a worker
    that cannot hold them all at once is a poor pick anyway)."""
    total: Amounts = {}
    for replicated in (jobset.get("spec") or {}).get("replicatedJobs") or []:
        job_spec = ((replicated.get("template") or {}).get("spec")) or {}
        pods = int(replicated.get("replicas") or 1) * int(job_spec.get("parallelism") or 1)
        pod_spec = ((job_spec.get("template") or {}).get("spec")) or {}
        _add(total, pod_requests(pod_spec), pods)
    return total


def plan_requests(objects: Iterable[Mapping[str, Any]]) -> Amounts:
    """The requests of a planned TrainJob: its JobSet's pods (other objects request nothing)."""
    total: Amounts = {}
    for obj in objects:
        if obj.get("kind") == "JobSet":
            _add(total, jobset_requests(obj))
    return total


def _amounts(raw: Mapping[str, Any] | None) -> Amounts:
    amounts: Amounts = {}
    for name, value in (raw or {}).items():
        try:
            amounts[name] = parse_quantity(value).value
        except QuantityError:
            continue  # a resource we cannot read counts as absent, not as a crash
    return amounts


def node_allocatable(nodes: Iterable[Mapping[str, Any]]) -> Amounts:
    """What Ready, schedulable nodes can allocate, summed."""
    total: Amounts = {}
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        status = node.get("status") or {}
        ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
        if ready is not None and ready.get("status") != "True":
            continue
        _add(total, _amounts(status.get("allocatable") or status.get("capacity")))
    return total


def pods_in_use(pods: Iterable[Mapping[str, Any]], excluded: set[tuple[str, str]] = frozenset()) -> Amounts:
    """Requests of non-terminal pods, except those of TrainJobs in ``excluded``
    ((namespace, TrainJob name): already counted whole, see :func:`free_capacity`)."""
    total: Amounts = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        owner = (meta.get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name")
        if owner is not None and (meta.get("namespace") or "default", owner) in excluded:
            continue
        _add(total, pod_requests(pod.get("spec") or {}))
    return total


Owner = tuple[str, str] | None  # (namespace, JobSet name) of a pod; None for pods of no JobSet


def pod_use_by_owner(pods: Iterable[Mapping[str, Any]]) -> dict[Owner, Amounts]:
    """Requests of non-terminal pods summed per owning JobSet (a worker's JobSet is named as
    its TrainJob): the summary placement keeps of a worker instead of its pods."""
    use: dict[Owner, Amounts] = {}
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        meta = pod.get("metadata") or {}
        jobset = (meta.get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name")
        owner = (meta.get("namespace") or "default", jobset) if jobset is not None else None
        _add(use.setdefault(owner, {}), pod_requests(pod.get("spec") or {}))
    return use


def unheld_use(use: Mapping[Owner, Amounts], held: Iterable[tuple[str, str]] | set) -> Amounts:
    """What pods of owners not in ``held`` request (held TrainJobs count whole, as reserved)."""
    total: Amounts = {}
    for owner, amounts in use.items():
        if owner is None or owner not in held:
            _add(total, amounts)
    return total


@dataclass(frozen=True)
class Worker:
    """One Active worker as placement sees it."""

    name: str
    allocatable: Amounts
    used: Amounts
    has_runtime: bool

    def free(self) -> Amounts:
        return {name: amount - self.used.get(name, Fraction(0)) for name, amount in self.allocatable.items()}

    def fits(self, need: Mapping[str, Fraction]) -> bool:
        free = self.free()
        return all(amount <= free.get(name, Fraction(0)) for name, amount in need.items() if amount > 0)

    def load_after(self, need: Mapping[str, Fraction]) -> Fraction:
        """Fullness of the busiest resource once ``need`` is placed (0 = empty, 1 = full)."""
        fullest = Fraction(0)
        for name, amount in self.allocatable.items():
            if amount > 0:
                fullest = max(fullest, (self.used.get(name, Fraction(0)) + need.get(name, Fraction(0))) / amount)
        return fullest


@dataclass(frozen=True)
class Placement:
    worker: str | None
    reason: str
    message: str
    considered: dict[str, str] = field(default_factory=dict)  # worker -> why not


def render_amounts(amounts: Mapping[str, Fraction]) -> str:
    def one(name: str, amount: Fraction) -> str:
        if name == "cpu":
            return f"cpu={float(amount):g}"
        if name == "memory":
            return f"memory={float(amount) / 2**20:.0f}Mi"
        return f"{name}={float(amount):g}"

    return ", ".join(one(name, amounts[name]) for name in sorted(amounts) if amounts[name] > 0)


def _spread(key: str, worker: str) -> int:
    """A worker's rank for one TrainJob (rendezvous hashing): stable, so replicas agree."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{worker}".encode(), digest_size=8).digest(), "big")


def choose_worker(need: Mapping[str, Fraction], workers: Iterable[Worker], runtime: str,
                  spread_key: str | None = None) -> Placement:
    """The least-loaded Active worker that has the runtime and fits ``need``; else why not.
    Ties go to the first name, or with ``spread_key`` (a TrainJob's namespace/name) to the
    worker that key ranks first: TrainJobs that hold nothing (suspended) leave every worker's
    load as it was, and would otherwise all go to the first name."""
    candidates = sorted(workers, key=lambda w: w.name)
    if not candidates:
        return Placement(None, REASON_NO_WORKER, "no Active worker cluster to dispatch to")
    considered: dict[str, str] = {}
    fitting: list[Worker] = []
    for worker in candidates:
        if not worker.has_runtime:
            considered[worker.name] = f"runtime {runtime} not found"
        elif not worker.fits(need):
            considered[worker.name] = f"free {render_amounts(worker.free()) or 'nothing'}"
        else:
            fitting.append(worker)
    if fitting:
        best = min(fitting, key=lambda w: (w.load_after(need), _spread(spread_key, w.name) if spread_key else 0,
                                           w.name))
        return Placement(best.name, "Dispatched", f"dispatched to worker cluster {best.name}", considered)
    details = "; ".join(f"{name}: {why}" for name, why in considered.items())
    if all(not w.has_runtime for w in candidates):
        return Placement(None, REASON_NO_RUNTIME,
                         f"no Active worker cluster has runtime {runtime} ({details})", considered)
    return Placement(None, REASON_NO_CAPACITY,
                     f"no worker cluster has free capacity for {render_amounts(need)} ({details}); "
                     "waiting for capacity", considered)
