"""What the dashboard's charts plot, computed from what it knows (pure: no I/O).

- one TrainJob: each progress report as a point (time, progress, each metric as a number);
- the stack: TrainJobs created and finished per second over the last minutes, and each
  TrainJob's create → running latency, placed at the moment it started running;
- the workers of a manager: Active or not, capacity used and free, their TrainJobs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable, Mapping

from trainyard.bus.envelopes import ProgressReport

STACK_WINDOW_S = 600  # the stack charts show the last ten minutes
STACK_BUCKET_S = 10  # in buckets of ten seconds (rates are per second: count / bucket)
# The resources shown per worker, in this order, when the worker's nodes have them.
WORKER_RESOURCES = ("cpu", "memory", "nvidia.com/gpu", "pods")


def metric_number(value: str) -> float | None:
    """A metric's value as a number for the chart (upstream's values are strings: "0.25",
    "1e-3"); None for text that is no finite number, which the chart leaves out."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def progress_point(report: ProgressReport) -> dict[str, Any]:
    """One report as the browser plots it; ``rv`` (the TrainJob's resourceVersion after the
    write) tells a report apart from a repeated delivery of the same one."""
    return {"rv": report.resource_version, "at": report.at, "progress": report.progress_percentage,
            "eta": report.estimated_remaining_seconds,
            "metrics": {m.name: metric_number(m.value) for m in report.metrics}}


@dataclass(frozen=True)
class Lifetime:
    """When one TrainJob was created, first seen running and finished (seconds since the epoch)."""

    created: float | None
    running: float | None = None
    finished: float | None = None


def stack_series(lifetimes: Iterable[Lifetime], now: float, window_s: int = STACK_WINDOW_S,
                 bucket_s: int = STACK_BUCKET_S) -> dict[str, Any]:
    """Created and finished per second in each bucket of the window (``t``: each bucket's end),
    and the create → running latency of each TrainJob that started running in the window."""
    buckets = window_s // bucket_s
    end = math.floor(now / bucket_s) * bucket_s + bucket_s  # the current bucket's end
    start = end - buckets * bucket_s
    created = [0] * buckets
    finished = [0] * buckets
    latency: list[tuple[float, float]] = []

    def count(into: list[int], at: float | None) -> None:
        if at is not None and start <= at < end:
            into[int((at - start) // bucket_s)] += 1

    for lifetime in lifetimes:
        count(created, lifetime.created)
        count(finished, lifetime.finished)
        if lifetime.created is not None and lifetime.running is not None and start <= lifetime.running < end:
            latency.append((lifetime.running, max(lifetime.running - lifetime.created, 0.0)))
    latency.sort()
    return {"window_s": window_s, "bucket_s": bucket_s,
            "t": [start + (i + 1) * bucket_s for i in range(buckets)],
            "created_per_s": [round(n / bucket_s, 3) for n in created],
            "finished_per_s": [round(n / bucket_s, 3) for n in finished],
            "latency": {"at": [at for at, _ in latency], "seconds": [round(s, 3) for _, s in latency]}}


def _number(amount: Fraction, resource: str) -> float:
    """CPU in cores, memory in GiB, the rest as counts."""
    value = float(amount)
    return round(value / 2**30, 3) if resource == "memory" else round(value, 3)


def worker_row(name: str, active: Mapping[str, Any] | None, allocatable: Mapping[str, Fraction] | None,
               used: Mapping[str, Fraction] | None, trainjobs: Mapping[str, int]) -> dict[str, Any]:
    """One worker as the dashboard shows it: its ``Active`` condition (as the dispatcher wrote
    it on the MultiKueueCluster), capacity used and free per resource (None when its nodes
    and pods could not be read), and its TrainJobs by state."""
    capacity: dict[str, dict[str, float]] | None = None
    if allocatable is not None and used is not None:
        capacity = {}
        for resource in WORKER_RESOURCES:
            total = allocatable.get(resource)
            if total is None or total <= 0:
                continue
            taken = min(used.get(resource, Fraction(0)), total)
            capacity[resource] = {"used": _number(taken, resource), "free": _number(total - taken, resource),
                                  "total": _number(total, resource)}
    active = active or {}
    return {"name": name, "active": active.get("status") == "True", "reason": active.get("reason", ""),
            "message": active.get("message", ""), "capacity": capacity, "trainjobs": dict(sorted(trainjobs.items())),
            "total_trainjobs": sum(trainjobs.values())}
