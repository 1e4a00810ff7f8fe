"""JobSet webhook defaults and validation messages (pure)."""
from __future__ import annotations

import base64
import json

import pytest

from trainyard_services.devcluster.dataplane.admission import default_jobset, validate_jobset
from trainyard_services.devcluster.dataplane.webhook import review_response


def js(name="js", rjobs=None, **spec):
    rjobs = rjobs if rjobs is not None else [{"name": "w", "template": {"spec": {"template": {"spec": {
        "containers": [{"name": "c", "image": "x"}]}}}}}]
    return {"metadata": {"name": name, "namespace": "ns1"}, "spec": {"replicatedJobs": rjobs, **spec}}


def test_defaults_on_create():
    out = default_jobset(js(failurePolicy={"rules": [{"action": "FailJobSet"}]}))
    spec = out["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    rjob = spec["replicatedJobs"][0]
    assert (rjob["replicas"], rjob["groupName"]) == (1, "default")
    assert rjob["template"]["spec"]["completionMode"] == "Indexed"
    assert rjob["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert spec["failurePolicy"]["rules"][0]["name"] == "failurePolicyRule0"
    assert spec["failurePolicy"]["restartStrategy"] == "Recreate"


def _rjob(name, **extra):
    return {"name": name, "template": {"spec": {"completions": 1, "parallelism": 1}}, **extra}


@pytest.mark.parametrize("doc,message", [
    (js("a" * 45, [{"name": "w" * 10, "replicas": 2, "template": {"spec": {"completions": 100}}}]),
     "JobSet name is too long, pod names generated for this JobSet will exceed 63 characters"),
    (js("a" * 60, [_rjob("worker")]), "JobSet name is too long, job names generated for this JobSet will exceed 63 characters"),
    (js(rjobs=[_rjob("a", dependsOn=[{"name": "b", "status": "Ready"}]), _rjob("b")]),
     "DependsOn can't be set for the first ReplicatedJob"),
    (js(rjobs=[_rjob("a"), _rjob("b", dependsOn=[{"name": "a", "status": "Ready"}])], startupPolicy={"startupPolicyOrder": "InOrder"}),
     "StartupPolicy and DependsOn APIs are mutually exclusive"),
    (js(rjobs=[_rjob("a"), _rjob("b", dependsOn=[{"name": "c", "status": "Ready"}])]),
     "replicatedJob: b cannot depend on replicatedJob: c"),
    (js(successPolicy={"operator": "All", "targetReplicatedJobs": ["nope"]}),
     "invalid replicatedJob name 'nope' does not appear in .spec.ReplicatedJobs"),
    (js(failurePolicy={"rules": [{"name": "r", "action": "FailJobSet", "onJobFailureReasons": ["Foo"]}]}),
     "invalid job failure reason 'Foo' in failure policy is not a recognized job failure reason"),
    (js(failurePolicy={"rules": [{"name": "r", "action": "FailJobSet"}, {"name": "r", "action": "FailJobSet"}]}),
     "rule names are not unique, rules with indices [0 1] all have the same name 'r'"),
    (js(failurePolicy={"rules": [{"name": "9bad", "action": "FailJobSet"}]}),
     "invalid failure policy rule name '9bad'"),
    (js(failurePolicy={"rules": [{"name": "r", "action": "RestartJob"}]}),
     "RestartJob and RestartJobAndIgnoreMaxRestarts failure policy actions are not allowed when RestartJob feature gate is disabled"),
    (js(failurePolicy={"restartStrategy": "InPlaceRestart"}),
     "InPlaceRestart restart strategy cannot be set when InPlaceRestart feature gate is disabled"),
    (js(network={"subdomain": "x" * 64}), ".spec.network.subdomain is too long, must be less than 63 characters"),
    (js(rjobs=[_rjob("a")], coordinator={"replicatedJob": "zz"}), "coordinator replicatedJob zz does not exist"),
    (js(rjobs=[_rjob("a")], coordinator={"replicatedJob": "a", "podIndex": 3}),
     "coordinator pod index 3 is invalid for replicatedJob a job index 0"),
])
def test_create_rejections(doc, message):
    assert any(message in error for error in validate_jobset(doc))


def test_valid_jobset_and_updates():
    doc = default_jobset(js())
    assert validate_jobset(doc) == []
    changed = json.loads(json.dumps(doc))
    changed["spec"]["replicatedJobs"][0]["replicas"] = 3
    assert validate_jobset(changed, doc) == ["spec.replicatedJobs: Invalid value: field is immutable"]
    suspended = json.loads(json.dumps(doc))
    suspended["spec"]["suspend"] = True
    labelled = json.loads(json.dumps(suspended))
    labelled["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"labels": {"a": "b"}}
    assert validate_jobset(labelled, suspended) == []
    assert validate_jobset(suspended, doc) == []


def test_review_patches_defaults_and_denies_with_messages():
    answer = review_response({"request": {"uid": "u1", "operation": "CREATE", "object": js()}}, mutate=True)
    patch = json.loads(base64.b64decode(answer["response"]["patch"]))
    assert answer["response"]["uid"] == "u1" and answer["response"]["allowed"] is True
    assert patch[0]["path"] == "/spec" and patch[0]["value"]["successPolicy"] == {"operator": "All"}
    denied = review_response({"request": {"uid": "u2", "operation": "CREATE",
                                           "object": js(successPolicy={"operator": "All", "targetReplicatedJobs": ["nope"]})}},
                             mutate=False)
    assert denied["response"]["allowed"] is False
    assert "invalid replicatedJob name 'nope'" in denied["response"]["status"]["message"]
