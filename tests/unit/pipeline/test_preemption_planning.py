"""What preemption-safe training needs from planning: the grace period a runtime patch gives
reaches the JobSet's pod template, and a runtime's JobSet ``volumeClaimPolicies`` (the
checkpoint volume) reach the JobSet unchanged."""
from __future__ import annotations

import copy

from fixtures.pipeline_builders import container, find, job, runtime, trainjob
from trainyard.pipeline import plan


def _node_runtime() -> dict:
    return runtime([job("node", container("node"), ancestor="trainer")])


def _pod_spec(jobset: dict) -> dict:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_runtime_patch_sets_the_termination_grace_period() -> None:
    job_doc = copy.deepcopy(trainjob())
    job_doc["spec"]["runtimePatches"] = [{"manager": "kueue.x-k8s.io/manager", "trainingRuntimeSpec": {
        "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
            "spec": {"terminationGracePeriodSeconds": 90, "nodeSelector": {"pool": "b"}}}}}}]}}}}]
    pod = _pod_spec(find(plan(job_doc, _node_runtime()).objects, "JobSet"))
    assert pod["terminationGracePeriodSeconds"] == 90
    assert pod["nodeSelector"] == {"pool": "b"}


def test_volume_claim_policies_reach_the_jobset() -> None:
    rt = _node_runtime()
    policies = [{"templates": [{"metadata": {"name": "checkpoints"},
                                "spec": {"accessModes": ["ReadWriteMany"],
                                         "resources": {"requests": {"storage": "1Gi"}}}}],
                 "retentionPolicy": {"whenDeleted": "Delete"}}]
    rt["spec"]["template"]["spec"]["volumeClaimPolicies"] = policies
    jobset = find(plan(copy.deepcopy(trainjob()), rt).objects, "JobSet")
    assert jobset["spec"]["volumeClaimPolicies"] == policies
