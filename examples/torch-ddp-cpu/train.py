"""Data-parallel training of a small regression model on synthetic data (CPU, gloo).

Started by torchrun: the Trainer's PET_* variables (PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) are read by torchrun itself, which gives
each process RANK/WORLD_SIZE/LOCAL_RANK. Rank 0 logs the loss of every step, and reports its
progress to the TrainJob's status when the TrainJobStatus feature gate gave the pod an endpoint
(KUBEFLOW_TRAINER_SERVER_URL; `trainyard up` turns it on): `kubectl get trainjobs` shows it.
"""
import json
import os
import socket
import ssl
import time
import urllib.request
from datetime import datetime, timezone

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("TRAIN_STEPS", "30"))
FEATURES = 16
SAMPLES = 1024


class Progress:
    """Progress reports as the Kubeflow SDK's update_trainjob_status sends them, with the standard
    library only (any image): at most one a second, the last one always; never fails training."""

    def __init__(self) -> None:
        self.url = os.environ.get("KUBEFLOW_TRAINER_SERVER_URL")
        self.sent_at = 0.0
        self.started = time.monotonic()

    def report(self, step: int, loss: float) -> None:
        if not self.url or (step < STEPS and time.monotonic() - self.sent_at < 1.0):
            return
        elapsed = time.monotonic() - self.started
        status = {"progressPercentage": step * 100 // STEPS,
                  "estimatedRemainingSeconds": int(elapsed / step * (STEPS - step)),
                  "metrics": [{"name": "loss", "value": f"{loss:.6f}"}],
                  "lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
        try:
            with open(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]) as token_file:
                token = token_file.read().strip()
            request = urllib.request.Request(
                self.url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            context = ssl.create_default_context(cafile=os.environ.get("KUBEFLOW_TRAINER_SERVER_CA_CERT"))
            urllib.request.urlopen(request, context=context, timeout=5).close()
            self.sent_at = time.monotonic()
        except (OSError, KeyError) as err:
            print(f"progress report failed: {err}", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    true_weights = torch.randn(FEATURES, 1)
    inputs = torch.randn(SAMPLES, FEATURES)
    targets = inputs @ true_weights + 0.01 * torch.randn(SAMPLES, 1)
    shard = slice(rank * SAMPLES // world, (rank + 1) * SAMPLES // world)
    x, y = inputs[shard], targets[shard]

    torch.manual_seed(1)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    if rank == 0:
        print(f"world size {world}, master {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}, "
              f"host {socket.gethostname()}", flush=True)
    progress = Progress() if rank == 0 else None
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        if progress is not None:
            print(f"step {step} loss {reduced.item() / world:.6f}", flush=True)
            progress.report(step, reduced.item() / world)
    dist.barrier()
    if rank == 0:
        print("training complete", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
