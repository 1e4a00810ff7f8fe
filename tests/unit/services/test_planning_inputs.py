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


def plan_message(**changes):
    from trainyard.bus.envelopes import PlanMessage

    fields = dict(cluster="c", namespace="default", name="mnist", uid="u", generation=2, planHash="h",
                  inputs=planning_inputs(TRAINJOB))
    fields.update(changes)
    return PlanMessage(**fields)


def child_event(kind: str = "JobSet", *, event_type: str = "ADDED", uid: str = "u", suspend: bool = False,
                name: str = "mnist"):
    from trainyard.bus.envelopes import ObjectEvent

    api_version = "jobset.x-k8s.io/v1alpha2" if kind == "JobSet" else "v1"
    return ObjectEvent(cluster="c", type=event_type, kind=kind, apiVersion=api_version, namespace="default",
                       name=name, object={
                           "apiVersion": api_version, "kind": kind,
                           "metadata": {"name": name, "namespace": "default", "ownerReferences": [{
                               "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "mnist",
                               "uid": uid, "controller": True}]},
                           "spec": {"suspend": suspend}})


def test_a_plan_just_published_covers_its_status_only_events_for_a_short_while() -> None:
    """Before the applier claims a plan only the planner knows its inputs: the status write of a
    new TrainJob, arriving then, is not planned again; another generation, other inputs or an
    expired memory are."""
    from trainyard_services.planner.reconcile import KnownPlans

    known = KnownPlans(published_ttl_s=30.0, size=2)
    plan = plan_message()
    known.published("default", "mnist", plan)
    assert known.holds("default", "mnist", changed("status", {"state": "Running"}))
    assert not known.holds("default", "mnist", changed("spec.suspend", True))
    assert not known.holds("default", "mnist", changed("metadata.generation", 3))
    assert not known.holds("default", "other", TRAINJOB)
    for i in range(2):  # bounded: the oldest entries go first
        known.published("default", f"job-{i}", plan)
    assert not known.holds("default", "mnist", TRAINJOB)
    expired = KnownPlans(published_ttl_s=-1.0)
    expired.published("default", "mnist", plan)
    assert not expired.holds("default", "mnist", TRAINJOB)


def test_the_children_of_a_known_plan_are_not_planned_again_unless_they_can_change_it() -> None:
    """The JobSet and ConfigMaps that a plan applied, and the JobSet's status changes after, need
    no read: only a deletion, a JobSet whose suspension is not the plan's, or a child of another
    TrainJob of the same name (another uid) is planned."""
    from trainyard_services.planner.reconcile import KnownPlans

    known = KnownPlans()
    assert not known.child_changes_nothing(child_event())  # nothing known: read and decide
    known.published("default", "mnist", plan_message())
    assert known.child_changes_nothing(child_event())
    assert known.child_changes_nothing(child_event(event_type="MODIFIED"))
    assert known.child_changes_nothing(child_event("ConfigMap", name="mnist-runtime"))
    assert not known.child_changes_nothing(child_event(event_type="DELETED"))
    assert not known.child_changes_nothing(child_event(suspend=True))
    assert not known.child_changes_nothing(child_event(uid="an-earlier-trainjob"))
    known.published("default", "mnist", plan_message(suspended=True))
    assert known.child_changes_nothing(child_event(suspend=True))


def test_an_applied_plan_read_once_is_known_until_its_partition_goes() -> None:
    from trainyard.bus.subjects import trainjob_partition
    from trainyard_services.planner.reconcile import KnownPlans

    known = KnownPlans(published_ttl_s=-1.0)
    known.applied(TRAINJOB, entry("applying"))  # a live claim may still fail: not kept
    assert not known.child_changes_nothing(child_event())
    known.applied(TRAINJOB, entry(generation=1))  # another generation's plan: not kept
    assert not known.child_changes_nothing(child_event())
    known.applied(TRAINJOB, entry("applied"))
    assert known.child_changes_nothing(child_event(event_type="MODIFIED"))
    assert known.holds("default", "mnist", changed("status", {"state": "Running"}))
    known.forget_partition(trainjob_partition("default", "mnist") + 1)
    assert known.child_changes_nothing(child_event())
    known.forget_partition(trainjob_partition("default", "mnist"))
    assert not known.child_changes_nothing(child_event())
    known.applied(TRAINJOB, entry("applied"))
    known.forget("default", "mnist")  # the TrainJob was deleted
    assert not known.holds("default", "mnist", TRAINJOB)
