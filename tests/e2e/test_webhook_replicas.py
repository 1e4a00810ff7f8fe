"""Admission that survives a planner restart (issue #12): `trainyard up` runs two planner
replicas whose webhooks sit behind the Service `kubeflow-trainer-controller-manager` (one
EndpointSlice per replica), and devcluster calls a live one. A planner is SIGKILLed in the middle
of a burst of TrainJob creates, then the other one after the first came back: every create
answers 201 (no `failed calling webhook` 500 reaches a client) and every TrainJob still gets its
JobSet (the surviving replica goes on consuming the planner's durable consumer)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import time
from pathlib import Path

import httpx
import pytest
import yaml

from fixtures.stack import RunningStack, skip_unless_stack_available, start_stack

pytestmark = pytest.mark.slow

PER_PHASE = 50
KILL_AFTER = 12  # creates answered before the SIGKILL of that phase


def trainjob(name: str) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"suspend": True, "runtimeRef": {"name": "torch-distributed-cpu"},
                     "trainer": {"numNodes": 2, "command": ["python", "-c", "print(1)"]}}}


def api_client(stack: RunningStack, tmp_path: Path) -> httpx.AsyncClient:
    import base64

    config = yaml.safe_load(stack.kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
    return httpx.AsyncClient(base_url=cluster["server"], verify=ssl.create_default_context(cafile=str(ca)), timeout=30,
                             headers={"Authorization": f"Bearer {config['users'][0]['user']['token']}"})


def child_pid(stack: RunningStack, name: str) -> int:
    return json.loads((stack.data_dir / "stack.json").read_text())["children"][name]["pid"]


async def burst(client: httpx.AsyncClient, names: list[str], kill: str, stack: RunningStack) -> dict[str, int]:
    """Creates ``names`` four at a time; SIGKILLs planner replica ``kill`` once KILL_AFTER answered."""
    codes: dict[str, int] = {}
    queue = list(names)

    async def worker() -> None:
        while queue:
            name = queue.pop(0)
            response = await client.post("/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs",
                                         json=trainjob(name))
            codes[name] = response.status_code
            if response.status_code != 201:
                codes[f"{name}:body"] = response.text  # type: ignore[assignment]
            if len(codes) == KILL_AFTER:
                os.kill(child_pid(stack, kill), signal.SIGKILL)

    await asyncio.gather(*(worker() for _ in range(4)))
    return codes


def wait_restarted(stack: RunningStack, name: str, old_pid: int, timeout: float = 90) -> None:
    """Until the supervisor restarted ``name`` and its /readyz answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = json.loads((stack.data_dir / "stack.json").read_text())
        if state["children"][name]["pid"] != old_pid:
            try:
                if httpx.get(f"http://127.0.0.1:{state['ports'][name]}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
        time.sleep(0.3)
    raise AssertionError(f"{name} not restarted and ready after {timeout}s\n{stack.output()[-3000:]}")


def test_planner_sigkill_during_a_burst_costs_clients_nothing(tmp_path: Path) -> None:
    skip_unless_stack_available()
    stack = start_stack(tmp_path / "stack", "--skip", "dashboard")
    try:
        slices = json.loads(stack.kubectl("get", "endpointslices", "-n", "kubeflow-system", "-l",
                                          "kubernetes.io/service-name=kubeflow-trainer-controller-manager",
                                          "-o", "json").stdout)["items"]
        assert len(slices) == 2  # one per planner replica
        hooks = json.loads(stack.kubectl("get", "validatingwebhookconfigurations", "validator.trainer.kubeflow.org",
                                         "-o", "json").stdout)["webhooks"]
        assert {h["clientConfig"]["service"]["name"] for h in hooks} == {"kubeflow-trainer-controller-manager"}

        first_pid = child_pid(stack, "planner")

        async def both_phases() -> dict[str, int]:
            async with api_client(stack, tmp_path) as client:
                codes = await burst(client, [f"burst-a-{i:03d}" for i in range(PER_PHASE)], "planner", stack)
                await asyncio.to_thread(wait_restarted, stack, "planner", first_pid)
                second_pid = child_pid(stack, "planner-2")
                codes |= await burst(client, [f"burst-b-{i:03d}" for i in range(PER_PHASE)], "planner-2", stack)
                await asyncio.to_thread(wait_restarted, stack, "planner-2", second_pid)
                return codes

        codes = asyncio.run(both_phases())
        failures = {name: code for name, code in codes.items() if code != 201}
        assert not failures, failures
        assert len(codes) == 2 * PER_PHASE

        state = json.loads((stack.data_dir / "stack.json").read_text())
        assert state["restarts"]["planner"] >= 1 and state["restarts"]["planner-2"] >= 1

        deadline = time.monotonic() + 120
        while True:
            jobsets = json.loads(stack.kubectl("get", "jobsets.jobset.x-k8s.io", "-n", "default",
                                               "-o", "json").stdout)["items"]
            if len(jobsets) == 2 * PER_PHASE:
                break
            assert time.monotonic() < deadline, f"{len(jobsets)} JobSets of {2 * PER_PHASE}\n{stack.output()[-3000:]}"
            time.sleep(1)
        assert len({j["metadata"]["ownerReferences"][0]["uid"] for j in jobsets}) == 2 * PER_PHASE
    finally:
        stack.stop()
        stack.kill()
