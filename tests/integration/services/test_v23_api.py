"""Kubeflow Trainer v2.3.0 manifests through kubectl, devcluster's CRD rules, the webhook and the
planner (real nats-server, devcluster and services)."""
from __future__ import annotations

import json

import pytest

from integration.services.conftest import CTR, JOBSETS, TRAINJOBS, small_runtime, trainjob, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def running(shared_stack, shared_api):
    shared_api.create(CTR, small_runtime("torch-distributed"))
    elastic = small_runtime("torch-elastic")
    elastic["spec"]["mlPolicy"] = {"torch": {"elasticPolicy": {"minNodes": 1, "maxNodes": 4}}}
    shared_api.create(CTR, elastic)
    return shared_stack, shared_api


def apply(stack, doc, check=False):
    return stack.kubectl("apply", "-f", "-", input=json.dumps(doc), check=check)


def test_v23_trainjob_with_runtime_patches_reaches_the_jobset(running):
    stack, api = running
    job = trainjob("patched", trainer={"numNodes": 2}, activeDeadlineSeconds=3600, runtimePatches=[{
        "manager": "kueue.x-k8s.io/manager",
        "trainingRuntimeSpec": {"template": {
            "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": {"spec": {
                "nodeSelector": {"pool": "a100"},
                "schedulingGates": [{"name": "kueue.x-k8s.io/admission"}]}}}}}]}}}}])
    apply(stack, job, check=True)
    stored = api.get(TRAINJOBS.format(ns="default") + "/patched")
    assert stored["spec"]["activeDeadlineSeconds"] == 3600  # not pruned: the field is in the CRD
    assert stored["spec"]["runtimePatches"][0]["manager"] == "kueue.x-k8s.io/manager"
    jobset = wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/patched"), what="JobSet")
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "a100"}
    assert pod["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]


def test_v23_trainer_rule_and_the_num_nodes_webhook(running):
    stack, api = running
    apply(stack, trainjob("fixed", trainer={"numNodes": 1, "image": "a:1"}), check=True)
    image = apply(stack, trainjob("fixed", trainer={"numNodes": 1, "image": "a:2"}))
    assert image.returncode == 1
    assert 'The TrainJob "fixed" is invalid: spec.trainer: Invalid value: "object": field is immutable' in image.stderr
    nodes = apply(stack, trainjob("fixed", trainer={"numNodes": 2, "image": "a:1"}))
    assert nodes.returncode == 1
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.trainer: ' \
        'Invalid value: ' in nodes.stderr and "field is immutable" in nodes.stderr
    # An elastic runtime may be resized.
    apply(stack, trainjob("stretchy", runtime="torch-elastic", trainer={"numNodes": 1}), check=True)
    apply(stack, trainjob("stretchy", runtime="torch-elastic", trainer={"numNodes": 3}), check=True)
    assert api.get(TRAINJOBS.format(ns="default") + "/stretchy")["spec"]["trainer"]["numNodes"] == 3


def test_v23_runtime_rules_in_devcluster(running):
    stack, _ = running
    both = small_runtime("two-policies")
    both["spec"]["mlPolicy"] = {"jax": {}, "xgboost": {}}
    result = apply(stack, both)
    assert result.returncode == 1
    assert "spec.mlPolicy: Invalid value: \"object\": Only one of the policy can be configured" in result.stderr
    jax = small_runtime("jax-ok")
    jax["spec"]["mlPolicy"] = {"numNodes": 1, "jax": {}}
    apply(stack, jax, check=True)


def test_bad_manager_is_refused_by_the_webhook(running):
    stack, api = running
    result = apply(stack, trainjob("badpatch", runtimePatches=[{"manager": "kueue"}]))
    assert result.returncode == 1
    assert 'spec.runtimePatches.manager: Invalid value: "kueue": must be a domain-prefixed path' in result.stderr
    assert api.get(TRAINJOBS.format(ns="default") + "/badpatch") is None
