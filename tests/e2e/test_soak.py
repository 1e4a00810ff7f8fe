"""The multi-cluster soak at small size (bench/soak.py runs it at 1,000 TrainJobs).

`trainyard up --workers 2 --nats-cluster 3`; 30 delegated TrainJobs (two of them suspended)
submitted to the manager and relabelled while services of every cluster, one NATS node and one
worker's devcluster (its process group, held down past the lost timeout) are SIGKILLed. Every
TrainJob converges to its expected state on exactly one worker with its status mirrored, the
lost worker's stale copies are gone once it is back, nothing is dead-lettered, and the client
saw no API error. Faults and checks: tests/fixtures/soak.py.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from fixtures.soak import Soak, SoakConfig, Submitted, check
from fixtures.stack import skip_unless_stack_available, start_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

LOST_TIMEOUT_S = 4


def test_delegated_trainjobs_converge_while_processes_are_killed(tmp_path: Path) -> None:
    skip_unless_stack_available(("watcher", "planner", "applier", "status", "dispatcher"))
    stack = start_stack(tmp_path / "data", "--workers", "2", "--nats-cluster", "3",
                        "--worker-lost-timeout", str(LOST_TIMEOUT_S), timeout=300)
    try:
        config = SoakConfig(trainjobs=30, suspended_every=15, concurrency=4, kill_interval_s=2.0, nats_kills=1,
                            worker_outage=True, lost_timeout_s=LOST_TIMEOUT_S, min_chaos_s=15,
                            converge_budget_s=180)
        report = asyncio.run(Soak(stack, config).run())
    finally:
        stack.stop()
        stack.kill()
    assert stack.survivors() == []
    assert report.errors == []                     # 0 client-visible errors on the manager
    assert report.accepted == 30
    assert report.violations == [] and report.converged_after_s is not None
    assert report.states == {"Complete": 28, "Suspended": 2}
    assert report.dead_letter_lines == []
    killed = set(report.kills)
    outage = f"{report.outage_worker}-devcluster"
    assert outage in killed and report.restarts.get(outage, 0) >= 1    # back with its data
    # The outage took a worker holding a suspended TrainJob (it never finishes): re-dispatched
    # off the lost worker, whose copy the sweep removed once it was back (check() above).
    assert report.redispatched >= 1
    assert killed & {"nats", "nats-2", "nats-3"}
    # services of every cluster were killed (the dispatcher counts as the manager's)
    services = killed - {outage, "nats", "nats-2", "nats-3"}
    assert {"-".join(t.split("-")[:2]) if t.startswith("worker-") else "manager" for t in services} \
        == {"manager", "worker-1", "worker-2"}


def _tj(name: str, uid: str, worker: str | None, *conditions: tuple[str, str]) -> dict:
    meta = {"name": name, "uid": uid, "labels": {"soak.trainyard.dev/updated": "1"}, "annotations": {}}
    if worker:
        meta["annotations"]["trainyard.kubeflow.org/worker-cluster"] = worker
    return {"metadata": meta, "status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def _copy(name: str, uid: str, *conditions: tuple[str, str]) -> dict:
    return {"metadata": {"name": name, "annotations": {"trainyard.kubeflow.org/origin-uid": uid}},
            "status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def test_the_soak_check_names_each_broken_guarantee() -> None:
    """The checker the soak relies on: a converged snapshot passes, each broken guarantee is named."""
    sent = {"a": Submitted("a", "u1", False, True), "b": Submitted("b", "u2", True, True)}
    dispatched_1 = {"type": "Dispatched", "status": "True", "message": "dispatched to worker cluster worker-1"}
    a = _tj("a", "u1", "worker-1", ("Complete", "True"))
    a["status"]["conditions"].insert(0, dispatched_1)
    b = _tj("b", "u2", "worker-1", ("Suspended", "True"))
    b["status"]["conditions"].insert(0, dispatched_1)
    copies = {"worker-1": {"a": _copy("a", "u1", ("Complete", "True")), "b": _copy("b", "u2", ("Suspended", "True"))},
              "worker-2": {}}
    assert check(sent, {"a": a, "b": b}, copies) == []
    assert check(sent, {"b": b}, copies) == ["a: lost (not on the manager)"]
    stale = {**copies, "worker-2": {"a": _copy("a", "u1", ("Complete", "True"))}}
    assert check(sent, {"a": a, "b": b}, stale) == ["a: stale copy on worker-2 (the manager points at worker-1)"]
    unmirrored = {**copies, "worker-1": {**copies["worker-1"], "a": _copy("a", "u1", ("Failed", "True"))}}
    assert check(sent, {"a": a, "b": b}, unmirrored) == ["a: manager status is not the copy's on worker-1"]
    wrong_uid = {**copies, "worker-1": {**copies["worker-1"], "a": _copy("a", "old", ("Complete", "True"))}}
    assert check(sent, {"a": a, "b": b}, wrong_uid) == ["a: no copy with the manager's uid on worker-1"]
    relabelled = _tj("a", "u1", "worker-1", ("Complete", "True"))
    relabelled["status"]["conditions"].insert(0, dispatched_1)
    relabelled["metadata"]["labels"] = {}
    assert check(sent, {"a": relabelled, "b": b}, copies) == ["a: label update lost (labels {})"]
    running = _tj("a", "u1", "worker-1")
    running["status"]["conditions"].insert(0, dispatched_1)
    assert "a: Running, expected Complete" in check(sent, {"a": running, "b": b}, copies)
