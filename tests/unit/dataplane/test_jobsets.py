"""JobSet controller decisions (pure): names, labels, Service, status, policies, startup."""
from __future__ import annotations

import copy
from datetime import datetime, timedelta, timezone

import pytest

from trainyard_services.devcluster.dataplane.jobsets import (build_job, build_service, plan_jobset,
                                                             set_jobset_condition)

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def jobset(name="js", rjobs=(("a", 2), ("b", 1)), namespace="ns1", **spec):
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": namespace, "uid": "js-uid"},
            "spec": {"replicatedJobs": [
                {"name": r, "replicas": n, "template": {"spec": {"parallelism": 1, "completions": 1, "template": {
                    "spec": {"containers": [{"name": "c", "image": "x", "command": ["true"]}]}}}}}
                for r, n in rjobs], **spec}}


def child(js, name, *, attempt=0, state=None, failed_at="2026-01-01T00:00:00Z", reason="BackoffLimitExceeded",
          message="Job has reached the specified backoff limit", active=0, ready=0, succeeded=0, suspend=False):
    rjob = name.split("-")[1]
    conditions = []
    if state == "Complete":
        conditions = [{"type": "Complete", "status": "True"}]
    elif state == "Failed":
        conditions = [{"type": "Failed", "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": failed_at}]
    return {"metadata": {"name": name, "namespace": "ns1",
                         "labels": {"jobset.sigs.k8s.io/restart-attempt": str(attempt),
                                    "jobset.sigs.k8s.io/replicatedjob-name": rjob},
                         "ownerReferences": [{"uid": js["metadata"]["uid"], "controller": True}]},
            "spec": {"parallelism": 1, "completions": 1, "suspend": suspend},
            "status": {"conditions": conditions, "active": active, "ready": ready, "succeeded": succeeded}}


def test_job_keys_match_upstream_examples():
    js = jobset("mnist", rjobs=(("dataset-initializer", 1), ("node", 2)), namespace="team-a")
    keys = [build_job(js, p, j, 0)["metadata"]["labels"] for p, j in ((0, 0), (1, 0), (1, 1))]
    assert [k["jobset.sigs.k8s.io/job-key"] for k in keys] == [
        "db3b1b44aabe70fdf9472873c86f4f1c0da6d02c", "249a20573743e52c08a0b0acac490772a1e0d3b6",
        "2313f81155ca44802388816f6e727ef5892f9596"]
    assert [k["jobset.sigs.k8s.io/job-global-index"] for k in keys] == ["0", "1", "2"]
    assert {k["jobset.sigs.k8s.io/global-replicas"] for k in keys} == {"3"}
    assert {k["jobset.sigs.k8s.io/group-replicas"] for k in keys} == {"3"}


def test_child_job_construction():
    js = jobset(coordinator={"replicatedJob": "a", "jobIndex": 1}, network={"subdomain": "net1"})
    js["spec"]["replicatedJobs"][0]["template"]["metadata"] = {"labels": {"step": "trainer"}}
    job = build_job(js, 0, 1, 0)
    assert job["metadata"]["name"] == "js-a-1"
    assert job["metadata"]["labels"]["step"] == "trainer"
    pod_meta = job["spec"]["template"]["metadata"]
    assert "step" not in pod_meta["labels"]
    assert pod_meta["labels"] == pod_meta["annotations"]
    assert pod_meta["labels"]["jobset.sigs.k8s.io/coordinator"] == "js-a-1-0.net1"
    assert job["spec"]["template"]["spec"]["subdomain"] == "net1"
    assert job["spec"]["suspend"] is False and job["spec"]["completionMode"] == "Indexed"
    assert job["metadata"]["ownerReferences"] == [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                   "name": "js", "uid": "js-uid", "controller": True,
                                                   "blockOwnerDeletion": True}]
    service = build_service(js)
    assert service["metadata"]["name"] == "net1"
    assert service["spec"] == {"clusterIP": "None", "selector": {"jobset.sigs.k8s.io/jobset-name": "js"},
                               "publishNotReadyAddresses": True}


def test_first_reconcile_creates_everything_and_counts_zero():
    js = jobset()
    plan = plan_jobset(js, [], service_exists=False, now=NOW)
    assert [j["metadata"]["name"] for j in plan.create_jobs] == ["js-a-0", "js-a-1", "js-b-0"]
    assert plan.create_service is not None
    assert plan.status == {"restarts": 0, "replicatedJobsStatus": [
        {"name": "b", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0},
        {"name": "a", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}]}


