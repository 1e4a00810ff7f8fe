"""What a dispatcher replica remembers of its manager TrainJobs saves it passes that could only
meet a conflict: the echoes of its own writes, and stale copies of a TrainJob it has seen
newer (issue #33: at a CPU limit such passes were most of a replica's writes)."""
from __future__ import annotations

import time

from trainyard.multicluster.delegation import WORKER_ANNOTATION
from trainyard_services.dispatcher.service import OWN_WRITES_KEPT, Dispatcher

KEY = ("team-a", "mnist")


def dispatcher() -> Dispatcher:
    replica = Dispatcher(bus=None, manager=None, cluster="manager", registry=None, slots=None)  # type: ignore[arg-type]
    replica.fed_by_events = True
    return replica


def trainjob(resource_version: str, worker: str | None = None) -> dict:
    meta = {"namespace": KEY[0], "name": KEY[1], "resourceVersion": resource_version}
    if worker:
        meta["annotations"] = {WORKER_ANNOTATION: worker}
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": meta,
            "spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}


def test_the_echo_of_an_earlier_write_of_the_same_pass_is_recognised() -> None:
    """A placement writes the annotation, then the status: the first write's event arrives after
    the second write and is an echo all the same."""
    replica = dispatcher()
    replica._wrote(trainjob("5", "worker-1"))
    replica._wrote(trainjob("6", "worker-1"))
    assert replica._own_echo(KEY, "5") and replica._own_echo(KEY, "6")
    assert not replica._own_echo(KEY, "7") and not replica._own_echo(KEY, "")
    for rv in range(7, 7 + OWN_WRITES_KEPT):  # bounded per TrainJob
        replica._wrote(trainjob(str(rv)))
    assert not replica._own_echo(KEY, "5")


def test_a_pass_starts_from_the_newest_state_the_replica_saw() -> None:
    replica = dispatcher()
    listed_at = time.time()
    from_the_list = trainjob("4")  # not placed yet when the resync listed it
    time.sleep(0.01)
    replica._wrote(trainjob("5", "worker-1"))  # placed by an event's pass since
    assert replica._newest(*KEY, from_the_list, listed_at)["metadata"]["resourceVersion"] == "5"
    # Handed a state newer than what was seen (an event): that one.
    assert replica._newest(*KEY, trainjob("9"), time.time() + 1)["metadata"]["resourceVersion"] == "9"
    assert replica._newest(*KEY, trainjob("9"), None)["metadata"]["resourceVersion"] == "9"
    # A copy's pass (handed nothing) starts from what was seen instead of a GET.
    assert replica._newest(*KEY, None, None)["metadata"]["resourceVersion"] == "5"
    replica._remember(KEY, None)  # deleted
    assert replica._newest(*KEY, None, None) is None


def test_without_the_bus_nothing_is_remembered_for_a_pass() -> None:
    replica = dispatcher()
    replica.fed_by_events = False
    replica._seen[KEY] = (time.time(), trainjob("5"))
    assert replica._newest(*KEY, None, None) is None


def test_a_full_resync_hands_a_listed_copy_only_when_it_is_the_version_last_worked_from() -> None:
    """A full resync lists each worker's copies once instead of a GET per TrainJob; a listed copy
    replaces the GET only when it is the very version the TrainJob's last pass used (else the
    list may be older than what an event has shown since, and would mirror an older status)."""
    replica = dispatcher()
    placed = trainjob("5", "worker-1")

    def copy(resource_version: str) -> dict:
        return {"metadata": {"namespace": KEY[0], "name": KEY[1], "resourceVersion": resource_version}}

    listed = {"worker-1": {KEY: copy("12")}}
    assert replica._listed_copy(listed, placed) is None  # never worked from: read
    replica._copy_versions[KEY] = ("worker-1", "12")
    assert replica._listed_copy(listed, placed) == ("worker-1", copy("12"))
    replica._copy_versions[KEY] = ("worker-1", "13")  # an event showed a newer one
    assert replica._listed_copy(listed, placed) is None
    replica._copy_versions[KEY] = ("worker-2", "12")
    assert replica._listed_copy(listed, placed) is None
    assert replica._listed_copy({}, placed) is None  # worker-1 did not answer the list
    assert replica._listed_copy(listed, trainjob("4")) is None  # not placed


def test_a_late_copy_event_is_only_a_trigger() -> None:
    """A replica behind its queue reads the copy instead of mirroring an event's older copy (a
    pass may have seen a newer one meanwhile); a fresh event's copy saves that read."""
    import asyncio
    import json

    from trainyard.bus.consumer import Delivery
    from trainyard.bus.envelopes import ObjectEvent, decode
    from trainyard.multicluster.delegation import ORIGIN_LABEL

    def copy_event(published_at: float) -> Delivery:
        event = {"cluster": "worker-1", "type": "MODIFIED", "kind": "TrainJob",
                 "apiVersion": "trainer.kubeflow.org/v1alpha1", "namespace": KEY[0], "name": KEY[1],
                 "object": {"metadata": {"namespace": KEY[0], "name": KEY[1], "resourceVersion": "12",
                                         "labels": {ORIGIN_LABEL: "manager"}}}}
        return Delivery(subject="ty.events.x", data=json.dumps(event).encode(), headers={}, num_delivered=1,
                        stream_sequence=1, published_at=published_at)

    async def handled(published_at: float) -> tuple:
        replica = dispatcher()
        delivery = copy_event(published_at)
        await replica.handle(decode(ObjectEvent, delivery.data), delivery)
        hint = replica._mirrors[KEY]
        for task in replica._tasks:
            task.cancel()
        return hint

    assert asyncio.run(handled(time.time()))[1]["metadata"]["resourceVersion"] == "12"
    assert asyncio.run(handled(time.time() - 30)) == ("worker-1", None)
