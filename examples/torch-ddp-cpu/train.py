"""Data-parallel training of a small regression model on synthetic data (CPU, gloo).

Started by torchrun: the Trainer's PET_* variables (PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) are read by torchrun itself, which gives
each process RANK/WORLD_SIZE/LOCAL_RANK. Rank 0 logs the loss of every step, and reports its
progress to the TrainJob's status when the TrainJobStatus feature gate gave the pod an endpoint
(KUBEFLOW_TRAINER_SERVER_URL; `trainyard up` turns it on): `kubectl get trainjobs` shows it.

With CHECKPOINT_DIR set (a persistent volume, docs/preemption.md) it resumes from the newest
checkpoint there and saves one on SIGTERM and every CHECKPOINT_EVERY_STEPS steps (checkpoint.py,
shipped beside this script). STEP_SECONDS slows each step down (default 0), e.g. to watch a
preemption happen.
"""
import json
import os
import socket
import ssl
import sys
import time
import urllib.request
from datetime import datetime, timezone

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("TRAIN_STEPS", "30"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0"))
FEATURES = 16
SAMPLES = 1024


class Progress:
    """Progress reports as the Kubeflow SDK's update_trainjob_status sends them, with the standard
    library only (any image): at most one a second, the last one always; never fails training."""

    def __init__(self, first_step: int = 1) -> None:
        self.url = os.environ.get("KUBEFLOW_TRAINER_SERVER_URL")
        self.sent_at = 0.0
        self.started = time.monotonic()
        self.first_step = first_step

    def report(self, step: int, loss: float, extra: list[dict[str, str]] | None = None,
               force: bool = False) -> None:
        if not self.url or (step < STEPS and not force and time.monotonic() - self.sent_at < 1.0):
            return
        elapsed = time.monotonic() - self.started
        done = step - self.first_step + 1  # steps run by this process (a resumed run starts later)
        status = {"progressPercentage": step * 100 // STEPS,
                  "estimatedRemainingSeconds": int(elapsed / done * (STEPS - step)),
                  "metrics": [{"name": "loss", "value": f"{loss:.6f}"}, *(extra or [])],
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


def checkpointer():
    """The checkpoint helper when CHECKPOINT_DIR names a volume; None (no checkpoints) otherwise,
    so the script also runs shipped alone."""
    if not os.environ.get("CHECKPOINT_DIR"):
        return None
    from checkpoint import Checkpoint  # beside this script (kustomization.yaml ships both)
    return Checkpoint()


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
    ckpt = checkpointer()
    start = ckpt.restore(model, optimizer) if ckpt else 0
    if rank == 0 and start:
        print(f"resumed from step {start}", flush=True)
    progress = Progress(start + 1) if rank == 0 else None
    for step in range(start + 1, STEPS + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        stopping = ckpt.step_done(step, model, optimizer) if ckpt else False
        if progress is not None:
            print(f"step {step} loss {reduced.item() / world:.6f}", flush=True)
            extra = []
            if ckpt:  # the global step, and where this run took over from
                extra = [{"name": "step", "value": str(step)}] + \
                    ([{"name": "resumedFromStep", "value": str(start)}] if start else [])
            progress.report(step, reduced.item() / world, extra, force=stopping or step == start + 1)
        if STEP_SECONDS:
            time.sleep(STEP_SECONDS)
        if stopping:
            if rank == 0:
                print(f"SIGTERM: checkpoint saved at step {step}, stopping", flush=True)
            finish()  # every rank stops at this step (step_done agreed on it): same ending as below
    dist.barrier()
    if rank == 0:
        print("training complete", flush=True)
    finish()


def finish() -> None:
    """End the process now that every rank has passed the final barrier, without torch's teardown.

    The gloo teardown (destroy_process_group, then interpreter exit) can abort a process while
    its peers close their connections: seen as "terminate called without an active exception"
    (SIGABRT) in one worker of node 1 after rank 0 had logged "training complete". torchrun then
    fails that node without reaching its exit barrier, the pod restarts in place (restartPolicy
    OnFailure), and its new torchrun joins the rendezvous store still held by node 0's torchrun
    (waiting in its exit barrier) and reads the finished workers' addresses from it: "Gloo
    connectFullMesh failed ... Connection refused" until the Job's backoffLimit fails the
    TrainJob. Past the barrier there is nothing left to send, and the kernel closes the sockets
    at exit, so skipping the teardown loses nothing and cannot turn a finished run into a
    failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