def test_all_complete_completes_and_no_suspended_condition():
    js = jobset()
    jobs = [child(js, n, state="Complete", succeeded=1) for n in ("js-a-0", "js-a-1", "js-b-0")]
    plan = plan_jobset(js, jobs, True, NOW)
    conditions = plan.status["conditions"]
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in conditions] == [
        ("Completed", "True", "AllJobsCompleted", "jobset completed successfully")]
    assert plan.status["terminalState"] == "Completed"
    assert plan.events == [("Normal", "AllJobsCompleted", "jobset completed successfully")]
    assert plan.create_jobs == []


def test_success_policy_any_with_target_deletes_the_rest_next_pass():
    js = jobset(successPolicy={"operator": "Any", "targetReplicatedJobs": ["b"]})
    jobs = [child(js, "js-a-0", active=1), child(js, "js-a-1", active=1),
            child(js, "js-b-0", state="Complete", succeeded=1)]
    first = plan_jobset(js, jobs, True, NOW)
    assert first.status["terminalState"] == "Completed" and first.delete_jobs == []
    js["status"] = first.status
    second = plan_jobset(js, jobs, True, NOW)
    assert second.delete_jobs == ["js-a-0", "js-a-1"] and second.status is None


@pytest.mark.parametrize("policy,reason,message_start,restarts", [
    (None, "FailedJobs", "jobset failed due to one or more job failures", 0),
    ({}, "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts", 0),
    ({"maxRestarts": 3, "rules": [{"name": "r0", "action": "RestartJobSet", "onJobFailureReasons": ["PodFailurePolicy"]},
                                  {"name": "r1", "action": "FailJobSet"}]},
     "FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action", 0),
])
def test_failure_policies_that_fail(policy, reason, message_start, restarts):
    spec = {} if policy is None else {"failurePolicy": policy}
    js = jobset(**spec)
    jobs = [child(js, "js-a-0", active=1), child(js, "js-a-1", state="Failed"), child(js, "js-b-0", active=1)]
    plan = plan_jobset(js, jobs, True, NOW)
    failed = next(c for c in plan.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == reason
    assert failed["message"] == f"{message_start} (first failed job: js-a-1)"
    assert plan.status["restarts"] == restarts and plan.status["terminalState"] == "Failed"


def test_restart_then_recreate_with_new_attempt_then_max_restarts():
    js = jobset(failurePolicy={"maxRestarts": 1})
    jobs = [child(js, "js-a-0", active=1), child(js, "js-a-1", state="Failed"), child(js, "js-b-0", active=1)]
    plan = plan_jobset(js, jobs, True, NOW)
    assert plan.status["restarts"] == 1 and plan.status["restartsCountTowardsMax"] == 1
    assert plan.events[0] == ("Warning", "RestartJobSetFailurePolicyAction",
                              "applying RestartJobSet failure policy action (first failed job: js-a-1)")
    js["status"] = plan.status
    # Next pass: every attempt-0 Job is previous and deleted; names still taken, nothing created.
    second = plan_jobset(js, jobs, True, NOW)
    assert sorted(second.delete_jobs) == ["js-a-0", "js-a-1", "js-b-0"] and second.create_jobs == []
    # Once js-a-0 is gone it is recreated with restart-attempt 1 (Recreate).
    third = plan_jobset(js, jobs[1:], True, NOW)
    assert [j["metadata"]["name"] for j in third.create_jobs] == ["js-a-0"]
    assert third.create_jobs[0]["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "1"
    again = [child(js, "js-a-0", attempt=1, state="Failed"), child(js, "js-a-1", attempt=1), child(js, "js-b-0", attempt=1)]
    final = plan_jobset(js, again, True, NOW)
    failed = next(c for c in final.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ReachedMaxRestarts"


def test_blocking_recreate_waits_for_all_previous_jobs():
    js = jobset(failurePolicy={"maxRestarts": 2, "restartStrategy": "BlockingRecreate"})
    js["status"] = {"restarts": 1}
    plan = plan_jobset(js, [child(js, "js-b-0", attempt=0, active=1)], True, NOW)
    assert plan.create_jobs == [] and plan.delete_jobs == ["js-b-0"]


def test_ignore_max_restarts_never_fails():
    js = jobset(failurePolicy={"maxRestarts": 1, "rules": [{"name": "r", "action": "RestartJobSetAndIgnoreMaxRestarts"}]})
    js["status"] = {"restarts": 2}
    plan = plan_jobset(js, [child(js, "js-a-0", attempt=2, state="Failed")], True, NOW)
    assert plan.status["restarts"] == 3 and "restartsCountTowardsMax" not in plan.status
    assert not any(c["type"] == "Failed" for c in plan.status["conditions"])


def test_in_order_startup():
    js = jobset(startupPolicy={"startupPolicyOrder": "InOrder"})
    plan = plan_jobset(js, [], True, NOW)
    assert [j["metadata"]["name"] for j in plan.create_jobs] == ["js-a-0", "js-a-1"]
    assert plan.status["conditions"][0]["reason"] == "InOrderStartupPolicyInProgress"
    js["status"] = plan.status
    ready = [child(js, "js-a-0", active=1, ready=1), child(js, "js-a-1", active=1, ready=1)]
    plan = plan_jobset(js, ready, True, NOW)
    assert [j["metadata"]["name"] for j in plan.create_jobs] == ["js-b-0"]
    js["status"] = plan.status
    plan = plan_jobset(js, ready + [child(js, "js-b-0", active=1, ready=1)], True, NOW)
    by_type = {c["type"]: c for c in plan.status["conditions"]}
    assert by_type["StartupPolicyCompleted"]["status"] == "True"
    assert by_type["StartupPolicyInProgress"]["status"] == "False"
    assert by_type["StartupPolicyInProgress"]["reason"] == "InOrderStartupPolicyInProgress"


def test_depends_on_complete():
    js = jobset()
    js["spec"]["replicatedJobs"][1]["dependsOn"] = [{"name": "a", "status": "Complete"}]
    plan = plan_jobset(js, [child(js, "js-a-0", active=1), child(js, "js-a-1", state="Complete", succeeded=1)], True, NOW)
    assert plan.create_jobs == []
    plan = plan_jobset(js, [child(js, "js-a-0", state="Complete", succeeded=1),
                            child(js, "js-a-1", state="Complete", succeeded=1)], True, NOW)
    assert [j["metadata"]["name"] for j in plan.create_jobs] == ["js-b-0"]


def test_suspend_and_resume():
    js = jobset(suspend=True)
    plan = plan_jobset(js, [], True, NOW)
    assert all(j["spec"]["suspend"] is True for j in plan.create_jobs)
    assert plan.status["conditions"][0]["reason"] == "SuspendedJobs"
    js["status"] = plan.status
    jobs = [child(js, n, suspend=True) for n in ("js-a-0", "js-a-1", "js-b-0")]
    jobs[0]["status"]["startTime"] = "2026-01-01T00:00:00Z"
    js["spec"]["suspend"] = False
    js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"labels": {"new": "label"}}
    plan = plan_jobset(js, jobs, True, NOW)
    resumed = {name: (patch, clear) for name, patch, clear in plan.resume_jobs}
    assert set(resumed) == {"js-a-0", "js-a-1", "js-b-0"}
    assert resumed["js-a-0"][1] is True and resumed["js-a-1"][1] is False
    assert resumed["js-a-0"][0]["metadata"]["labels"]["new"] == "label"
    suspended = next(c for c in plan.status["conditions"] if c["type"] == "Suspended")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == ("False", "ResumeJobs", "jobset is resumed")


def test_managed_by_other_controller_is_ignored_and_ttl_deletes():
    assert plan_jobset(jobset(managedBy="example.com/other"), [], False, NOW).status is None
    js = jobset(ttlSecondsAfterFinished=3)
    js["status"] = {"restarts": 0, "terminalState": "Completed", "conditions": [
        {"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    early = plan_jobset(js, [], True, NOW + timedelta(seconds=1))
    assert early.delete_self is False and early.requeue_after == pytest.approx(2)
    assert plan_jobset(js, [], True, NOW + timedelta(seconds=3)).delete_self is True


def test_condition_set_semantics():
    conditions = []
    assert set_jobset_condition(conditions, "Suspended", "False", "ResumeJobs", "m", "t0") is False
    assert conditions == []
    set_jobset_condition(conditions, "Suspended", "True", "SuspendedJobs", "s", "t1")
    set_jobset_condition(conditions, "Suspended", "True", "Other", "s2", "t2")
    assert conditions[0]["lastTransitionTime"] == "t1" and conditions[0]["reason"] == "Other"
    set_jobset_condition(conditions, "Suspended", "False", "ResumeJobs", "r", "t3")
    assert conditions[0]["lastTransitionTime"] == "t3"


def test_jobs_of_other_uids_are_ignored():
    js = jobset()
    stranger = copy.deepcopy(child(js, "js-a-0", state="Failed"))
    stranger["metadata"]["ownerReferences"][0]["uid"] = "other"
    plan = plan_jobset(js, [stranger], True, NOW)
    assert "conditions" not in plan.status
