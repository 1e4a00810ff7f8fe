"""`trainyard up` on the same data dir again resumes: a TrainJob created before `trainyard down`
is still there afterwards, with its status."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from fixtures.stack import RunningStack, skip_unless_stack_available, start_stack

TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: kept-across-restarts
  namespace: default
spec:
  runtimeRef:
    name: torch-distributed-cpu
  trainer:
    numNodes: 1
    command: ["python", "-c", "print('hello from a TrainJob that survives restarts')"]
"""


def get_trainjob(stack: RunningStack) -> dict:
    return json.loads(stack.kubectl("get", "trainjob", "kept-across-restarts", "-o", "json").stdout)


def wait_complete(stack: RunningStack, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        trainjob = get_trainjob(stack)
        conditions = {c["type"]: c["status"] for c in (trainjob.get("status") or {}).get("conditions", [])}
        if conditions.get("Complete") == "True":
            return trainjob
        if conditions.get("Failed") == "True" or time.monotonic() > deadline:
            pytest.fail(f"TrainJob did not complete: {json.dumps(trainjob.get('status'), indent=1)}")
        time.sleep(1)


def test_trainjob_and_its_status_survive_down_and_up(tmp_path: Path) -> None:
    skip_unless_stack_available()
    data_dir = tmp_path / "data"
    first = start_stack(data_dir)
    try:
        first.kubectl("apply", "-f", "-", stdin=TRAINJOB)
        before = wait_complete(first)
        assert first.stop().returncode == 0
        assert first.survivors() == []
    finally:
        first.kill()

    second = start_stack(data_dir)
    try:
        after = get_trainjob(second)
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["conditions"] == before["status"]["conditions"]
        assert after["status"].get("jobsStatus") == before["status"].get("jobsStatus")
        runtimes = json.loads(second.kubectl("get", "clustertrainingruntimes", "-o", "json").stdout)["items"]
        assert "torch-distributed-cpu" in {r["metadata"]["name"] for r in runtimes}
        assert second.stop().returncode == 0
        assert second.survivors() == []
    finally:
        second.kill()
