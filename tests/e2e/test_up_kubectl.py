"""The first thing a user does: `trainyard up`, `kubectl apply -k` the torch example, watch it
train to Complete, read its logs, `trainyard down`, and nothing is left running. Then `trainyard up`
on the same data dir again: the TrainJob and its status are still there.

(One test, not two: each stack start and each torch run costs seconds on a small machine.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.stack import REPO, skip_unless_stack_available, start_stack

EXAMPLE = REPO / "examples" / "torch-ddp-cpu"
DEFAULT_RUNTIMES = {
    "torch-distributed", "torch-distributed-cpu", "torch-distributed-with-cache", "deepspeed-distributed",
    "mlx-distributed", "torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
}


def example_trainjob() -> tuple[str, str]:
    from trainyard.cli.demo import DemoError, find_trainjob

    try:
        job = find_trainjob(EXAMPLE)
    except DemoError as err:
        pytest.skip(f"example not available yet (dataplane helper): {err}")
    return job.name, job.namespace


@pytest.mark.torch
@pytest.mark.timeout(600)  # two stack starts and a 4-process torch run on a busy 2-core machine
def test_up_apply_example_complete_logs_down_then_resume(tmp_path: Path) -> None:
    skip_unless_stack_available()
    name, namespace = example_trainjob()
    stack = start_stack(tmp_path / "data", "--api-workers", "1")  # one devcluster process, whatever the cores
    try:
        assert "Try this:" in stack.output()
        assert f"kubeconfig: {stack.kubeconfig}" in stack.output()

        runtimes = stack.kubectl("get", "clustertrainingruntimes", "-o", "json")
        assert {item["metadata"]["name"] for item in json.loads(runtimes.stdout)["items"]} >= DEFAULT_RUNTIMES

        stack.kubectl("apply", "-k", str(EXAMPLE))
        waited = stack.kubectl("wait", "-n", namespace, f"trainjob/{name}", "--for=condition=Complete",
                               "--timeout=240s", check=False, timeout=260)
        if waited.returncode != 0:
            described = stack.kubectl("get", "-n", namespace, f"trainjob/{name}", "-o", "yaml", check=False)
            pods = stack.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False)
            pytest.fail(f"TrainJob did not complete: {waited.stderr}\n{described.stdout}\n{pods.stdout}")

        trainjob = json.loads(stack.kubectl("get", "-n", namespace, f"trainjob/{name}", "-o", "json").stdout)
        complete = [c for c in trainjob["status"]["conditions"] if c["type"] == "Complete"]
        assert complete and complete[0]["status"] == "True"
        # TrainJobStatus (on in `trainyard up`): the example reported its progress, the last at 100 %.
        progress = trainjob["status"]["trainerStatus"]
        assert progress["progressPercentage"] == 100 and progress["metrics"][0]["name"] == "loss"
        # ... with every service acting as its own ServiceAccount, bound by deploy/services/rbac.yaml
        # (devcluster enforces RBAC: a missing permission would have stopped the run above).
        for service in ("watcher", "planner", "applier", "status"):
            identity = tmp_path / "data" / "identities" / "default" / f"{service}.kubeconfig"
            who = stack.kubectl("--kubeconfig", str(identity), "auth", "whoami", "-o",
                                "jsonpath={.status.userInfo.username}")
            assert who.stdout == f"system:serviceaccount:kubeflow-system:trainyard-{service}"

        pods = json.loads(stack.kubectl(
            "get", "pods", "-n", namespace, "-l",
            f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node", "-o", "json",
        ).stdout)["items"]
        assert pods, "no trainer pods listed"
        assert {pod["status"]["phase"] for pod in pods} == {"Succeeded"}
        rank0 = next(pod for pod in pods
                     if pod["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0")
        logs = stack.kubectl("logs", "-n", namespace, rank0["metadata"]["name"], "-c", "node").stdout
        assert "loss" in logs.lower(), logs[-2000:]

        stack.remember_processes()
        down = stack.stop()
        assert down.returncode == 0, down.stderr
        assert stack.process.returncode == 0, stack.output()[-3000:]
        assert stack.survivors() == [], f"processes left after trainyard down: {stack.survivors()}"
    finally:
        stack.kill()

    # the second start with 4 devcluster API workers over its store process (`trainyard up` passes
    # --api-workers through): the same data dir is served, and `down` leaves no worker behind
    resumed = start_stack(tmp_path / "data", "--api-workers", "4")
    try:
        workers = [int(pid) for pid in (tmp_path / "data" / "devcluster" / "api-workers").read_text().split()]
        assert len(workers) == 4
        resumed.remember_processes()
        assert set(workers) <= set(resumed.seen_processes)
        again = json.loads(resumed.kubectl("get", "-n", namespace, f"trainjob/{name}", "-o", "json").stdout)
        assert again["metadata"]["uid"] == trainjob["metadata"]["uid"]
        assert again["status"]["conditions"] == trainjob["status"]["conditions"]
        assert again["status"].get("jobsStatus") == trainjob["status"].get("jobsStatus")
        assert resumed.stop().returncode == 0
        assert resumed.survivors() == []
    finally:
        resumed.kill()
