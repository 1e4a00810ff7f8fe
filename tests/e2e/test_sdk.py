"""The Kubeflow Python SDK (`kubeflow` 0.5.0, TrainerClient) against a local trainyard, as a data
scientist uses it: list runtimes, train a function and a command, wait, read logs, delete."""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import pytest

from e2e._sdk_flow import train_wait_logs_delete
from fixtures.stack import RunningStack

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]

UPSTREAM_RUNTIMES = {
    "torch-distributed", "torch-distributed-with-cache", "deepspeed-distributed", "mlx-distributed",
    "torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
}


def report_progress():
    # Runs in the trainer pod: the SDK's own progress call, to the endpoint trainyard injects
    # (TrainJobStatus); the status is read while the pod still runs.
    import time

    from kubeflow.trainer import update_trainjob_status

    sent = update_trainjob_status(progress_percent=50, estimated_remaining_seconds=20, metrics={"loss": 0.5})
    print(f"progress sent: {sent}", flush=True)
    time.sleep(20)


@pytest.fixture(scope="module")
def client(trainyard_stack_module: RunningStack) -> Any:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    return TrainerClient(KubernetesBackendConfig(config_file=str(trainyard_stack_module.kubeconfig)))


def test_client_finds_the_control_plane_version(trainyard_stack_module: RunningStack, caplog: pytest.LogCaptureFixture) -> None:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    with caplog.at_level(logging.WARNING):
        TrainerClient(KubernetesBackendConfig(config_file=str(trainyard_stack_module.kubeconfig)))
    assert "version info is not available" not in caplog.text


def test_lists_every_default_runtime(client: Any) -> None:
    from kubeflow.trainer import TrainerType

    runtimes = {runtime.name: runtime for runtime in client.list_runtimes()}
    assert set(runtimes) >= UPSTREAM_RUNTIMES | {"torch-distributed-cpu"}
    assert runtimes["torchtune-llama3.2-1b"].trainer.trainer_type == TrainerType.BUILTIN_TRAINER
    assert runtimes["torch-distributed-cpu"].trainer.trainer_type == TrainerType.CUSTOM_TRAINER
    assert runtimes["torch-distributed-cpu"].trainer.framework == "torch"


def test_function_based_training_runs_to_complete_with_logs(client: Any, trainyard_stack_module: RunningStack) -> None:
    train_wait_logs_delete(client, trainyard_stack_module)


def test_a_killed_service_is_restarted(trainyard_stack_module: RunningStack) -> None:
    """Runs before the command-based test, which then trains through the restarted planner."""
    import signal
    import urllib.request

    stack = trainyard_stack_module
    state_file = stack.data_dir / "stack.json"
    killed = json.loads(state_file.read_text())["children"]["planner"]["pid"]
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        state = json.loads(state_file.read_text())
        if state["children"]["planner"]["pid"] != killed:
            break
        assert time.monotonic() < deadline, "planner was not restarted"
        time.sleep(0.2)
    assert state["restarts"]["planner"] == 1
    port = state["ports"]["planner"]
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "restarted planner never became ready"
        time.sleep(0.5)
    assert "planner exited with code -9; restarting" in stack.output()


