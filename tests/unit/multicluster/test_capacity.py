"""The capacity summary a dispatcher keeps of each worker from its Node and Pod watch: each
event changes it by that object's share, and it matches a fresh summary of the same objects."""
from __future__ import annotations

import asyncio
from fractions import Fraction

from trainyard.kube import resources as r
from trainyard.multicluster.capacity import CapacitySummary
from trainyard.multicluster.placement import node_allocatable, pod_use_by_owner


def node(name: str, pods: str, ready: str = "True") -> dict:
    return {"metadata": {"name": name},
            "status": {"allocatable": {"cpu": "8", "pods": pods}, "conditions": [{"type": "Ready", "status": ready}]}}


def pod(name: str, jobset: str | None, cpu: str, phase: str = "Running") -> dict:
    labels = {"jobset.sigs.k8s.io/jobset-name": jobset} if jobset else {}
    return {"metadata": {"name": name, "namespace": "team", "labels": labels},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": phase}}


def test_events_keep_the_summary_equal_to_a_fresh_one() -> None:
    seen = []
    summary = CapacitySummary(lambda allocatable, use: seen.append((dict(allocatable), {k: dict(v) for k, v in use.items()})))

    async def scenario() -> None:
        await summary.on_relist(r.NODE, [node("n1", "10")], "1")
        assert seen == []  # nothing said before both Nodes and Pods are listed
        await summary.on_relist(r.POD, [pod("a-0", "a", "1"), pod("a-1", "a", "1"), pod("x", None, "500m")], "2")
        await summary.on_event(r.POD, "MODIFIED", pod("a-1", "a", "1", phase="Succeeded"))
        await summary.on_event(r.POD, "ADDED", pod("b-0", "b", "2"))
        await summary.on_event(r.POD, "DELETED", pod("x", None, "500m"))
        await summary.on_event(r.NODE, "ADDED", node("n2", "5"))
        await summary.on_event(r.NODE, "MODIFIED", node("n1", "10", ready="False"))

    asyncio.run(scenario())
    allocatable, use = seen[-1]
    assert allocatable == node_allocatable([node("n2", "5")]) == {"cpu": Fraction(8), "pods": Fraction(5)}
    assert use == pod_use_by_owner([pod("a-0", "a", "1"), pod("b-0", "b", "2")])
    assert use == {("team", "a"): {"cpu": Fraction(1), "pods": Fraction(1)},
                   ("team", "b"): {"cpu": Fraction(2), "pods": Fraction(1)}}

