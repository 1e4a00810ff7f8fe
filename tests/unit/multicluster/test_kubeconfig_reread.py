"""A reachable worker's kubeconfig Secret is not read at every probe (issue #33: those reads
were most of an idle dispatcher's API requests), but it is read at once whenever the worker
stops answering or its MultiKueueCluster points elsewhere, and every KUBECONFIG_REREAD_S."""
from __future__ import annotations

import time

from trainyard.multicluster.registry import KUBECONFIG_REREAD_S, WorkerRegistry, WorkerState, _source


def cluster(location: str = "worker-1-kubeconfig") -> dict:
    return {"metadata": {"name": "worker-1"}, "spec": {"kubeConfig": {"location": location, "locationType": "Secret"}}}


def connected() -> WorkerState:
    worker = WorkerState("worker-1", client=object(), reachable=True)  # type: ignore[arg-type]
    worker.kubeconfig_source = _source(cluster())
    worker.kubeconfig_read_at = time.monotonic()
    return worker


def test_a_reachable_worker_keeps_its_kubeconfig_between_rereads() -> None:
    assert not WorkerRegistry._kubeconfig_due(connected(), cluster())
    stale = connected()
    stale.kubeconfig_read_at -= KUBECONFIG_REREAD_S
    assert WorkerRegistry._kubeconfig_due(stale, cluster())


def test_it_is_read_at_once_when_the_worker_stops_answering_or_points_elsewhere() -> None:
    unreachable = connected()
    unreachable.reachable = False
    assert WorkerRegistry._kubeconfig_due(unreachable, cluster())
    assert WorkerRegistry._kubeconfig_due(connected(), cluster("rotated-kubeconfig"))
    assert WorkerRegistry._kubeconfig_due(WorkerState("worker-1"), cluster())  # never read
