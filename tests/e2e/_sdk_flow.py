"""The Kubeflow SDK's main flow, run by test_sdk.py (one API process) and
test_sdk_api_workers.py (`trainyard up --api-workers 4`)."""
from __future__ import annotations

import os
import time
from typing import Any

import pytest

from fixtures.stack import RunningStack


def ddp_hello(greeting):
    # Runs in each trainer process, started by a bare `torchrun` that finds its peers through the
    # PET_* env the torch plugin injects.
    import torch.distributed as dist

    import os
    import sys

    dist.init_process_group(backend="gloo")
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} says {greeting}", flush=True)
    dist.barrier()
    # Past the last barrier, end without torch's gloo teardown, which can abort a worker while its
    # peers close their connections (examples/torch-ddp-cpu/train.py, finish()).
    sys.stdout.flush()
    os._exit(0)


def train_wait_logs_delete(client: Any, stack: RunningStack) -> None:
    """The SDK's main flow: train a function on 2 nodes, wait for it, read its logs and events,
    delete it and see its children go (also run against 4 API workers: test_sdk_api_workers.py)."""
    from kubeflow.trainer import CustomTrainer

    # No runtime: the SDK picks its default, torch-distributed, looking for a namespaced
    # TrainingRuntime first (404) and then the ClusterTrainingRuntime.
    # The SDK sends {"cpu": 1.0}: a float the API server must take as a whole quantity. Two such
    # pods need two CPUs on devcluster's one node.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs: two trainer pods each request cpu 1 on devcluster's single node")
    name = client.train(
        trainer=CustomTrainer(func=ddp_hello, func_args={"greeting": "hello"}, num_nodes=2,
                              resources_per_node={"cpu": 1}),
    )
    assert client.get_job(name).runtime.name == "torch-distributed"
    seen = client.wait_for_job_status(name, {"Running", "Complete"}, timeout=240, polling_interval=1)
    assert seen.status in ("Running", "Complete")
    job = client.wait_for_job_status(name, {"Complete"}, timeout=240, polling_interval=1)
    assert job.status == "Complete"
    assert job.num_nodes == 2
    assert sorted(step.name for step in job.steps) == ["node-0", "node-1"]
    node0 = next(step for step in job.steps if step.name == "node-0")
    assert (node0.device, node0.device_count) == ("cpu", "1")

    logs = "\n".join(client.get_job_logs(name))
    assert "rank 0 of 2 says hello" in logs
    followed = "\n".join(client.get_job_logs(name, step="node-1", follow=True))
    assert "of 2 says hello" in followed

    client.get_job_events(name)  # must parse: core/v1 Events with involvedObject and firstTimestamp
    client.delete_job(name)  # no propagation policy: the children go by garbage collection
    deadline = time.monotonic() + 60
    while any(job.name == name for job in client.list_jobs()):
        assert time.monotonic() < deadline, f"TrainJob {name} still listed after delete_job"
        time.sleep(1)
    while True:
        listed = stack.kubectl("get", "jobsets,jobs,pods", "-o", "name").stdout.split()
        left = [item for item in listed if name in item]
        if not left:
            break
        assert time.monotonic() < deadline, f"children of the deleted TrainJob remain: {left}"
        time.sleep(1)
