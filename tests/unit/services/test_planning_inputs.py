"""A TrainJob event that changed only the status is not planned again (#16): the planner
compares the digest of the TrainJob's metadata and spec with the one the applied plan (or the
plan being applied under a live claim) was made from."""
from __future__ import annotations

import copy
import time

from trainyard.bus.kv import AppliedPlan
from trainyard_services.planner.reconcile import inputs_already_applied, planning_inputs

TRAINJOB = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
    "metadata": {"name": "mnist", "namespace": "default", "uid": "u", "generation": 2, "resourceVersion": "10",
                 "labels": {"team": "a"}},
    "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": False},
}


def changed(path: str, value) -> dict:
    job = copy.deepcopy(TRAINJOB)
    *parents, last = path.split(".")
    target = job
    for part in parents:
        target = target.setdefault(part, {})
    target[last] = value
    return job


def entry(state: str = "applied", *, generation: int = 2, uid: str = "u", inputs: str | None = None,
          expires_in: float = 30.0) -> AppliedPlan:
    return AppliedPlan(uid=uid, generation=generation, planHash="h", state=state,
                       claimExpires=time.time() + expires_in,
                       inputs=planning_inputs(TRAINJOB) if inputs is None else inputs)


def test_a_status_write_keeps_the_inputs_and_spec_or_metadata_changes_do_not() -> None:
    digest = planning_inputs(TRAINJOB)
    same = [changed("status", {"conditions": [{"type": "Suspended", "status": "True"}]}),
            changed("metadata.resourceVersion", "11"),
            changed("metadata.managedFields", [{"manager": "trainer-status"}])]
    for job in same:
        assert planning_inputs(job) == digest
    different = [changed("metadata.labels", {"team": "b"}), changed("metadata.annotations", {"a": "1"}),
                 changed("metadata.deletionTimestamp", "2026-01-01T00:00:00Z"), changed("spec.suspend", True),
                 changed("metadata.generation", 3)]
    for job in different:
        assert planning_inputs(job) != digest


def test_only_an_applied_plan_or_a_live_claim_of_these_inputs_skips_planning() -> None:
    status_only = changed("status", {"state": "Running"})
    assert inputs_already_applied(status_only, entry("applied"))
    assert inputs_already_applied(status_only, entry("applying"))
    assert not inputs_already_applied(status_only, entry("applying", expires_in=-1))  # dead claim
    assert not inputs_already_applied(status_only, None)
    assert not inputs_already_applied(status_only, entry(inputs=""))  # applied by an older applier
    assert not inputs_already_applied(status_only, entry(generation=1))
    assert not inputs_already_applied(status_only, entry(uid="other"))
    assert not inputs_already_applied(changed("metadata.labels", {"team": "b"}), entry())


def test_a_plan_just_published_covers_its_status_only_events_for_a_short_while() -> None:
    """Before the applier claims a plan only the planner knows its inputs: the status write of a
    new TrainJob, arriving then, is not planned again; another generation, other inputs or an
    expired memory are."""
    from trainyard.bus.envelopes import PlanMessage
    from trainyard_services.planner.reconcile import RecentlyPublished

    recent = RecentlyPublished(ttl_s=30.0, size=2)
    plan = PlanMessage(cluster="c", namespace="default", name="mnist", uid="u", generation=2, planHash="h",
                       inputs=planning_inputs(TRAINJOB))
    recent.remember("default", "mnist", plan)
    assert recent.holds("default", "mnist", changed("status", {"state": "Running"}))
    assert not recent.holds("default", "mnist", changed("spec.suspend", True))
    assert not recent.holds("default", "other", TRAINJOB)
    for i in range(2):  # bounded: the oldest entries go first
        recent.remember("default", f"job-{i}", plan)
    assert not recent.holds("default", "mnist", TRAINJOB)
    expired = RecentlyPublished(ttl_s=-1.0)
    expired.remember("default", "mnist", plan)
    assert not expired.holds("default", "mnist", TRAINJOB)
