"""A JobSet's ``volumeClaimPolicies`` claim is a directory that outlives its pods (a suspend and
resume finds what the first pods wrote) and goes with the JobSet; a pod whose ``nodeSelector``
the node does not satisfy waits until the node is labelled."""
from __future__ import annotations

from fixtures.dataplane import jobset_object, replicated_job, wait_until
from trainyard.kube.resources import JOBSET, Resource

POD = Resource("", "v1", "pods", "Pod")
PVC = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
NODE = Resource("", "v1", "nodes", "Node", False)


async def _pods(kube, ns):
    pods, _ = await kube.list(POD, ns)
    return pods


async def test_claim_survives_suspend_and_goes_with_the_jobset(dataplane_cluster, kube, ns):
    job = replicated_job("w", ["sh", "-c", "echo run >> /ckpt/runs; exec sleep 300"])
    job["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "ckpt", "mountPath": "/ckpt"}]
    policies = [{"templates": [{"metadata": {"name": "ckpt"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}]
    await kube.create(JOBSET, ns, jobset_object("js", ns, [job], volumeClaimPolicies=policies))
    runs = dataplane_cluster.data_dir / "claims" / ns / "ckpt-js" / "runs"

    claim = await wait_until(lambda: _bound(kube, ns, "ckpt-js"), what="claim ckpt-js bound")
    assert claim["status"]["capacity"] == {"storage": "1Gi"}
    pods = await wait_until(lambda: _pods(kube, ns), what="pod created")
    assert {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-js"}} in pods[0]["spec"]["volumes"]
    await wait_until(lambda: runs.exists() and runs.read_text() == "run\n", what="first run wrote the claim")

    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": True}})
    await wait_until(lambda: _no_pods(kube, ns), what="pods gone on suspend")
    await kube.merge_patch(JOBSET, ns, "js", {"spec": {"suspend": False}})
    await wait_until(lambda: runs.read_text() == "run\nrun\n", what="the resumed pod appended to the same claim")

    await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})
    await wait_until(lambda: _claim_gone(kube, ns, "ckpt-js"), what="claim deleted with its JobSet")
    await wait_until(lambda: not runs.parent.exists(), what="claim directory removed")


async def test_node_selector_waits_for_a_matching_node_label(dataplane_cluster, kube, ns):
    job = replicated_job("w", ["sleep", "300"])
    job["template"]["spec"]["template"]["spec"]["nodeSelector"] = {f"example.com/{ns}": "yes"}
    await kube.create(JOBSET, ns, jobset_object("js", ns, [job]))
    try:
        async def unschedulable():
            for pod in await _pods(kube, ns):
                for cond in (pod.get("status") or {}).get("conditions") or []:
                    if cond["type"] == "PodScheduled" and cond["status"] == "False":
                        return cond
            return None
        cond = await wait_until(unschedulable, what="pod unschedulable")
        assert cond["message"] == "0/1 nodes are available: 1 node(s) didn't match Node's node affinity/selector."
        await kube.merge_patch(NODE, None, "devcluster", {"metadata": {"labels": {f"example.com/{ns}": "yes"}}})

        async def running():
            pods = await _pods(kube, ns)
            return pods and (pods[0].get("status") or {}).get("phase") == "Running"
        await wait_until(running, what="pod running once the node has the label")
    finally:
        await kube.merge_patch(NODE, None, "devcluster", {"metadata": {"labels": {f"example.com/{ns}": None}}})
        await kube.request("DELETE", JOBSET.path(ns, "js"), body={"propagationPolicy": "Foreground"})


async def _bound(kube, ns, name):
    claim = await kube.get(PVC, ns, name)
    return claim if claim and (claim.get("status") or {}).get("phase") == "Bound" else None


async def _claim_gone(kube, ns, name):
    return await kube.get(PVC, ns, name) is None


async def _no_pods(kube, ns):
    return not await _pods(kube, ns)
