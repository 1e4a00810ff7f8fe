"""Elastic data-parallel training on CPU (torchrun elastic, c10d rendezvous, gloo).

Every trainer pod runs `torchrun train.py`; the Trainer's PET_* variables make it elastic:
PET_NNODES=<minNodes>:<maxNodes>, PET_MAX_RESTARTS, PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT
(node 0's stable name) and PET_RDZV_ID. Whenever pods come or go torchrun stops the workers,
forms the group again with the nodes present and starts this script anew, so the script
resumes from its last checkpoint: a file in CHECKPOINT_DIR, a volume every pod mounts. Rank 0
writes it every CHECKPOINT_EVERY steps (write to a temporary file, then rename: a reader never
sees half a file) and prints one line per step:

    step=<global step> loss=<loss> world=<processes> nodes=<nodes> restart=<torchrun restart count>

The same lines go to CHECKPOINT_DIR/progress.log, which outlives the pods (a removed pod's log
goes with it).

FAIL_AT_STEP=<n> makes every worker exit with an error at step n (to spend torchrun's budget).
A file CHECKPOINT_DIR/train_steps, when present, holds the number of steps instead of TRAIN_STEPS
(so a running job can be made shorter or longer; the e2e test ends its run that way).
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("TRAIN_STEPS", "100"))
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.4"))
CHECKPOINT_DIR = os.environ.get("CHECKPOINT_DIR", "/checkpoints")
CHECKPOINT_EVERY = int(os.environ.get("CHECKPOINT_EVERY", "2"))
FAIL_AT_STEP = int(os.environ.get("FAIL_AT_STEP", "-1"))
FEATURES = 8


def checkpoint_path() -> str:
    return os.path.join(CHECKPOINT_DIR, "checkpoint.pt")


def load(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """The step to continue from (0 without a checkpoint)."""
    try:
        state = torch.load(checkpoint_path(), weights_only=True)
    except FileNotFoundError:
        return 0
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    os.makedirs(CHECKPOINT_DIR, exist_ok=True)
    partial = checkpoint_path() + f".{os.getpid()}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, partial)
    os.replace(partial, checkpoint_path())


def total_steps() -> int:
    try:
        with open(os.path.join(CHECKPOINT_DIR, "train_steps")) as handle:
            return int(handle.read().strip())
    except (FileNotFoundError, ValueError):
        return STEPS


def record(line: str) -> None:
    print(line, flush=True)
    os.makedirs(CHECKPOINT_DIR, exist_ok=True)
    with open(os.path.join(CHECKPOINT_DIR, "progress.log"), "a") as log:
        log.write(f"{time.time():.2f} {line}\n")


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    step = load(model, optimizer)  # every rank reads the same file: the same weights everywhere
    ddp = DistributedDataParallel(model)
    # A fixed target every node agrees on; each rank draws its own batches.
    weights = torch.arange(1.0, FEATURES + 1).unsqueeze(1) / FEATURES
    generator = torch.Generator().manual_seed(1000 + rank + 7 * step)
    nodes = os.environ.get("GROUP_WORLD_SIZE", "?")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if rank == 0:
        record(f"start step={step} world={world} nodes={nodes} restart={restart}")
    steps = total_steps()
    while step < steps:
        if step == FAIL_AT_STEP:
            print(f"rank {rank}: failing at step {step} on purpose", flush=True)
            return 3
        inputs = torch.randn(32, FEATURES, generator=generator)
        targets = inputs @ weights
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        total = loss.detach().clone()
        dist.all_reduce(total)
        if rank == 0:
            record(f"step={step} loss={total.item() / world:.5f} world={world} nodes={nodes} restart={restart}")
            if step % CHECKPOINT_EVERY == 0 or step == steps:
                save(model, optimizer, step)
        time.sleep(STEP_SECONDS)
        # Every rank must agree on the end: rank 0 reads the file, the others follow it.
        agreed = torch.tensor([total_steps() if rank == 0 else 0])
        dist.broadcast(agreed, 0)
        steps = int(agreed.item())
    dist.barrier()
    # Past the last barrier, end without torch's gloo teardown: it can abort a worker while its
    # peers close their connections (SIGABRT after a finished run; examples/torch-ddp-cpu/train.py,
    # finish(), has the whole story), and torchrun would take that for a failure to restart.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
