"""The dashboard's per-TrainJob timeline (services/dashboard/live.py): the stages reached once,
suspended/resumed notes as they repeat, and which times feed the create → running chart."""
from __future__ import annotations

from typing import Any

from trainyard_services.dashboard.live import Live, Timeline


def trainjob(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "job", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-11-26T06:00:00Z"},
            "spec": {"runtimeRef": {"name": "torch"}}, "status": status or {}}


RUNNING = {"jobsStatus": [{"name": "node", "active": 1}]}
def suspended(since: str) -> dict[str, Any]:
    return {"conditions": [{"type": "Suspended", "status": "True", "reason": "Suspended",
                            "lastTransitionTime": since}], "jobsStatus": [{"name": "node"}]}


COMPLETE = {"conditions": [{"type": "Complete", "status": "True", "reason": "JobSetCompleted",
                            "lastTransitionTime": "2026-11-26T06:01:00Z"}], "jobsStatus": [{"name": "node", "succeeded": 1}]}
T0 = 1795672800.0  # 2026-11-26T06:00:00Z


def test_suspend_and_resume_are_notes_in_time_order_and_may_repeat() -> None:
    live = Live(bus=None, clusters=["c"])  # type: ignore[arg-type] - _update touches no bus
    live._update("c", trainjob(), observed_at=T0 + 1)
    live._update("c", trainjob(RUNNING), observed_at=T0 + 10)
    live._update("c", trainjob(suspended("2026-11-26T06:00:20Z")), observed_at=T0 + 21)
    live._update("c", trainjob(RUNNING), observed_at=T0 + 30)
    live._update("c", trainjob(suspended("2026-11-26T06:00:40Z")), observed_at=T0 + 41)
    live._update("c", trainjob(RUNNING), observed_at=T0 + 45)
    live._update("c", trainjob(COMPLETE), observed_at=T0 + 61)
    entries = [(e["stage"], e["at"] - T0) for e in live.rows["c/ns/job"]["timeline"]]
    # A suspension is placed at its condition's time, a resumption when it was seen.
    assert entries == [("created", 0), ("observed", 1), ("running", 10), ("suspended", 20), ("resumed", 30),
                       ("suspended", 40), ("resumed", 45), ("finished", 60)]
    assert live.timelines["u1"].lifetime().running == T0 + 10


def test_a_note_carries_a_detail_and_sorts_among_the_stages() -> None:
    timeline = Timeline()
    timeline.mark("created", 100.0)
    timeline.mark("running", 110.0)
    timeline.note("resumed", 105.0)
    assert timeline.note_step({"lastUpdatedTime": "1970-01-01T00:01:47Z",
                               "metrics": [{"name": "step", "value": "121"}, {"name": "resumedFromStep", "value": "120"}]})
    assert timeline.to_json() == [
        {"stage": "created", "at": 100.0, "hop_s": None},
        {"stage": "resumed", "at": 105.0, "hop_s": None, "detail": "from step 120", "step": 120},
        {"stage": "running", "at": 110.0, "hop_s": 10.0}]


def test_what_the_bus_held_at_start_does_not_time_the_running_chart() -> None:
    live = Live(bus=None, clusters=["c"])  # type: ignore[arg-type]
    live._update("c", trainjob(COMPLETE), observed_at=None, live=False)
    lifetime = live.timelines["u1"].lifetime()
    assert (lifetime.created, lifetime.running, lifetime.finished) == (T0, None, T0 + 60)
    assert [e["stage"] for e in live.rows["c/ns/job"]["timeline"]] == ["created", "finished"]


def test_an_older_copy_read_after_a_newer_event_does_not_turn_the_state_back() -> None:
    """A JobSet event re-reads its TrainJob from the snapshot bucket while the TrainJob's own
    events go on being handled: a copy older than the one shown is not a resumption."""
    live = Live(bus=None, clusters=["c"])  # type: ignore[arg-type]

    def at_version(status: dict[str, Any], version: str) -> dict[str, Any]:
        job = trainjob(status)
        job["metadata"]["resourceVersion"] = version
        return job

    live._update("c", at_version(RUNNING, "10"), observed_at=T0 + 10)
    live._update("c", at_version(suspended("2026-11-26T06:00:20Z"), "12"), observed_at=T0 + 21)
    live._update("c", at_version(RUNNING, "10"), observed_at=None)  # the stale read lands now
    live._update("c", at_version(suspended("2026-11-26T06:00:20Z"), "13"), observed_at=T0 + 22)
    assert [e["stage"] for e in live.rows["c/ns/job"]["timeline"]] == ["created", "observed", "running", "suspended"]
    assert live.rows["c/ns/job"]["state"] == "Suspended"
