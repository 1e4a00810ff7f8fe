"""Elastic resizing in the data plane (pure): JobSet's ElasticJobSet gate (webhook rules of
JobSet v0.12.0, in-place child Job resize) and Kubernetes' elastic Indexed Jobs (scale-down
removes the highest indexes without counting failures, scale-up adds the new indexes)."""
from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from trainyard_services.devcluster.dataplane.admission import parse_feature_gates, validate_jobset
from trainyard_services.devcluster.dataplane.jobs import plan_job
from trainyard_services.devcluster.dataplane.jobsets import plan_jobset
from trainyard_services.devcluster.dataplane.webhook import review_response

NOW = datetime(2026, 1, 1, 0, 0, 10, tzinfo=timezone.utc)
ELASTIC = frozenset({"ElasticJobSet"})
GATE_OFF = ("spec.replicatedJobs[1].template.spec: Forbidden: parallelism and completions cannot be changed "
            "when ElasticJobSet feature gate is disabled")
IMMUTABLE = "spec.replicatedJobs: Invalid value: field is immutable"


def jobset(parallelism=2, completions=2, mode="Indexed", finished=None):
    rjobs = [{"name": "launcher", "replicas": 1, "template": {"spec": {
                  "parallelism": 1, "completions": 1, "completionMode": "Indexed",
                  "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}},
             {"name": "node", "replicas": 1, "template": {"spec": {
                  "parallelism": parallelism, "completions": completions, "completionMode": mode,
                  "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}}]
    obj = {"metadata": {"name": "js", "namespace": "ns1", "uid": "js-uid"}, "spec": {"replicatedJobs": rjobs}}
    if finished:
        obj["status"] = {"conditions": [{"type": finished, "status": "True"}]}
    return obj


def resized(old, parallelism, completions, **template_changes):
    new = copy.deepcopy(old)
    spec = new["spec"]["replicatedJobs"][1]["template"]["spec"]
    for key, value in (("parallelism", parallelism), ("completions", completions)):
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    spec.update(template_changes)
    new.pop("status", None)
    return new


@pytest.mark.parametrize("old,new_size,gates,messages", [
    # gate on: both together, equal, >= 1, JobSet not finished
    (jobset(), (3, 3), ELASTIC, []),
    (jobset(), (1, 1), ELASTIC, []),
    (jobset(), (3, 2), ELASTIC, ["spec.replicatedJobs[1].template.spec.completions: Invalid value: 2: "
                                 "completions must be equal to parallelism for Elastic Indexed Jobs"]),
    (jobset(), (2, 3), ELASTIC, ["spec.replicatedJobs[1].template.spec.completions: Invalid value: 3: "
                                 "completions must be equal to parallelism for Elastic Indexed Jobs"]),
    (jobset(), (0, 0), ELASTIC, ["spec.replicatedJobs[1].template.spec.parallelism: Invalid value: 0: "
                                 "parallelism must be >= 1",
                                 "spec.replicatedJobs[1].template.spec.completions: Invalid value: 0: "
                                 "completions must be >= 1"]),
    (jobset(finished="Completed"), (3, 3), ELASTIC,
     ["spec.replicatedJobs[1].template.spec: Forbidden: Cannot mutate parallelism or completions when JobSet "
      "is in a terminal state (Completed or Failed)"]),
    (jobset(finished="Failed"), (1, 1), ELASTIC,
     ["spec.replicatedJobs[1].template.spec: Forbidden: Cannot mutate parallelism or completions when JobSet "
      "is in a terminal state (Completed or Failed)"]),
    # only Indexed replicated Jobs are elastic
    (jobset(mode="NonIndexed"), (3, 3), ELASTIC, [IMMUTABLE]),
    # gate off: the immutability error stays, and a message names the gate
    (jobset(), (3, 3), frozenset(), [GATE_OFF, IMMUTABLE]),
    (jobset(), (2, 2), frozenset(), []),
])
def test_elastic_jobset_webhook_rules(old, new_size, gates, messages):
    assert validate_jobset(resized(old, *new_size), old, gates) == messages


def test_gate_on_does_not_open_the_rest_of_the_template():
    old = jobset()
    changed = resized(old, 3, 3, backoffLimit=4)
    assert validate_jobset(changed, old, ELASTIC) == [IMMUTABLE]
    replicas = copy.deepcopy(old)
    replicas["spec"]["replicatedJobs"][1]["replicas"] = 2
    assert validate_jobset(replicas, old, ELASTIC) == [IMMUTABLE]


def test_webhook_answers_with_the_gate():
    old = jobset()
    review = {"request": {"uid": "u", "operation": "UPDATE", "object": resized(old, 3, 3), "oldObject": old}}
    assert review_response(review, False, ELASTIC)["response"]["allowed"] is True
    denied = review_response(review, False)["response"]
    assert denied["allowed"] is False and "ElasticJobSet feature gate" in denied["status"]["message"]


@pytest.mark.parametrize("text,enabled", [
    ("", {"TLSOptions"}), ("ElasticJobSet=true", {"ElasticJobSet", "TLSOptions"}),
    ("ElasticJobSet=true,TLSOptions=false", {"ElasticJobSet"}), ("ElasticJobSet=false", {"TLSOptions"}),
])
def test_feature_gate_flag(text, enabled):
    assert parse_feature_gates(text) == enabled


@pytest.mark.parametrize("text,error", [
    ("Elastic=true", "unrecognized feature gate: Elastic"),
    ("ElasticJobSet", "missing bool value for ElasticJobSet"),
    ("ElasticJobSet=yes", "invalid value of ElasticJobSet=yes, err: strconv.ParseBool: parsing 'yes': invalid syntax"),
    ("RestartJob=true", "feature gate RestartJob is not implemented by the devcluster data plane"),
])
def test_feature_gate_flag_errors(text, error):
    with pytest.raises(ValueError) as caught:
        parse_feature_gates(text)
    assert str(caught.value) == error


def child(js, rjob, parallelism, completions, state=None):
    conditions = [{"type": state, "status": "True"}] if state else []
    return {"metadata": {"name": f"js-{rjob}-0", "namespace": "ns1",
                         "labels": {"jobset.sigs.k8s.io/restart-attempt": "0",
                                    "jobset.sigs.k8s.io/replicatedjob-name": rjob},
                         "ownerReferences": [{"uid": js["metadata"]["uid"], "controller": True}]},
            "spec": {"parallelism": parallelism, "completions": completions},
            "status": {"conditions": conditions, "active": parallelism}}


def test_jobset_controller_resizes_child_jobs_in_place_only_with_the_gate():
    js = resized(jobset(), 3, 3)
    jobs = [child(js, "launcher", 1, 1), child(js, "node", 2, 2)]
    plan = plan_jobset(js, jobs, True, NOW, elastic=True)
    assert plan.scale_jobs == [("js-node-0", 3, 3)]
    assert plan.create_jobs == [] and plan.delete_jobs == []
    assert plan_jobset(js, jobs, True, NOW).scale_jobs == []  # gate off: never resized (nor recreated)
    assert plan_jobset(js, jobs, True, NOW).delete_jobs == []
    finished = [child(js, "launcher", 1, 1), child(js, "node", 2, 2, state="Complete")]
    assert plan_jobset(js, finished, True, NOW, elastic=True).scale_jobs == []
    uneven = resized(jobset(), 3, 2)  # not a valid elastic size: left alone
    assert plan_jobset(uneven, jobs, True, NOW, elastic=True).scale_jobs == []


def job(completions, parallelism=None, restart="Never", status=None):
    return {"metadata": {"name": "js-node-0", "namespace": "ns1", "uid": "job-uid"},
            "spec": {"completions": completions, "parallelism": parallelism or completions, "backoffLimit": 0,
                     "completionMode": "Indexed",
                     "template": {"spec": {"restartPolicy": restart, "containers": [{"name": "c", "command": ["x"]}]}}},
            "status": status or {}}


def pod(index, phase="Running", *, deleting=False, exit_code=None):
    state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code,
                                                                        "finishedAt": "2026-01-01T00:00:05Z"}}
    meta = {"name": f"js-node-0-{index}-x", "uid": f"u{index}", "namespace": "ns1",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "finalizers": ["batch.kubernetes.io/job-tracking"]}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": "n"},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "c", "restartCount": 0, "state": state}]}}


def test_scale_down_deletes_the_highest_indexes_and_leaves_the_rest():
    plan = plan_job(job(2), [pod(0), pod(1), pod(2), pod(3)], NOW)
    assert sorted(plan.delete) == ["js-node-0-2-x", "js-node-0-3-x"]
    assert plan.create == [] and plan.status["active"] == 2


def test_pods_removed_by_a_scale_down_are_not_failures():
    stopped = [pod(0), pod(1), pod(2, "Failed", deleting=True, exit_code=143)]
    plan = plan_job(job(2), stopped, NOW)
    assert plan.status["failed"] == 0
    assert not any(c["type"] in ("FailureTarget", "Failed") for c in plan.status.get("conditions") or [])
    assert "js-node-0-2-x" in plan.remove_finalizer
    assert plan.status["uncountedTerminatedPods"] == {}
    # an in-range failure still counts (backoffLimit 0 fails the Job)
    plan = plan_job(job(2), [pod(0), pod(1, "Failed", exit_code=1)], NOW)
    assert plan.status["failed"] == 1


def test_scale_up_creates_the_new_indexes_only():
    plan = plan_job(job(4), [pod(0), pod(1)], NOW)
    assert sorted(p["metadata"]["generateName"] for p in plan.create) == ["js-node-0-2-", "js-node-0-3-"]
    assert plan.delete == []


def test_pods_removed_by_a_scale_down_start_no_failure_backoff():
    removed = [pod(2, "Failed", deleting=True, exit_code=143), pod(3, "Failed", deleting=True, exit_code=143)]
    plan = plan_job(job(2), [pod(0), *removed], NOW)  # index 1 is missing: created at once
    assert [p["metadata"]["generateName"] for p in plan.create] == ["js-node-0-1-"]
    backoff = job(2)
    backoff["spec"]["backoffLimit"] = 3
    failed = plan_job(backoff, [pod(0), pod(1, "Failed", exit_code=1)], NOW)  # an in-range failure waits
    assert failed.create == [] and failed.requeue_after


def test_completed_indexes_above_completions_no_longer_count_and_the_job_completes_on_0_to_n():
    status = {"completedIndexes": "0,2", "succeeded": 2, "failed": 0}
    plan = plan_job(job(2, status=status), [pod(1)], NOW)
    assert plan.status["completedIndexes"] == "0" and plan.status["succeeded"] == 1
    assert not plan.status.get("conditions")
    done = plan_job(job(2, status=status), [pod(1, "Succeeded", exit_code=0)], NOW)
    assert done.status["completedIndexes"] == "0-1"
    assert [c["type"] for c in done.status["conditions"]] == ["SuccessCriteriaMet", "Complete"]
