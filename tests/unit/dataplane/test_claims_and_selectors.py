"""JobSet ``volumeClaimPolicies`` (the PVCs a JobSet creates and the volumes its pods get), the
status a devcluster claim shows, and node selectors in the scheduler."""
from __future__ import annotations

from trainyard_services.devcluster.dataplane.claims import bound_status
from trainyard_services.devcluster.dataplane.jobsets import build_job, volume_claims
from trainyard_services.devcluster.dataplane.scheduling import SELECTOR_MISMATCH, schedule

SPEC = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}


def jobset_with_claims(*policies, mounts=("ckpt",)):
    container = {"name": "c", "image": "x", "command": ["true"],
                 "volumeMounts": [{"name": m, "mountPath": f"/{m}"} for m in mounts]}
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ns1", "uid": "js-uid"},
            "spec": {"volumeClaimPolicies": list(policies), "replicatedJobs": [
                {"name": "node", "replicas": 1, "template": {"spec": {"parallelism": 2, "completions": 2,
                                                                      "template": {"spec": {"containers": [container]}}}}}]}}


def test_claims_are_named_after_template_and_jobset_and_owned_unless_retained():
    js = jobset_with_claims(
        {"templates": [{"metadata": {"name": "ckpt", "labels": {"team": "a"}, "annotations": {"note": "x"}},
                        "spec": SPEC}]},
        {"templates": [{"metadata": {"name": "cache"}, "spec": SPEC}], "retentionPolicy": {"whenDeleted": "Retain"}})
    owned, kept = volume_claims(js)
    assert owned["metadata"] == {
        "name": "ckpt-train", "namespace": "ns1",
        "labels": {"team": "a", "jobset.sigs.k8s.io/jobset-name": "train"}, "annotations": {"note": "x"},
        "ownerReferences": [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train",
                             "uid": "js-uid", "controller": True, "blockOwnerDeletion": True}]}
    assert owned["spec"] == SPEC
    assert kept["metadata"]["name"] == "cache-train"
    assert "ownerReferences" not in kept["metadata"]


def test_pods_get_a_volume_for_each_claim_a_container_mounts():
    js = jobset_with_claims({"templates": [{"metadata": {"name": "ckpt"}, "spec": SPEC},
                                           {"metadata": {"name": "unused"}, "spec": SPEC}]})
    pod_spec = build_job(js, 0, 0, 0)["spec"]["template"]["spec"]
    assert pod_spec["volumes"] == [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt-train"}}]


def test_without_policies_nothing_changes():
    js = jobset_with_claims()
    assert volume_claims(js) == []
    assert "volumes" not in build_job(js, 0, 0, 0)["spec"]["template"]["spec"]


def test_a_claim_is_bound_with_what_it_asked_for():
    assert bound_status({"spec": SPEC}) == {"phase": "Bound", "accessModes": ["ReadWriteMany"],
                                            "capacity": {"storage": "1Gi"}}


def _pod(name, selector=None):
    spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}
    if selector:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": "t1"}, "spec": spec}


def test_node_selector_must_match_the_node_labels():
    labels = {"kubernetes.io/hostname": "devcluster", "example.com/pool": "reserved"}
    pending = [_pod("free"), _pod("match", {"example.com/pool": "reserved"}),
               _pod("other", {"example.com/pool": "spot"}), _pod("missing", {"zone": "a"})]
    decision = schedule({"cpu": 8000, "pods": 110}, [], pending, {}, labels)
    assert decision.bind == ["ns/free", "ns/match"]
    assert decision.unschedulable == {"ns/other": ("Unschedulable", SELECTOR_MISMATCH),
                                      "ns/missing": ("Unschedulable", SELECTOR_MISMATCH)}
