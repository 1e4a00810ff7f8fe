"""Fault tolerance (kill -9 of every service and a NATS restart in the middle of a burst),
watcher catch-up after missed events, and scale-out (2 watchers, 3 planners, 2 appliers).

Sizes are the issue's: a 200-TrainJob burst for the kill test and 200 TrainJobs x 5 quick
updates for scale-out (override with TRAINYARD_BURST / TRAINYARD_SCALE for a quicker local run;
the properties checked do not depend on the size).
"""
from __future__ import annotations

import os
import threading
import time
from collections import defaultdict

import pytest

from integration.services.conftest import (
    CTR, JOBSETS, TRAINJOBS, Stack, bus_call, install_crds, small_runtime, stream_messages,
    trainjob, wait_for,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

BURST = int(os.environ.get("TRAINYARD_BURST", "200"))
# TrainJobs x 5 quick updates in the scale-out test (each update is an admission round trip).
SCALE = int(os.environ.get("TRAINYARD_SCALE", "200"))
FAST_RECOVERY = ["--ack-wait", "3"]
APPLIER_EXTRA = FAST_RECOVERY + ["--claim-lease", "10"]


@pytest.fixture(scope="module")
def chaos(nats_server_module, devcluster_module, tmp_path_factory):
    install_crds(devcluster_module)
    stack = Stack(nats_server_module, devcluster_module, tmp_path_factory.mktemp("chaos"))
    stack.start_services([("watcher", FAST_RECOVERY), ("planner", FAST_RECOVERY),
                          ("applier", APPLIER_EXTRA), ("status", FAST_RECOVERY)])
    try:
        yield stack
    finally:
        stack.stop_all()


@pytest.fixture(scope="module")
def api(shared_api_for_chaos):
    return shared_api_for_chaos


@pytest.fixture(scope="module")
def shared_api_for_chaos(devcluster_module):
    from integration.services.conftest import Api

    client = Api(devcluster_module)
    client.create(CTR, small_runtime())
    yield client
    client.close()


def create_with_retry(api, body, timeout: float = 60.0) -> None:
    """Creates a TrainJob, retrying while the webhook (planner) is restarting."""
    deadline = time.monotonic() + timeout
    while True:
        response = api.request("POST", TRAINJOBS.format(ns=body["metadata"]["namespace"]), body)
        if response.status_code in (200, 201, 409):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"create kept failing: {response.status_code} {response.text}")
        time.sleep(0.2)


def running(stack: Stack, name: str):
    return next(s for s in stack.services if s.name == name and s.process is not None)


def jobsets_by_name(api, ns: str) -> dict:
    return {js["metadata"]["name"]: js for js in api.get(JOBSETS.format(ns=ns))["items"]}


