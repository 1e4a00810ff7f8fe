"""TrainJob lifecycle metrics, trainjob.uid on every span, span links from a traceparent, and
the kube-apiserver verbs of devcluster's request metrics."""
from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard.telemetry import metrics
from trainyard_services.status import trainjob_metrics as trainjobs
from trainyard.telemetry.scrape import refresh_metrics
from trainyard.telemetry.tracing import TRAINJOB_UID, TrainJobUidProcessor, link_to, trainjob_span


def job(runtime: str = "torch-distributed", created: str = "2026-01-01T00:00:00Z") -> dict:
    return {"metadata": {"name": "a", "namespace": "default", "uid": "u-1", "creationTimestamp": created},
            "spec": {"runtimeRef": {"name": runtime}}}


def condition(kind: str, when: str = "2026-01-01T00:01:40Z") -> dict:
    return {"type": kind, "status": "True", "reason": kind, "lastTransitionTime": when}


def test_state_of_a_trainjob_status() -> None:
    assert trainjobs.state_of(None) == "Pending"
    assert trainjobs.state_of({"jobsStatus": [{"name": "node", "active": 0, "ready": 0}]}) == "Pending"
    assert trainjobs.state_of({"jobsStatus": [{"name": "node", "active": 2}]}) == "Running"
    assert trainjobs.state_of({"conditions": [condition("Suspended")]}) == "Suspended"
    assert trainjobs.state_of({"conditions": [condition("Complete")], "jobsStatus": [{"active": 1}]}) == "Complete"
    assert trainjobs.state_of({"conditions": [condition("Failed"), condition("Complete")]}) == "Failed"
    counts = trainjobs.count_states([{**job(), "status": {"conditions": [condition("Complete")]}}, job(), job("x")])
    assert counts == {("Complete", "torch-distributed"): 1, ("Pending", "torch-distributed"): 1, ("Pending", "x"): 1}


def _count(histogram, *labels) -> float:
    return next(s.value for m in histogram.collect() for s in m.samples
                if s.name.endswith("_count") and tuple(s.labels.values()) == labels)


def test_transitions_observe_time_to_running_and_to_complete_once() -> None:
    runtime = "unit-runtime"
    trainjob = job(runtime)
    running = {"jobsStatus": [{"name": "node", "active": 1}]}
    trainjobs.observe_transition(trainjob, {}, running, now=1767225610.0)  # created + 10 s
    assert _count(metrics.TRAINJOB_TIME_TO_RUNNING, runtime) == 1
    trainjobs.observe_transition(trainjob, running, running, now=1767225620.0)  # no transition
    assert _count(metrics.TRAINJOB_TIME_TO_RUNNING, runtime) == 1
    done = {"conditions": [condition("Complete")]}
    trainjobs.observe_transition(trainjob, running, done)
    assert _count(metrics.TRAINJOB_TIME_TO_COMPLETE, runtime, "Complete") == 1
    assert _count(metrics.TRAINJOB_TIME_TO_COMPLETE, runtime, "Failed") == 0  # created at zero
    total = next(s.value for m in metrics.TRAINJOB_TIME_TO_COMPLETE.collect() for s in m.samples
                 if s.name.endswith("_sum") and s.labels == {"runtime": runtime, "result": "Complete"})
    assert total == 100.0  # creation -> the condition's lastTransitionTime


def test_every_span_under_a_trainjob_context_carries_its_uid_and_links_resolve() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(TrainJobUidProcessor())
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    previous = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trainjob_span(tracer, "observe TrainJob", "uid-7", root=True, links=link_to(previous, "uid-7")):
        with tracer.start_as_current_span("child"):
            with tracer.start_as_current_span("grandchild"):
                pass
    with tracer.start_as_current_span("unrelated"):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    for name in ("observe TrainJob", "child", "grandchild"):
        assert spans[name].attributes[TRAINJOB_UID] == "uid-7"
    assert TRAINJOB_UID not in spans["unrelated"].attributes
    root = spans["observe TrainJob"]
    assert root.parent is None
    assert [(f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") for link in root.links] == \
        [("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")]
    assert link_to("") == [] and link_to("garbage") == [] and link_to("00-zz-yy-01") == []


def test_devcluster_verbs_follow_kube_apiserver() -> None:
    from trainyard_services.devcluster.apiserver.endpoints.metrics import verb_of

    assert verb_of("GET", True, False, "") == "GET"
    assert verb_of("GET", False, False, "") == "LIST"
    assert verb_of("GET", False, True, "") == "WATCH"
    assert verb_of("PATCH", True, False, "application/apply-patch+yaml") == "APPLY"
    assert verb_of("PATCH", True, False, "application/merge-patch+json") == "PATCH"
    assert verb_of("DELETE", False, False, "") == "DELETECOLLECTION"
    assert verb_of("POST", False, False, "application/json") == "POST"


async def test_only_the_counting_replica_recounts_the_state_gauge_the_others_hold_zero() -> None:
    import asyncio

    lists = []
    counting = {"now": True}

    async def list_trainjobs() -> list[dict]:
        lists.append(counting["now"])
        return [job(runtime="gauge-rt")]

    def gauge() -> float:
        return metrics.TRAINJOBS.labels("Pending", "gauge-rt")._value.get()

    stop = asyncio.Event()
    task = asyncio.create_task(trainjobs.keep_state_gauge(list_trainjobs, stop, min_interval_s=0.01,
                                                          counting=lambda: counting["now"]))

    async def until(value: float) -> None:
        while gauge() != value:
            await refresh_metrics()  # (a scrape of /metrics)
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(until(1), 10)
        counting["now"] = False  # partition 0 handed to another replica
        await asyncio.wait_for(until(0), 10)
        seen = len(lists)
        for _ in range(5):
            await refresh_metrics()
        assert len(lists) == seen and all(lists), "a replica that does not count listed the TrainJobs"
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_the_gauge_is_recounted_only_when_the_snapshots_changed() -> None:
    """An idle stack's status replica listed every TrainJob and runtime every 5 s to find the
    same counts; with the snapshot bucket's version unchanged it lists nothing."""
    import asyncio

    version = {"now": 1}
    lists: list[int] = []
    counting = {"now": True}

    async def list_trainjobs() -> list[dict]:
        lists.append(version["now"])
        return [job(runtime="version-rt")] * version["now"]

    async def current() -> int:
        return version["now"]

    def gauge() -> float:
        return metrics.TRAINJOBS.labels("Pending", "version-rt")._value.get()

    async def until(predicate) -> None:
        while not predicate():
            await refresh_metrics()  # (a scrape of /metrics)
            await asyncio.sleep(0.01)

    stop = asyncio.Event()
    task = asyncio.create_task(trainjobs.keep_state_gauge(list_trainjobs, stop, min_interval_s=0.01, version=current,
                                                          counting=lambda: counting["now"]))
    try:
        await asyncio.wait_for(until(lambda: gauge() == 1), 10)
        for _ in range(20):  # scrapes with nothing changed
            await asyncio.sleep(0.01)
            await refresh_metrics()
        assert lists == [1]
        version["now"] = 2  # a snapshot written
        await asyncio.wait_for(until(lambda: gauge() == 2), 10)
        assert lists == [1, 2]
        counting["now"] = False  # partition 0 handed over, then back: counted again at once
        await asyncio.wait_for(until(lambda: gauge() == 0), 10)
        counting["now"] = True
        await asyncio.wait_for(until(lambda: gauge() == 2), 10)
        assert lists == [1, 2, 2]
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
