"""`trainyard up --nats-cluster 3`: the bus as a 3-node JetStream cluster with 3 replicas of every
stream and bucket. One NATS node is killed (SIGKILL, the leader of the plans stream) in the
middle of a burst of TrainJobs: every TrainJob converges (its JobSet applied, its status
written), nothing is lost or duplicated (one JobSet per TrainJob, nothing dead-lettered), and the
services reconnect without being restarted."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from fixtures.stack import skip_unless_stack_available, start_stack
from trainyard.roles import CLUSTER_ROLES

pytestmark = pytest.mark.slow

BURST = 24
SERVICES = CLUSTER_ROLES


def trainjob(index: int) -> str:
    return f"""apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {{name: burst-{index:03d}, namespace: default}}
spec:
  suspend: true
  runtimeRef: {{name: torch-distributed-cpu, kind: ClusterTrainingRuntime}}
  trainer: {{numNodes: 2, command: ["python", "-c", "print(1)"]}}
"""


async def stream_info(stack, names: list[str]) -> dict[str, object]:
    nc = await stack.nats_connect("admin")
    try:
        js = nc.jetstream()
        return {name: await js.stream_info(name) for name in names}
    finally:
        await nc.close()


def test_a_nats_node_dies_during_a_burst(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_stack_available()
    monkeypatch.delenv("TRAINYARD_BUS_REPLICAS", raising=False)
    stack = start_stack(tmp_path / "stack", "--nats-cluster", "3")
    try:
        state = json.loads((stack.data_dir / "stack.json").read_text())
        assert len(stack.nats_url.split(",")) == 3 and {"nats", "nats-2", "nats-3"} <= set(state["children"])
        streams = ["TY_EVENTS", "TY_PLANS", "TY_RESULTS", "TY_DEAD_LETTER"]
        infos = asyncio.run(stream_info(stack, streams + ["KV_ty_objects", "KV_ty_applied"]))
        assert {info.config.num_replicas for info in infos.values()} == {3}
        service_pids = {name: state["children"][name]["pid"] for name in SERVICES}

        half = BURST // 2
        stack.kubectl("apply", "-f", "-", stdin="---\n".join(trainjob(i) for i in range(half)))
        leader = infos["TY_PLANS"].cluster.leader  # trainyard-<n>
        node = "nats" if leader == "trainyard-1" else f"nats-{leader.rsplit('-', 1)[1]}"
        os.kill(state["children"][node]["pid"], signal.SIGKILL)
        stack.kubectl("apply", "-f", "-", stdin="---\n".join(trainjob(i) for i in range(half, BURST)))

        deadline = time.monotonic() + 150
        while True:
            jobsets = json.loads(stack.kubectl("get", "jobsets.jobset.x-k8s.io", "-n", "default", "-o", "json").stdout)["items"]
            trainjobs = json.loads(stack.kubectl("get", "trainjobs", "-n", "default", "-o", "json").stdout)["items"]
            suspended = [t for t in trainjobs if any(c.get("type") == "Suspended" and c.get("status") == "True"
                                                    for c in (t.get("status") or {}).get("conditions") or [])]
            if len(jobsets) == BURST and len(suspended) == BURST:
                break
            assert time.monotonic() < deadline, (
                f"{len(jobsets)} JobSets, {len(suspended)} suspended TrainJobs of {BURST} after the node kill\n"
                + stack.output()[-3000:])
            time.sleep(1)
        owners = sorted(j["metadata"]["ownerReferences"][0]["uid"] for j in jobsets)
        assert owners == sorted(t["metadata"]["uid"] for t in trainjobs)  # one JobSet per TrainJob
        assert all(j["spec"].get("suspend") is True for j in jobsets)
        after = asyncio.run(stream_info(stack, ["TY_DEAD_LETTER", "TY_PLANS"]))
        assert after["TY_DEAD_LETTER"].state.messages == 0
        state = json.loads((stack.data_dir / "stack.json").read_text())
        assert {name: state["children"][name]["pid"] for name in SERVICES} == service_pids
        assert all(state["restarts"][name] == 0 for name in SERVICES), state["restarts"]
        assert state["restarts"][node] >= 1  # the supervisor brought the killed node back, as a StatefulSet would
        logs = "".join((stack.data_dir / "logs" / f"{name}.log").read_text(errors="replace") for name in SERVICES)
        print("services that lost their NATS node:", logs.count("nats disconnected"), "reconnected:", logs.count("nats reconnected"))
    finally:
        stack.stop()
        stack.kill()
