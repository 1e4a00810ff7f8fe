"""The checkpoint helper shipped with the torch examples (examples/torch-ddp-cpu/checkpoint.py):
atomic numbered files, resume from the newest, SIGTERM saves and stops every rank after the
same step (two gloo processes)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.supervisor.ports import free_port

torch = pytest.importorskip("torch")

HELPER = Path(__file__).resolve().parents[3] / "examples" / "torch-ddp-cpu" / "checkpoint.py"


def _helper():
    spec = importlib.util.spec_from_file_location("checkpoint_helper", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model_and_optimizer(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()  # momentum buffers exist: optimizer state is not empty
    return model, optimizer


def test_off_without_a_directory(monkeypatch):
    monkeypatch.delenv("CHECKPOINT_DIR", raising=False)
    ckpt = _helper().Checkpoint()
    model, optimizer = _model_and_optimizer(0)
    assert not ckpt.enabled
    assert ckpt.restore(model, optimizer) == 0
    assert ckpt.step_done(5, model, optimizer) is False


def test_saves_at_intervals_keeps_the_newest_and_resumes_from_the_last(tmp_path):
    helper = _helper()
    ckpt = helper.Checkpoint(tmp_path, every_steps=3, keep=2)
    try:
        model, optimizer = _model_and_optimizer(0)
        for step in range(1, 10):
            assert ckpt.step_done(step, model, optimizer) is False
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000006.pt", "step-00000009.pt"]
    finally:
        ckpt.close()
    fresh_model, fresh_optimizer = _model_and_optimizer(1)
    again = helper.Checkpoint(tmp_path)
    try:
        assert again.restore(fresh_model, fresh_optimizer) == 9
    finally:
        again.close()
    assert torch.equal(fresh_model.weight, model.weight)
    momentum = lambda opt: opt.state_dict()["state"][0]["momentum_buffer"]  # noqa: E731
    assert torch.equal(momentum(fresh_optimizer), momentum(optimizer))


def test_sigterm_saves_now_and_says_stop(tmp_path):
    helper = _helper()
    ckpt = helper.Checkpoint(tmp_path)
    try:
        model, optimizer = _model_and_optimizer(0)
        assert ckpt.step_done(1, model, optimizer) is False
        assert not list(tmp_path.iterdir())  # no interval: nothing saved yet
        os.kill(os.getpid(), signal.SIGTERM)
        assert ckpt.step_done(2, model, optimizer) is True
        assert [p.name for p in tmp_path.iterdir()] == ["step-00000002.pt"]  # no temporary left
    finally:
        ckpt.close()
    assert signal.getsignal(signal.SIGTERM) is not ckpt._on_sigterm


# Two ranks; rank 1 gets SIGTERM after step 4. Both must stop after the same step, rank 0
# having saved it; a second pair of ranks resumes from it with rank 0's parameters.
WORKER = r"""
import os, signal, sys
import torch, torch.distributed as dist
sys.path.insert(0, os.environ["HELPER_DIR"])
from checkpoint import Checkpoint
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # different on purpose: the resumed state must come from rank 0
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
ckpt = Checkpoint(os.environ["CKPT"])
start = ckpt.restore(model, optimizer)
print(f"rank {rank} start {start} weight {model.weight.sum().item():.6f}", flush=True)
for step in range(start + 1, start + 100):
    optimizer.zero_grad(); model(torch.ones(2, 4)).sum().backward(); optimizer.step()
    if rank == 1 and step == start + 4 and os.environ.get("TERM_AT"):
        os.kill(os.getpid(), signal.SIGTERM)
    if ckpt.step_done(step, model, optimizer):
        print(f"rank {rank} stopped {step}", flush=True)
        break
    if step == start + 6:
        print(f"rank {rank} ran {step}", flush=True)
        break
# Both ranks leave the loop at the same step. Past the last barrier, end without torch's gloo
# teardown, which aborts a rank now and then after the work is done ("terminate called without
# an active exception", SIGABRT: issue #22's root cause, examples/torch-ddp-cpu/train.py finish()).
dist.barrier()
sys.stdout.flush()
os._exit(0)
"""


def _run_pair(tmp_path: Path, term: bool) -> list[str]:
    port = free_port()  # below the ephemeral range: no client connection takes it meanwhile
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "HELPER_DIR": str(HELPER.parent), "CKPT": str(tmp_path / "ckpt"),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2"}
        if term:
            env["TERM_AT"] = "1"
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    out = []
    for proc in procs:
        text, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, text
        out.extend(line for line in text.splitlines() if line.startswith("rank "))
    return sorted(out)


def test_sigterm_on_one_rank_stops_all_after_the_same_step_and_resume_broadcasts(tmp_path):
    first = _run_pair(tmp_path, term=True)
    assert [line for line in first if "stopped" in line] == ["rank 0 stopped 4", "rank 1 stopped 4"]
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["step-00000004.pt"]
    second = _run_pair(tmp_path, term=False)
    starts = [line for line in second if " start " in line]
    assert [line.split(" weight ")[0] for line in starts] == ["rank 0 start 4", "rank 1 start 4"]
    assert starts[0].split(" weight ")[1] == starts[1].split(" weight ")[1]  # rank 0's state on both
    assert [line for line in second if " ran " in line] == ["rank 0 ran 10", "rank 1 ran 10"]
