"""Data-parallel training of a small regression model on synthetic data (CPU, gloo).

Started by torchrun: the Trainer's PET_* variables (PET_NNODES, PET_NPROC_PER_NODE,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) are read by torchrun itself, which gives
each process RANK/WORLD_SIZE/LOCAL_RANK. Rank 0 logs the loss of every step.
"""
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = int(os.environ.get("TRAIN_STEPS", "30"))
FEATURES = 16
SAMPLES = 1024


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
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)
        if rank == 0:
            print(f"step {step} loss {reduced.item() / world:.6f}", flush=True)
    dist.barrier()
    if rank == 0:
        print("training complete", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
