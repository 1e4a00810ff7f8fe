"""Two clusters' full service sets on one NATS: each cluster's events are handled by its own
planner, applier and status, none dropped, none applied to the other cluster.

Both clusters get TrainJobs with the *same* namespace and names but different specs, so a plan
that crossed over would show up as a JobSet whose size belongs to the other cluster.
"""
from __future__ import annotations

import pytest

from fixtures.devcluster import start_devcluster
from integration.services.conftest import (
    CTR, JOBSETS, TRAINJOBS, Api, Stack, bus_call, install_crds, small_runtime, trainjob, wait_for,
)

pytestmark = pytest.mark.timeout(300)

COUNT = 12
SIZES = {"east": 2, "west": 3}  # numNodes per cluster: tells whose plan a JobSet came from


@pytest.fixture
def clusters(nats_server, tmp_path):
    started = {}
    try:
        for name in SIZES:
            cluster = start_devcluster(tmp_path / f"{name}-api")
            started[name] = cluster
            install_crds(cluster)
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()


def test_two_clusters_share_one_nats_without_cross_talk(nats_server, clusters, tmp_path):
    stacks = {name: Stack(nats_server, cluster, tmp_path / name) for name, cluster in clusters.items()}
    apis = {name: Api(cluster) for name, cluster in clusters.items()}
    try:
        for name, stack in stacks.items():
            stack.workdir.mkdir()
            stack.start_all("--cluster", name)
            apis[name].create(CTR, small_runtime())
        for index in range(COUNT):
            for name, api in apis.items():
                api.create(TRAINJOBS.format(ns="default"),
                           trainjob(f"job-{index}", trainer={"numNodes": SIZES[name]}))

        for name, api in apis.items():
            for index in range(COUNT):
                jobset = wait_for(lambda: api.get(JOBSETS.format(ns="default") + f"/job-{index}"),
                                  timeout=90, what=f"{name} JobSet job-{index}")
                trainjob_uid = api.get(TRAINJOBS.format(ns="default") + f"/job-{index}")["metadata"]["uid"]
                # Owned by this cluster's TrainJob and sized from this cluster's spec.
                assert jobset["metadata"]["ownerReferences"][0]["uid"] == trainjob_uid
                assert jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == SIZES[name]

        # Status of each cluster comes from its own status service: finish east's JobSets only.
        for index in range(COUNT):
            apis["east"].merge_patch(JOBSETS.format(ns="default") + f"/job-{index}", {"status": {
                "conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                                "message": "jobset completed successfully",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}, status=True)

        def complete(api, index):
            obj = api.get(TRAINJOBS.format(ns="default") + f"/job-{index}") or {}
            return any(c["type"] == "Complete" and c["status"] == "True"
                       for c in (obj.get("status") or {}).get("conditions") or [])

        for index in range(COUNT):
            wait_for(lambda: complete(apis["east"], index), timeout=60, what=f"east job-{index} Complete")
        assert not any(complete(apis["west"], index) for index in range(COUNT))

        # Each cluster's consumers exist under their own names, and none has work left behind.
        async def consumers(session):
            names = {}
            for stream in ("TY_EVENTS", "TY_PLANS", "TY_RESULTS"):
                for info in await session.js.consumers_info(stream):
                    names[info.name] = (info.num_pending, info.num_ack_pending)
            return names

        def settled():
            found = bus_call(nats_server.url, consumers)
            from trainyard.bus.subjects import partitions_setting
            from trainyard.bus.topology import partition_durable

            # One consumer per partition of each role, under each cluster's name.
            wanted = {partition_durable(role, name, partition)
                      for role in ("planner", "applier", "status", "status-results")
                      for name in SIZES for partition in range(partitions_setting())}
            return found if wanted <= set(found) and all(found[n] == (0, 0) for n in wanted) else None

        found = wait_for(settled, timeout=60, what="every consumer drained")
        assert not {"planner", "applier", "status", "status-results"} & set(found)
        assert not {f"{role}_{name}" for role in ("planner", "applier", "status", "status-results")
                    for name in SIZES} & set(found)

        # Nothing was dead-lettered: no cluster's service rejected the other's messages.
        async def dead_letters(session):
            return (await session.js.stream_info("TY_DEAD_LETTER")).state.messages

        assert bus_call(nats_server.url, dead_letters) == 0
    finally:
        for stack in stacks.values():
            stack.stop_all()
        for api in apis.values():
            api.close()
