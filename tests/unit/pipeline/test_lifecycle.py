"""Finished TrainJobs, activeDeadlineSeconds (v2.3.0) and the opt-in TTL after finished."""
from __future__ import annotations

from datetime import datetime, timezone

from fixtures.pipeline_builders import trainjob
from trainyard.pipeline import compute_trainjob_status
from trainyard.pipeline.lifecycle import (
    active_deadline, is_finished, trainjob_state, ttl_expiry, ttl_seconds_after_finished,
)

CREATED = "2026-01-01T00:00:00Z"
TTL = "trainyard.kubeflow.org/ttl-seconds-after-finished"


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def cond(type_: str, status: str = "True", reason: str = "", time: str = CREATED) -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": time}


def job_with(status_conditions=(), annotations=None, **spec) -> dict:
    job = trainjob(**spec)
    job["metadata"]["creationTimestamp"] = CREATED
    if annotations:
        job["metadata"]["annotations"] = annotations
    if status_conditions:
        job["status"] = {"conditions": list(status_conditions)}
    return job


def test_complete_and_failures_of_a_run_are_finished_but_setup_failures_are_not() -> None:
    assert is_finished(job_with([cond("Complete", reason="AllJobsCompleted")]))
    assert is_finished(job_with([cond("Failed", reason="FailedJobs")]))
    assert is_finished(job_with([cond("Failed", reason="DeadlineExceeded")]))
    assert not is_finished(job_with([cond("Failed", reason="TrainingRuntimeNotSupported")]))
    assert not is_finished(job_with([cond("Failed", reason="TrainJobResourcesCreationFailed")]))
    assert not is_finished(job_with([cond("Complete", status="False")]))
    assert not is_finished(job_with())


def test_state_is_never_blank() -> None:
    assert trainjob_state(job_with(), {}) == "Running"
    assert trainjob_state(job_with(suspend=True), {"conditions": [cond("Suspended")]}) == "Suspended"
    assert trainjob_state(job_with(), {"conditions": [cond("Complete")]}) == "Complete"
    assert trainjob_state(job_with(), {"conditions": [cond("Failed", reason="FailedJobs")]}) == "Failed"


def test_deadline_counts_from_creation_then_from_the_last_resume_and_not_while_suspended() -> None:
    assert active_deadline(job_with()) is None
    assert active_deadline(job_with(activeDeadlineSeconds=0)) is None
    assert active_deadline(job_with(activeDeadlineSeconds=60)) == at("2026-01-01T00:01:00Z")
    assert active_deadline(job_with(activeDeadlineSeconds=60, suspend=True)) is None
    resumed = {"status": {"conditions": [cond("Suspended", "False", "ResumeJobs", "2026-01-01T01:00:00Z")]}}
    assert active_deadline(job_with(activeDeadlineSeconds=60), resumed) == at("2026-01-01T01:01:00Z")
    assert active_deadline(job_with([cond("Complete")], activeDeadlineSeconds=60)) is None


def test_a_resume_not_yet_running_does_not_count_from_creation() -> None:
    # Resumed in the spec a day after creation; the status and the JobSet still say suspended.
    job = job_with([cond("Suspended", "True", "Suspended")], activeDeadlineSeconds=60)
    assert active_deadline(job) is None
    suspended_jobset = {"spec": {"suspend": True}, "status": {"conditions": [cond("Suspended", "True")]}}
    assert active_deadline(job_with(activeDeadlineSeconds=60), suspended_jobset) is None
    assert compute_trainjob_status(job, suspended_jobset, "2026-01-02T00:00:00Z") == {}
    running = {"spec": {"suspend": False},
               "status": {"conditions": [cond("Suspended", "False", "ResumeJobs", "2026-01-02T00:00:00Z")]}}
    assert active_deadline(job_with(activeDeadlineSeconds=60), running) == at("2026-01-02T00:01:00Z")


def test_an_exceeded_deadline_fails_the_trainjob_with_upstreams_reason_and_message() -> None:
    job = job_with(activeDeadlineSeconds=60)
    assert compute_trainjob_status(job, None, "2026-01-01T00:00:59Z") == {}
    status = compute_trainjob_status(job, None, "2026-01-01T00:01:01Z")
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in status["conditions"]] == [
        ("Failed", "True", "DeadlineExceeded", "TrainJob exceeded its active deadline")]
    # Suspended: the clock does not run.
    assert "Failed" not in [c["type"] for c in compute_trainjob_status(
        job_with(activeDeadlineSeconds=60, suspend=True), None, "2026-01-02T00:00:00Z")["conditions"]]
    # A JobSet that completed first wins.
    done = {"status": {"conditions": [cond("Completed", reason="AllJobsCompleted")]}}
    status = compute_trainjob_status(job, done, "2026-01-01T00:01:01Z")
    assert [c["type"] for c in status["conditions"]] == ["Complete"]
    # Once failed by the deadline it stays failed.
    failed = job_with(status["conditions"][:0] + [cond("Failed", reason="DeadlineExceeded")], activeDeadlineSeconds=600)
    assert compute_trainjob_status(failed, None, "2026-01-01T00:00:10Z") == failed["status"]


def test_ttl_after_finished_is_opt_in_and_counts_from_the_terminal_condition() -> None:
    assert ttl_expiry(job_with([cond("Complete")])) is None
    assert ttl_seconds_after_finished(job_with(annotations={TTL: "-1"})) is None
    assert ttl_seconds_after_finished(job_with(annotations={TTL: "soon"})) is None
    assert ttl_expiry(job_with(annotations={TTL: "30"})) is None  # not finished
    assert ttl_expiry(job_with([cond("Complete")], annotations={TTL: "30"})) == at("2026-01-01T00:00:30Z")
    assert ttl_expiry(job_with([cond("Failed", reason="FailedJobs")], annotations={TTL: "0"})) == at(CREATED)
    assert ttl_expiry(job_with([cond("Failed", reason="TrainJobResourcesCreationFailed")],
                               annotations={TTL: "0"})) is None
