"""Fit and gang decisions of the single-node scheduler (table tests)."""
from __future__ import annotations

import pytest

from trainyard_services.devcluster.dataplane.scheduling import GangKey, pod_requests, schedule

NODE = {"cpu": 4000, "memory": 8 * 2 ** 30, "pods": 110, "nvidia.com/gpu": 0}


def pod(name, cpu="1", *, group=None, volcano=None, gpu=None, phase=None, gates=None, created="t1"):
    resources = {"requests": {"cpu": cpu}}
    if gpu:
        resources["limits"] = {"nvidia.com/gpu": gpu}
    meta = {"name": name, "namespace": "ns", "creationTimestamp": created, "labels": {}, "annotations": {}}
    spec = {"containers": [{"name": "c", "resources": resources}]}
    if group:
        meta["labels"]["scheduling.x-k8s.io/pod-group"] = group
    if volcano:
        meta["annotations"]["scheduling.k8s.io/group-name"] = volcano
        spec["schedulerName"] = "volcano"
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    out = {"metadata": meta, "spec": spec}
    if phase:
        out["status"] = {"phase": phase}
    return out


def test_requests_sum_containers_and_take_init_max():
    p = {"spec": {"containers": [{"resources": {"requests": {"cpu": "500m"}}},
                                 {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}],
                  "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}}
    assert pod_requests(p) == {"cpu": 2000, "memory": 2 ** 30, "pods": 1}


CASES = [
    ("plain pods fit in order, the rest waits",
     [], [pod("a", "2"), pod("b", "2"), pod("c", "1")], {}, ["ns/a", "ns/b"], {"ns/c": "1 Insufficient cpu"}),
    ("terminal bound pods free their room",
     [pod("done", "4", phase="Succeeded")], [pod("a", "4")], {}, ["ns/a"], {}),
    ("gang of 4 with room for 3 binds none",
     [pod("blocker", "1")], [pod(f"g{i}", "1", group="pg") for i in range(4)],
     {GangKey("coscheduling", "ns", "pg"): 4}, [], {"ns/g0": "needs 4 pods scheduled together"}),
    ("gang of 4 with room for 4 binds all",
     [], [pod(f"g{i}", "1", group="pg") for i in range(4)],
     {GangKey("coscheduling", "ns", "pg"): 4}, ["ns/g0", "ns/g1", "ns/g2", "ns/g3"], {}),
    ("gang counts members already bound",
     [pod("g0", "1", group="pg")], [pod("g1", "1", group="pg")],
     {GangKey("coscheduling", "ns", "pg"): 2}, ["ns/g1"], {}),
    ("gang without its PodGroup waits",
     [], [pod("g0", "1", group="missing")], {}, [], {"ns/g0": 'pod group "ns/missing" not found'}),
    ("volcano gang by annotation",
     [pod("blocker", "2")], [pod("v0", "1", volcano="vg"), pod("v1", "1", volcano="vg"), pod("v2", "1", volcano="vg")],
     {GangKey("volcano", "ns", "vg"): 3}, [], {"ns/v2": "needs 3 pods"}),
    ("volcano annotation without volcano scheduler is a plain pod",
     [], [{**pod("x", "1"), "metadata": {**pod("x")["metadata"], "annotations": {"scheduling.k8s.io/group-name": "vg"}}}],
     {}, ["ns/x"], {}),
    ("gpus are a resource like any other",
     [], [pod("gpu", "1", gpu="1")], {}, [], {"ns/gpu": "Insufficient nvidia.com/gpu"}),
    ("scheduling gates hold a pod",
     [], [pod("gated", "1", gates=["wait"])], {}, [], {"ns/gated": "Scheduling is blocked due to non-empty scheduling gates"}),
    ("a failing gang does not block a younger plain pod",
     [], [pod("g0", "3", group="pg", created="t1"), pod("g1", "3", group="pg", created="t1"), pod("late", "1", created="t2")],
     {GangKey("coscheduling", "ns", "pg"): 2}, ["ns/late"], {"ns/g1": "needs 2 pods"}),
]


@pytest.mark.parametrize("title,bound,pending,gangs,bind,waiting", CASES, ids=[c[0] for c in CASES])
def test_schedule(title, bound, pending, gangs, bind, waiting):
    decision = schedule(NODE, bound, pending, gangs)
    assert decision.bind == bind
    for key, fragment in waiting.items():
        assert fragment in decision.unschedulable[key][1]
    assert not set(decision.bind) & set(decision.unschedulable)