def test_command_based_training_with_bare_torchrun(client: Any) -> None:
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options.kubernetes import TrainerCommand

    name = client.train(
        runtime="torch-distributed-cpu",
        trainer=CustomTrainerContainer(image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime", num_nodes=2),
        options=[TrainerCommand(["torchrun", "--no-python", "bash", "-c",
                                 "echo torchrun rank=$RANK world=$WORLD_SIZE"])],
    )
    job = client.wait_for_job_status(name, {"Complete"}, timeout=240, polling_interval=1)
    assert job.status == "Complete"
    assert "torchrun rank=0 world=2" in "\n".join(client.get_job_logs(name))
    assert "torchrun rank=1 world=2" in "\n".join(client.get_job_logs(name, step="node-1"))


SUSPENDED_TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: resumed-job
spec:
  suspend: true
  runtimeRef:
    name: torch-distributed-cpu
  trainer:
    numNodes: 1
    command: ["python", "-c", "import time; print('resumed and running', flush=True); time.sleep(12)"]
"""


def test_a_resumed_trainjob_is_reported_running_not_created(client: Any, trainyard_stack_module: RunningStack) -> None:
    """kubeflow/sdk#803: the SDK derives Running only while a TrainJob has no conditions."""
    stack = trainyard_stack_module
    stack.kubectl("apply", "-f", "-", stdin=SUSPENDED_TRAINJOB)
    assert client.get_job("resumed-job").status == "Created"
    stack.kubectl("patch", "trainjob", "resumed-job", "--type=merge", "-p", json.dumps({"spec": {"suspend": False}}))
    job = client.wait_for_job_status("resumed-job", {"Running", "Complete"}, timeout=120, polling_interval=1)
    assert job.status == "Running"
    assert client.wait_for_job_status("resumed-job", {"Complete"}, timeout=120, polling_interval=1).status == "Complete"


def test_runtime_patch_and_active_deadline_reach_the_jobset_and_pods(
        client: Any, trainyard_stack_module: RunningStack) -> None:
    """SDK 0.5.0's v2.3 options against the stack: the RuntimePatch lands on the JobSet, its Jobs
    and pods; ActiveDeadlineSeconds fails a TrainJob that runs too long and removes its JobSet."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import kubernetes as o

    stack = trainyard_stack_module
    toleration = {"key": "example.com/slow", "operator": "Exists", "effect": "NoSchedule"}
    patch = o.RuntimePatch(training_runtime_spec=o.TrainingRuntimeSpecPatch(template=o.JobSetTemplatePatch(
        metadata={"labels": {"team": "vision"}},
        spec=o.JobSetSpecPatch(replicated_jobs=[o.ReplicatedJobPatch(name="node", template=o.JobTemplatePatch(
            metadata={"labels": {"tier": "batch"}},
            spec=o.JobSpecPatch(template=o.PodTemplatePatch(
                metadata={"labels": {"sdk-patched": "yes"}},
                spec=o.PodSpecPatch(tolerations=[toleration]))))),
        ]))))
    name = client.train(
        runtime="torch-distributed-cpu",
        trainer=CustomTrainerContainer(image="pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime", num_nodes=1),
        options=[o.TrainerCommand(["bash", "-c", "echo patched pod started; sleep 300"]),
                 o.ActiveDeadlineSeconds(seconds=15), patch],
    )

    def get(kind: str, *args: str) -> Any:
        return json.loads(stack.kubectl("get", kind, *args, "-o", "json").stdout)

    assert get("trainjob", name)["spec"]["activeDeadlineSeconds"] == 15
    deadline = time.monotonic() + 12
    while True:  # the JobSet and a running pod, before the deadline removes them
        jobsets = get("jobsets", "--field-selector", f"metadata.name={name}")["items"]
        selector = f"jobset.sigs.k8s.io/jobset-name={name}"
        jobs, pods = get("jobs", "-l", selector)["items"], get("pods", "-l", selector)["items"]
        if jobsets and jobs and pods and pods[0]["status"].get("phase") == "Running":
            break
        assert time.monotonic() < deadline, f"no JobSet or running pod of {name}: {jobsets} {pods}"
        time.sleep(0.5)
    assert jobsets[0]["metadata"]["labels"]["team"] == "vision"
    assert jobs[0]["metadata"]["labels"]["tier"] == "batch"
    pod = pods[0]
    assert pod["metadata"]["labels"]["sdk-patched"] == "yes"
    assert toleration in pod["spec"]["tolerations"]

    job = client.wait_for_job_status(name, {"Failed"}, timeout=60, polling_interval=1)
    assert job.status == "Failed"
    failed = next(c for c in get("trainjob", name)["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"
    deadline = time.monotonic() + 60
    while stack.kubectl("get", "jobsets,pods", "-o", "name").stdout.count(name):
        assert time.monotonic() < deadline, "the JobSet or pods of the timed-out TrainJob remain"
        time.sleep(1)
    client.delete_job(name)


def test_training_progress_reaches_the_trainjob_status(client: Any, trainyard_stack_module: RunningStack) -> None:
    """v2.3.0 TrainJobStatus, on in `trainyard up`: the SDK's update_trainjob_status in a trainer
    pod reaches status.trainerStatus through the status endpoint, authenticated by the pod's
    projected token."""
    from kubeflow.trainer import CustomTrainer

    stack = trainyard_stack_module
    name = client.train(runtime="torch-distributed-cpu", trainer=CustomTrainer(func=report_progress, num_nodes=1))
    deadline = time.monotonic() + 120
    while True:
        trainjob = json.loads(stack.kubectl("get", "trainjob", name, "-o", "json").stdout)
        progress = (trainjob.get("status") or {}).get("trainerStatus")
        if progress:
            break
        assert time.monotonic() < deadline, "no progress reported:\n" + "\n".join(client.get_job_logs(name))
        time.sleep(1)
    assert (progress["progressPercentage"], progress["estimatedRemainingSeconds"]) == (50, 20)
    assert progress["metrics"] == [{"name": "loss", "value": "0.5"}]
    assert progress["lastUpdatedTime"].endswith("Z")
    header, row = stack.kubectl("get", "trainjob", name).stdout.splitlines()[:2]
    assert row[header.index("PROGRESS"):].split()[0] == "50"  # by position: STATE is blank while running
    assert "progress sent: True" in "\n".join(client.get_job_logs(name))
    client.delete_job(name)

