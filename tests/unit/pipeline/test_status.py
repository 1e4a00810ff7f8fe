"""TrainJob status from the JobSet (spec §4.6.6, §5.2, §5.8, §8.5)."""
from __future__ import annotations

from typing import Any

from fixtures.pipeline_builders import trainjob
from trainyard.pipeline import compute_trainjob_status

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-02T00:00:00Z"


def jobset(conditions: list[dict[str, Any]] = (), jobs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"kind": "JobSet", "status": {"conditions": list(conditions), "replicatedJobsStatus": list(jobs)}}


def cond(type_: str, status: str, reason: str = "", message: str = "", time: str = "2025-12-31T00:00:00Z") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": time}


def test_never_suspended_running_jobset_gives_empty_status() -> None:
    assert compute_trainjob_status(trainjob(), jobset([cond("Suspended", "False")]), NOW) == {}


def test_suspended_trainjob_gets_suspended_condition() -> None:
    status = compute_trainjob_status(trainjob(suspend=True), None, NOW)
    assert status == {"conditions": [{"type": "Suspended", "status": "True", "lastTransitionTime": NOW,
                                      "reason": "Suspended", "message": "TrainJob is suspended"}]}


def test_resume_drops_the_suspended_condition() -> None:
    # Deliberate difference (docs/compatibility.md): no Suspended=False/Resumed is kept, so the
    # Kubeflow SDK can report Running again (kubeflow/sdk#803) and State is not "Suspended".
    job = trainjob(suspend=False)
    job["status"] = compute_trainjob_status(trainjob(suspend=True), None, NOW)
    assert compute_trainjob_status(job, jobset(), LATER) == {}


def test_a_left_over_resumed_condition_is_dropped_too() -> None:
    job = trainjob(suspend=False)
    job["status"] = {"conditions": [cond("Suspended", "False", "Resumed", "TrainJob is resumed", NOW)]}
    assert compute_trainjob_status(job, jobset(), LATER) == {}


def test_completed_jobset_adds_complete_as_the_only_condition_after_a_resume() -> None:
    job = trainjob()
    job["status"] = {"conditions": [cond("Suspended", "True", "Suspended", "TrainJob is suspended", NOW)]}
    done = jobset([cond("Completed", "True", "AllJobsCompleted", "jobset completed successfully", LATER)],
                  [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0, "suspended": 0}])
    status = compute_trainjob_status(job, done, LATER)
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Complete", "True", "AllJobsCompleted")]
    assert status["conditions"][0]["lastTransitionTime"] == LATER
    assert status["jobsStatus"] == [{"name": "node", "ready": 0, "succeeded": 2, "failed": 0, "active": 0,
                                     "suspended": 0}]


def test_failed_jobset_copies_reason_and_message() -> None:
    failed = jobset([cond("Failed", "True", "FailedJobs", "jobset failed due to one or more job failures")],
                    [{"name": "node", "failed": 1}])
    status = compute_trainjob_status(trainjob(), failed, NOW)
    assert status["conditions"][0]["message"] == "jobset failed due to one or more job failures"
    assert status["jobsStatus"] == [{"name": "node", "ready": 0, "succeeded": 0, "failed": 1, "active": 0,
                                     "suspended": 0}]


def test_a_finished_trainjob_keeps_its_terminal_condition_whatever_its_jobset() -> None:
    # Deliberate difference (docs/compatibility.md): upstream re-derives Failed from the JobSet
    # on every reconcile, so a deleted or re-created JobSet erases it (kubeflow/trainer#3779).
    for terminal in (cond("Failed", "True", "FailedJobs"), cond("Complete", "True", "AllJobsCompleted")):
        job = trainjob()
        job["status"] = {"conditions": [terminal], "jobsStatus": [{"name": "x"}]}
        assert compute_trainjob_status(job, jobset(), NOW) == job["status"]
        assert compute_trainjob_status(job, None, NOW) == job["status"]
        job["spec"]["suspend"] = True
        assert compute_trainjob_status(job, None, NOW) == job["status"]


def test_a_failure_that_is_not_final_is_removed_when_its_cause_is_gone() -> None:
    job = trainjob()
    job["status"] = {"conditions": [cond("Failed", "True", "TrainJobResourcesCreationFailed")]}
    assert compute_trainjob_status(job, jobset(), NOW) == {}


def test_missing_jobset_keeps_jobs_status() -> None:
    job = trainjob()
    job["status"] = {"jobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1,
                                     "suspended": 0}]}
    assert compute_trainjob_status(job, None, NOW) == job["status"]


def test_unsupported_runtime_sets_failed_condition() -> None:
    job = trainjob()
    job["spec"]["runtimeRef"] = {"name": "x", "kind": "Foo", "apiGroup": "trainer.kubeflow.org"}
    status = compute_trainjob_status(job, None, NOW)
    assert status["conditions"][0] | {"lastTransitionTime": None} == {
        "type": "Failed", "status": "True", "lastTransitionTime": None, "reason": "TrainingRuntimeNotSupported",
        "message": "unsupported runtime: Foo.trainer.kubeflow.org"}


def test_same_status_keeps_transition_time() -> None:
    job = trainjob(suspend=True)
    job["status"] = compute_trainjob_status(job, None, NOW)
    assert compute_trainjob_status(job, None, LATER) == job["status"]
