"""Pod-level conformance through the API: readiness and InOrder startup, restarts with previous
logs, podFailurePolicy, the Python client's view of pods, and pods/log."""
from __future__ import annotations

import asyncio
import os

import pytest

from fixtures.dataplane import jobset_object, replicated_job, wait_until
from trainyard.kube.resources import JOBSET, Resource

NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
POD = Resource("", "v1", "pods", "Pod")
JOB = Resource("batch", "v1", "jobs", "Job")


async def condition(kube, ns, name, kind, status="True"):
    js = await kube.get(JOBSET, ns, name)
    for item in ((js or {}).get("status") or {}).get("conditions") or []:
        if item["type"] == kind and item["status"] == status:
            return item
    return None


async def test_in_order_startup_follows_readiness_probe(dataplane_cluster, kube, ns):
    first = replicated_job("a", ["sleep", "300"])
    first["template"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["test", "-f", "/tmp/ty-ready-" + ns]}, "periodSeconds": 1}
    await kube.create(JOBSET, ns, jobset_object("js", ns, [first, replicated_job("b", ["sleep", "300"])],
                                                startupPolicy={"startupPolicyOrder": "InOrder"}))
    progress = await wait_until(lambda: condition(kube, ns, "js", "StartupPolicyInProgress"), what="in progress")
    assert progress["reason"] == "InOrderStartupPolicyInProgress"
    await wait_until(lambda: _pod_phase(kube, ns, "js-a-0-0-", "Running"), what="a running")
    jobs, _ = await kube.list(JOB, ns)
    assert [j["metadata"]["name"] for j in jobs] == ["js-a-0"]  # not ready: b is not created
    pod = await _pod_phase(kube, ns, "js-a-0-0-", "Running")
    assert pod["status"]["containerStatuses"][0]["ready"] is False
    open("/tmp/ty-ready-" + ns, "w").close()  # the probe runs in the pod's mount namespace over the host's /tmp
    try:
        completed = await wait_until(lambda: condition(kube, ns, "js", "StartupPolicyCompleted"), timeout=60,
                                     what="startup completed")
        assert completed["reason"] == "InOrderStartupPolicyCompleted"
        in_progress = next(c for c in (await kube.get(JOBSET, ns, "js"))["status"]["conditions"]
                           if c["type"] == "StartupPolicyInProgress")
        assert (in_progress["status"], in_progress["reason"]) == ("False", "InOrderStartupPolicyInProgress")
    finally:
        os.unlink("/tmp/ty-ready-" + ns)
        await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})


async def _pod_phase(kube, ns, prefix, phase):
    pods, _ = await kube.list(POD, ns)
    for pod in pods:
        if pod["metadata"]["name"].startswith(prefix) and (pod.get("status") or {}).get("phase") == phase:
            return pod
    return None


async def test_on_failure_restart_keeps_the_pod_and_previous_log(dataplane_cluster, kube, ns):
    rjob = replicated_job("w", ["sh", "-c", "if [ -f /state/ran ]; then echo second; exit 0; fi; "
                                            "touch /state/ran; echo first; exit 1"],
                          restart_policy=None, backoff_limit=6)
    pod_spec = rjob["template"]["spec"]["template"]["spec"]
    pod_spec["containers"][0]["volumeMounts"] = [{"name": "state", "mountPath": "/state"}]
    pod_spec["volumes"] = [{"name": "state", "emptyDir": {}}]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [rjob]))
    await wait_until(lambda: condition(kube, ns, "js", "Completed"), timeout=60, what="Completed")
    pods, _ = await kube.list(POD, ns)
    assert len(pods) == 1
    status = pods[0]["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1 and status["lastState"]["terminated"]["exitCode"] == 1
    name = pods[0]["metadata"]["name"]
    logs = dataplane_cluster.server.kubectl("logs", "-n", ns, name).stdout
    previous = dataplane_cluster.server.kubectl("logs", "-n", ns, name, "--previous").stdout
    assert (logs, previous) == ("second\n", "first\n")


async def test_pod_failure_policy_fail_job_rule(dataplane_cluster, kube, ns):
    rjob = replicated_job("w", ["sh", "-c", "exit 42"], backoff_limit=6,
                          podFailurePolicy={"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [42]}}]})
    await kube.create(JOBSET, ns, jobset_object("js", ns, [rjob], failurePolicy={"rules": [{
        "name": "exit42", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
        "onJobFailureMessagePatterns": ["exit code 42"]}]}))
    failed = await wait_until(lambda: condition(kube, ns, "js", "Failed"), timeout=60, what="Failed")
    assert failed["reason"] == "FailJobSetFailurePolicyAction"
    job = await kube.get(JOB, ns, "js-w-0")
    job_failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert job_failed["reason"] == "PodFailurePolicy"
    assert job_failed["message"].startswith("Container c for pod " + ns + "/js-w-0-0-")
    assert job_failed["message"].endswith("failed with exit code 42 matching FailJob rule at index 0")


async def test_python_client_reads_pods_at_every_stage_and_log_errors(dataplane_cluster, kube, ns):
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(dataplane_cluster.kubeconfig)))
    rjob = replicated_job("w", ["sh", "-c", "sleep 1; echo done"])
    rjob["template"]["spec"]["template"]["spec"]["containers"].append(
        {"name": "side", "image": "x", "command": ["sh", "-c", "sleep 1"]})
    await kube.create(JOBSET, ns, jobset_object("js", ns, [rjob]))
    seen = set()
    for _ in range(200):
        pods = api.list_namespaced_pod(ns).items  # raises if a required field is missing
        for pod in pods:
            seen.add(pod.status.phase)
            for status in pod.status.container_statuses or []:
                assert status.image_id == "" and status.name and status.image is not None
            types = [c.type for c in pod.status.conditions or []]
            if len(types) > 1:  # before the kubelet reports, binding has written PodScheduled alone
                assert types == ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                 "PodScheduled"]
        if await condition(kube, ns, "js", "Completed"):
            break
        await asyncio.sleep(0.1)
    assert "Succeeded" in seen and ("Running" in seen or "Pending" in seen)
    name = api.list_namespaced_pod(ns).items[0].metadata.name
    with pytest.raises(client.ApiException) as missing:
        api.read_namespaced_pod_log(name, ns)
    assert missing.value.status == 400
    assert f"a container name must be specified for pod {name}, choose one of: [c side]" in missing.value.body
    assert api.read_namespaced_pod_log(name, ns, container="c") == "done\n"