def test_kill_9_each_service_and_restart_nats_mid_burst(chaos, api):
    ns = "default"
    names = [f"burst-{i}" for i in range(BURST)]
    created: list[str] = []

    def creator():
        for name in names:
            create_with_retry(api, trainjob(name, ns=ns))
            created.append(name)

    thread = threading.Thread(target=creator)
    thread.start()
    victims = ["applier", "planner", "watcher", "status"]
    for step, victim in enumerate(victims, start=1):
        wait_for(lambda: len(created) >= BURST * step // (len(victims) + 1), timeout=120,
                 what=f"{step}/5 of the burst")
        service = running(chaos, victim)
        service.kill()
        service.start()
        service.wait_ready()
    wait_for(lambda: len(created) >= BURST * 9 // 10, timeout=120, what="most of the burst")
    chaos.nats.restart()
    thread.join(timeout=180)
    assert len(created) == BURST

    def all_jobsets():
        found = jobsets_by_name(api, ns)
        return found if all(name in found for name in names) else None

    jobsets = wait_for(all_jobsets, timeout=120, interval=0.5, what="a JobSet for every TrainJob")
    trainjobs = {tj["metadata"]["name"]: tj for tj in api.get(TRAINJOBS.format(ns=ns))["items"]}
    for name in names:
        owners = jobsets[name]["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [trainjobs[name]["metadata"]["uid"]], name
    assert len([n for n in jobsets if n.startswith("burst-")]) == BURST

    # Status converges: every JobSet completes, every TrainJob says Complete.
    for name in names:
        api.merge_patch(JOBSETS.format(ns=ns) + f"/{name}", {"status": {"conditions": [{
            "type": "Completed", "status": "True", "reason": "AllJobsCompleted",
            "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
            status=True)

    def complete_count():
        items = api.get(TRAINJOBS.format(ns=ns))["items"]
        done = [tj for tj in items if tj["metadata"]["name"].startswith("burst-") and any(
            c["type"] == "Complete" and c["status"] == "True"
            for c in (tj.get("status") or {}).get("conditions", []))]
        return len(done) == BURST

    wait_for(complete_count, timeout=120, interval=0.5, what="every TrainJob Complete")
    assert stream_messages(chaos.nats.url, "TY_DEAD_LETTER") == []


def test_restarted_watcher_catches_up_with_missed_events(chaos, api):
    ns = "default"
    watcher = running(chaos, "watcher")
    watcher.stop()
    create_with_retry(api, trainjob("missed-1", ns=ns))
    create_with_retry(api, trainjob("missed-2", ns=ns))
    api.delete(TRAINJOBS.format(ns=ns) + "/burst-0")
    time.sleep(1.0)
    assert "missed-1" not in jobsets_by_name(api, ns)  # nobody saw it yet
    watcher.start()
    watcher.wait_ready()
    wait_for(lambda: {"missed-1", "missed-2"} <= set(jobsets_by_name(api, ns)), timeout=60,
             what="JobSets for TrainJobs created while the watcher was down")

    async def snapshot(session):
        from trainyard.bus.subjects import ObjectKey

        return await session.snapshots.get(ObjectKey("default", "TrainJob", ns, "burst-0"))

    wait_for(lambda: bus_call(chaos.nats.url, snapshot) is None, timeout=30,
             what="the deletion missed while down recorded after the relist")


def test_scale_out_newest_generation_wins(chaos, api):
    """2 watchers, 3 planners, 2 appliers; TrainJobs updated 5 times quickly (while suspended,
    so every generation is applied): each JobSet ends with its TrainJob's last spec, no older
    plan is applied after a newer one, and the two watchers' events are stored once."""
    chaos.start_services([("watcher", FAST_RECOVERY), ("planner", FAST_RECOVERY),
                          ("planner", FAST_RECOVERY), ("applier", APPLIER_EXTRA)])
    ns = "default"
    names = [f"scale-{i}" for i in range(SCALE)]
    # v2.3.0 makes spec.trainer immutable: the updates go through a runtime patch, as Kueue's do.
    def patches(version: int) -> list:
        return [{"manager": "example.com/scale", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": {
                "nodeSelector": {"version": str(version)}}}}}}]}}}}]

    for name in names:
        create_with_retry(api, trainjob(name, ns=ns, suspend=True, runtimePatches=patches(0)))
    for version in range(1, 6):
        for name in names:
            api.merge_patch(TRAINJOBS.format(ns=ns) + f"/{name}", {"spec": {"runtimePatches": patches(version)}})

    def version_of(js):
        return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]["version"]

    def converged():
        found = jobsets_by_name(api, ns)
        return all(name in found and version_of(found[name]) == "5" for name in names)

    wait_for(converged, timeout=150, interval=0.5, what="every JobSet at the last spec")
    trainjobs = {tj["metadata"]["name"]: tj for tj in api.get(TRAINJOBS.format(ns=ns))["items"]}
    uids = {trainjobs[name]["metadata"]["uid"]: name for name in names}
    assert all(trainjobs[name]["metadata"]["generation"] == 6 for name in names)

    from trainyard.bus.envelopes import ApplyResult, ObjectEvent, decode

    applied: dict[str, list[int]] = defaultdict(list)
    plans_seen: set[tuple[str, int, str]] = set()
    for msg in stream_messages(chaos.nats.url, "TY_RESULTS"):
        result = decode(ApplyResult, msg.data)
        if result.uid in uids and result.outcome == "applied":
            key = (result.uid, result.generation, result.plan_hash)
            assert key not in plans_seen, f"plan applied twice: {key}"
            plans_seen.add(key)
            applied[result.uid].append(result.generation)
    for uid, generations in applied.items():
        assert generations == sorted(generations), f"{uids[uid]}: older plan applied after newer {generations}"
        assert generations[-1] == 6
    changes: set[tuple[str, str]] = set()
    for msg in stream_messages(chaos.nats.url, "TY_EVENTS", "ty.events.default.*.TrainJob.default.*"):
        event = decode(ObjectEvent, msg.data)
        if event.uid in uids and event.type != "DELETED":
            key = (event.name, event.resource_version)
            assert key not in changes, f"event stored twice: {key}"
            changes.add(key)
    assert len({name for name, _ in changes}) == SCALE
