"""The planner's decisions without a bus: whether a TrainJob is planned, its plan or the failure
to report, and whether the plan is published over the applied one."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from fixtures.pipeline_builders import torch_runtime, trainjob
from trainyard.bus.kv import AppliedPlan
from trainyard_services.planner.reconcile import Planned, PlanDecision, plan_or_fail, publish_decision, skip_reason

NOW = datetime(2026, 11, 30, tzinfo=timezone.utc)


def job(**spec) -> dict:
    doc = trainjob(**spec)
    doc["metadata"].update(generation=3, resourceVersion="7")
    return doc


def applied(planned: Planned, *, generation: int = 3, uid: str = "uid-1", state: str = "applied") -> AppliedPlan:
    return AppliedPlan(uid=uid, generation=generation, planHash=planned.digest, state=state,
                       claimExpires=time.time() + 30, owned=planned.owned)


def test_deleting_foreign_and_finished_trainjobs_are_not_planned() -> None:
    deleting = job()
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T00:00:00Z"
    foreign = job(managedBy="kueue.x-k8s.io/multikueue")
    finished = job()
    finished["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert [skip_reason(t) for t in (deleting, foreign, finished, job())] == [
        "being deleted", "managed by another controller", "finished", None]


def test_a_plan_is_published_once_and_then_recognised_as_applied() -> None:
    planned = plan_or_fail("c", job(), [torch_runtime(num_nodes=2)], NOW)
    assert isinstance(planned, Planned)
    assert [o["kind"] for o in planned.objects][-1] == "JobSet"  # after the runtime snapshot (v2.3)
    first = publish_decision("c", job(), planned, None)
    assert first.message is not None and (first.message.generation, first.message.plan_hash) == (3, planned.digest)
    assert publish_decision("c", job(), planned, applied(planned)) == PlanDecision(skipped="unchanged")
    # An older generation, another TrainJob of the same name, or a plan still being applied:
    # published again.
    for other in (applied(planned, generation=2), applied(planned, uid="uid-0"), applied(planned, state="claimed")):
        assert publish_decision("c", job(), planned, other).message is not None


def test_a_missing_runtime_is_a_failure_to_report_not_a_plan() -> None:
    decision = plan_or_fail("c", job(), [], NOW)
    assert isinstance(decision, PlanDecision) and decision.failure is not None
    assert (decision.failure.outcome, decision.failure.uid, decision.failure.generation) == ("plan-failed", "uid-1", 3)


def test_a_trainjob_past_its_deadline_is_left_to_the_status_service() -> None:
    late = job(activeDeadlineSeconds=60)
    late["metadata"]["creationTimestamp"] = "2026-11-29T00:00:00Z"
    assert plan_or_fail("c", late, [torch_runtime()], NOW) == PlanDecision(skipped="deadline exceeded")
