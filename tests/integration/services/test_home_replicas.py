"""Home replicas with the real services (docs/bus.md, "Partitions and home replicas"): two
appliers and two status services split the partitions; the applier that holds a TrainJob's
partition recognises the entry it wrote itself (one ``ty_applied`` read per TrainJob, not one
per plan); a SIGKILLed applier's partitions are taken over with every plan applied exactly once;
a status service stopped with SIGTERM hands its partitions over before it exits; a third
applier joining takes a share."""
from __future__ import annotations

import time
from collections import Counter

import pytest

from integration.services.conftest import (
    CTR, JOBSETS, TRAINJOBS, Api, Stack, install_crds, leases, small_runtime, stream_messages, trainjob,
    wait_for,
)

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

PARTITIONS = 8
FAST = ["--ack-wait", "3"]


def split_between(url: str, role: str, replicas: int) -> dict[int, str] | None:
    """The role's leases when ``replicas`` holders share every partition evenly, else None."""
    held = leases(url).get(role, {})
    counts = Counter(held.values())
    if len(held) == PARTITIONS and len(counts) == replicas and max(counts.values()) - min(counts.values()) <= 1:
        return held
    return None


def metric_sum(services, name: str, **labels: str) -> float:
    total = 0.0
    for service in services:
        _, text = service.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def patches(version: int) -> list:
    return [{"manager": "example.com/home", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": "node", "template": {"spec": {"template": {"spec": {"nodeSelector": {"version": str(version)}}}}}}]}}}}]


def version_of(jobset: dict) -> str:
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]["version"]


def applied_once(url: str, uids: set[str]) -> Counter:
    from trainyard.bus.envelopes import ApplyResult, decode

    applied: Counter = Counter()
    for msg in stream_messages(url, "TY_RESULTS"):
        result = decode(ApplyResult, msg.data)
        if result.uid in uids and result.outcome == "applied":
            applied[(result.uid, result.generation, result.plan_hash)] += 1
    return applied


def test_home_replicas_split_recognise_own_writes_take_over_and_hand_over(
        nats_server, devcluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINYARD_PARTITIONS", str(PARTITIONS))  # the services inherit it
    install_crds(devcluster)
    stack = Stack(nats_server, devcluster, tmp_path)
    api = Api(devcluster)
    try:
        api.create(CTR, small_runtime())
        stack.start_services([("watcher", FAST), ("planner", FAST), ("applier", FAST + ["--claim-lease", "10"]),
                              ("applier", FAST + ["--claim-lease", "10"]), ("status", FAST), ("status", FAST)])
        appliers = [s for s in stack.services if s.name == "applier"]
        statuses = [s for s in stack.services if s.name == "status"]
        wait_for(lambda: split_between(nats_server.url, "applier", 2) and split_between(nats_server.url, "status", 2),
                 timeout=60, what="two appliers and two status services with 4 partitions each")

        # Each TrainJob planned twice (created suspended, then its runtime patch changed): its
        # second plan reaches the applier that wrote the first one, which claims on that entry.
        ns, names = "default", [f"home-{i}" for i in range(24)]
        for name in names:
            api.create(TRAINJOBS.format(ns=ns), trainjob(name, ns=ns, suspend=True, runtimePatches=patches(0)))
        wait_for(lambda: all(version_of(j) == "0" for j in api.get(JOBSETS.format(ns=ns))["items"])
                 and len(api.get(JOBSETS.format(ns=ns))["items"]) == len(names), timeout=120, interval=0.5,
                 what="every JobSet at version 0")
        reads_before = metric_sum(appliers, "trainyard_kv_operations_total", bucket="ty_applied", op="get")
        for name in names:
            api.merge_patch(TRAINJOBS.format(ns=ns) + f"/{name}", {"spec": {"runtimePatches": patches(1)}})
        wait_for(lambda: all(version_of(j) == "1" for j in api.get(JOBSETS.format(ns=ns))["items"]),
                 timeout=120, interval=0.5, what="every JobSet at version 1")
        reads = metric_sum(appliers, "trainyard_kv_operations_total", bucket="ty_applied", op="get") - reads_before
        # Without a home replica every plan's claim reads the entry first (24 reads); the home
        # replica claims on the entry it wrote itself (only a partition that changed hands
        # meanwhile would be read again: the two appliers still hold four each).
        assert split_between(nats_server.url, "applier", 2) is not None
        assert reads == 0, f"{reads} ty_applied reads for {len(names)} second plans"

        # SIGKILL one applier in the middle of a burst: its partitions are served again once its
        # leases lapse, nothing is lost, nothing applied twice.
        burst = [f"kill-{i}" for i in range(40)]
        for index, name in enumerate(burst):
            api.create(TRAINJOBS.format(ns=ns), trainjob(name, ns=ns))
            if index == len(burst) // 2:
                victim = appliers[0]
                victim.kill()
                killed_at = time.monotonic()
        survivor = wait_for(lambda: split_between(nats_server.url, "applier", 1), timeout=30,
                            what="the surviving applier holding every partition")
        print(f"takeover: every partition leased by the survivor {time.monotonic() - killed_at:.1f} s after SIGKILL")
        assert len(set(survivor.values())) == 1
        wait_for(lambda: {j["metadata"]["name"] for j in api.get(JOBSETS.format(ns=ns))["items"]} >= set(burst),
                 timeout=120, interval=0.5, what="a JobSet for every TrainJob of the burst")
        trainjobs = {tj["metadata"]["name"]: tj for tj in api.get(TRAINJOBS.format(ns=ns))["items"]}
        uids = {trainjobs[name]["metadata"]["uid"] for name in names + burst}
        applied = applied_once(nats_server.url, uids)
        assert applied and max(applied.values()) == 1, [k for k, v in applied.items() if v > 1]

        # A third applier joins: it takes a share from the survivor.
        stack.start_service("applier", *FAST, "--claim-lease", "10")
        wait_for(lambda: split_between(nats_server.url, "applier", 2), timeout=60,
                 what="the joining applier taking half of the partitions")

        # SIGTERM one status service: its leases are gone when it has exited (handed over, not
        # left to lapse), and the other serves its TrainJobs.
        assert statuses[0].stop() == 0
        held = leases(nats_server.url).get("status", {})
        assert len(set(held.values())) == 1, held  # only the other one's: none left to lapse
        wait_for(lambda: split_between(nats_server.url, "status", 1), timeout=15,
                 what="the remaining status service holding every partition")
        for name in burst:
            api.merge_patch(JOBSETS.format(ns=ns) + f"/{name}", {"status": {"conditions": [{
                "type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
                status=True)

        def all_complete() -> bool:
            items = {tj["metadata"]["name"]: tj for tj in api.get(TRAINJOBS.format(ns=ns))["items"]}
            return all(any(c["type"] == "Complete" and c["status"] == "True"
                           for c in (items[name].get("status") or {}).get("conditions", [])) for name in burst)

        wait_for(all_complete, timeout=120, interval=0.5, what="every TrainJob of the burst Complete")
        assert stream_messages(nats_server.url, "TY_DEAD_LETTER") == []
    finally:
        stack.stop_all()
        api.close()
