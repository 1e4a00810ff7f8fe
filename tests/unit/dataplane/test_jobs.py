"""batch/v1 Job controller decisions (pure): pod construction, counting, completion, failure."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from trainyard_services.devcluster.dataplane.jobs import (build_pod, compress_indexes, parse_indexes,
                                                         plan_job)

NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)


def job(completions=2, parallelism=2, backoff=0, restart="Never", **spec):
    return {"metadata": {"name": "js-w-0", "namespace": "ns1", "uid": "job-uid"},
            "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": backoff,
                     "completionMode": "Indexed", **spec,
                     "template": {"metadata": {"labels": {"k": "v"}},
                                  "spec": {"restartPolicy": restart,
                                           "containers": [{"name": "c", "command": ["true"],
                                                           "env": [{"name": "A", "value": "1"}]}]}}}}


def pod(index, phase="Running", *, uid=None, ready=True, tracked=True, deleting=False, exit_code=None,
        restarts=0, finished="2026-01-01T00:00:05Z"):
    state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code, "finishedAt": finished}}
    meta = {"name": f"js-w-0-{index}-{uid or 'x'}", "uid": uid or f"u{index}", "namespace": "ns1",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "finalizers": ["batch.kubernetes.io/job-tracking"] if tracked else []}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "n"},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "c", "restartCount": restarts, "state": state}]}}


def test_pod_construction():
    p = build_pod(job(), 1)
    meta = p["metadata"]
    assert meta["generateName"] == "js-w-0-1-"
    assert meta["labels"] == {"k": "v", "batch.kubernetes.io/controller-uid": "job-uid", "controller-uid": "job-uid",
                              "batch.kubernetes.io/job-name": "js-w-0", "job-name": "js-w-0",
                              "batch.kubernetes.io/job-completion-index": "1"}
    assert meta["annotations"] == {"batch.kubernetes.io/job-completion-index": "1"}
    assert meta["finalizers"] == ["batch.kubernetes.io/job-tracking"]
    assert p["spec"]["hostname"] == "js-w-0-1"
    assert p["spec"]["containers"][0]["env"][-1] == {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}


@pytest.mark.parametrize("indexes,text", [({0, 1, 2, 5}, "0-2,5"), (set(), ""), ({3}, "3")])
def test_index_compression(indexes, text):
    assert compress_indexes(indexes) == text and parse_indexes(text) == indexes


def test_creates_missing_indexes_and_counts_ready():
    plan = plan_job(job(), [pod(1)], NOW)
    assert [p["metadata"]["generateName"] for p in plan.create] == ["js-w-0-0-"]
    assert plan.status["active"] == 1 and plan.status["ready"] == 1 and plan.status["startTime"]


def test_success_counts_once_and_completes():
    first = plan_job(job(), [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], NOW)
    assert first.status["succeeded"] == 2 and first.status["completedIndexes"] == "0-1"
    assert first.status["uncountedTerminatedPods"] == {"succeeded": ["u0", "u1"]}
    assert sorted(first.remove_finalizer) == ["js-w-0-0-x", "js-w-0-1-x"]
    types = [(c["type"], c["reason"]) for c in first.status["conditions"]]
    assert types == [("SuccessCriteriaMet", "CompletionsReached"), ("Complete", "CompletionsReached")]
    assert first.status["completionTime"]
    done = job()
    done["status"] = first.status
    again = plan_job(done, [pod(0, "Succeeded", exit_code=0, tracked=False), pod(1, "Succeeded", exit_code=0, tracked=False)], NOW)
    assert again.status["succeeded"] == 2 and again.status["uncountedTerminatedPods"] == {}


def test_failed_pod_over_backoff_limit_fails_the_job_after_pods_stop():
    plan = plan_job(job(), [pod(0, "Failed", exit_code=3), pod(1)], NOW)
    assert plan.status["failed"] == 1
    assert plan.delete == ["js-w-0-1-x"]
    types = [c["type"] for c in plan.status["conditions"]]
    assert types == ["FailureTarget"]
    j = job()
    j["status"] = plan.status
    later = plan_job(j, [pod(0, "Failed", exit_code=3, tracked=False)], NOW)
    failed = later.status["conditions"][-1]
    assert (failed["type"], failed["reason"], failed["message"]) == (
        "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    assert later.status["failed"] == 1 and later.events[0][1] == "BackoffLimitExceeded"


def test_on_failure_restart_count_reaches_backoff_limit():
    plan = plan_job(job(completions=1, parallelism=1, restart="OnFailure"), [pod(0, restarts=1)], NOW)
    assert plan.status["conditions"][0]["reason"] == "BackoffLimitExceeded"
    ok = plan_job(job(completions=1, parallelism=1, backoff=6, restart="OnFailure"), [pod(0, restarts=5)], NOW)
    assert "conditions" not in ok.status


def test_active_deadline():
    j = job(activeDeadlineSeconds=2)
    j["status"] = {"startTime": "2026-01-01T00:00:00Z"}
    plan = plan_job(j, [pod(0), pod(1)], NOW)
    assert plan.status["conditions"][0]["reason"] == "DeadlineExceeded"
    assert sorted(plan.delete) == ["js-w-0-0-x", "js-w-0-1-x"]
    early = plan_job(j, [pod(0), pod(1)], datetime(2026, 1, 1, 0, 0, 1, tzinfo=timezone.utc))
    assert early.requeue_after == pytest.approx(1)


def test_pod_failure_policy_fail_job():
    j = job(backoff=6, podFailurePolicy={"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]})
    plan = plan_job(j, [pod(0, "Failed", exit_code=42)], NOW)
    target = plan.status["conditions"][0]
    assert target["reason"] == "PodFailurePolicy"
    assert target["message"] == "Container c for pod ns1/js-w-0-0-x failed with exit code 42 matching FailJob rule at index 0"


def test_replacement_pod_waits_for_failure_backoff():
    j = job(backoff=6)
    plan = plan_job(j, [pod(0, "Failed", exit_code=1, finished="2026-01-01T00:00:05Z"), pod(1)], NOW, time_scale=1.0)
    assert plan.create == [] and plan.requeue_after == pytest.approx(5)
    plan = plan_job(j, [pod(0, "Failed", exit_code=1, finished="2026-01-01T00:00:05Z"), pod(1)],
                    NOW + timedelta(seconds=6), time_scale=1.0)
    assert [p["metadata"]["generateName"] for p in plan.create] == ["js-w-0-0-"]


def test_suspend_deletes_untracked_and_resume_resets_start_time():
    j = job(suspend=True)
    plan = plan_job(j, [pod(0), pod(1)], NOW)
    assert sorted(plan.delete_untracked) == ["js-w-0-0-x", "js-w-0-1-x"] and plan.create == []
    assert plan.status["conditions"][0]["reason"] == "JobSuspended" and plan.status["active"] == 0
    j["status"] = plan.status
    j["spec"]["suspend"] = False
    resumed = plan_job(j, [], NOW + timedelta(seconds=30))
    suspended = resumed.status["conditions"][0]
    assert (suspended["status"], suspended["reason"]) == ("False", "JobResumed")
    assert resumed.status["startTime"] == "2026-01-01T00:00:40Z" and len(resumed.create) == 2


def test_created_suspended_has_no_start_time():
    plan = plan_job(job(suspend=True), [], NOW)
    assert "startTime" not in plan.status and plan.create == []


def test_ttl_after_finished_deletes_the_job():
    j = job(ttlSecondsAfterFinished=5)
    j["status"] = {"completionTime": "2026-01-01T00:00:00Z", "succeeded": 2, "completedIndexes": "0-1",
                   "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    early = plan_job(j, [], NOW - timedelta(seconds=8))
    assert early.delete_self is False and early.requeue_after == pytest.approx(3)
    assert plan_job(j, [], NOW).delete_self is True
