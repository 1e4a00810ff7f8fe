"""Checkpoints that survive preemption, for any torch training loop (one file, torch only).

Copy this file next to your training script (the torch-ddp-cpu example ships it in its
ConfigMap) and use it like this::

    from checkpoint import Checkpoint

    ckpt = Checkpoint()                       # directory from $CHECKPOINT_DIR; off when unset
    start = ckpt.restore(model, optimizer)    # the global step to go on from (0: a fresh start)
    for step in range(start + 1, total + 1):
        ...                                   # forward, backward, optimizer.step()
        if ckpt.step_done(step, model, optimizer):
            break                             # SIGTERM: saved at this step, exit now

The contract (docs/preemption.md):

* **Where**: ``$CHECKPOINT_DIR`` (or ``directory=``), a persistent volume mounted in every pod
  (a JobSet ``volumeClaimPolicies`` claim from the runtime). Only global rank 0 writes and reads
  it; the other ranks receive the state from rank 0, so a volume mounted on rank 0's pod alone
  is enough.
* **What**: one file per save, ``step-<8 digits>.pt``, a ``torch.save`` of ``{"step", "model",
  "optimizer", "extra"}`` (the model unwrapped from DistributedDataParallel), written to a
  temporary file, flushed to disk and renamed: a reader sees a whole checkpoint or none. The
  newest ``keep`` files are kept.
* **When**: every ``every_steps`` steps and/or ``every_seconds`` seconds
  (``$CHECKPOINT_EVERY_STEPS``, ``$CHECKPOINT_EVERY_SECONDS``), and at once when any rank got
  SIGTERM (the kubelet's signal when the pod is deleted, e.g. when Kueue suspends the TrainJob):
  all ranks agree after each step whether one of them was asked to stop, so they stop together
  after the same step, within the pod's ``terminationGracePeriodSeconds``.
* **Resume**: ``restore`` loads the newest checkpoint and returns its step; training goes on
  from the next step, so the global step never goes back.
"""
from __future__ import annotations

import ctypes
import io
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_NAME = re.compile(r"^step-(\d{8})\.pt$")


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if hasattr(model, "module") else model


def _broadcast(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """Rank 0's checkpoint to every rank, as torch.save bytes (no numpy needed, unlike
    ``broadcast_object_list``)."""
    payload = b""
    if dist.get_rank() == 0 and state is not None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        payload = buffer.getvalue()
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, src=0)
    if size.item() == 0:
        return None
    if dist.get_rank() == 0:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, src=0)
    if dist.get_rank() == 0:
        return state
    received = ctypes.string_at(data.data_ptr(), data.numel())
    return torch.load(io.BytesIO(received), map_location="cpu", weights_only=True)


class Checkpoint:
    def __init__(self, directory: str | os.PathLike[str] | None = None, *, every_steps: int | None = None,
                 every_seconds: float | None = None, keep: int = 2) -> None:
        chosen = directory if directory is not None else os.environ.get("CHECKPOINT_DIR", "")
        self.directory = Path(chosen) if chosen else None
        self.every_steps = every_steps if every_steps is not None else int(os.environ.get("CHECKPOINT_EVERY_STEPS", "0") or 0)
        self.every_seconds = every_seconds if every_seconds is not None else \
            float(os.environ.get("CHECKPOINT_EVERY_SECONDS", "0") or 0)
        self.keep = max(keep, 1)
        self.restored_step = 0
        self._stop_requested = False
        self._saved_at = time.monotonic()
        if self.directory is not None:
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def close(self) -> None:
        """Give SIGTERM back to the handler that was there before."""
        if self.directory is not None and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous_handler)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        # Only a flag: the state is saved between steps, where model and optimizer agree.
        self._stop_requested = True

    # -- resume ---------------------------------------------------------------------------
    def latest(self) -> Path | None:
        """The newest complete checkpoint file, None when there is none."""
        if self.directory is None or not self.directory.is_dir():
            return None
        found = sorted((int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))
        return found[-1][1] if found else None

    def restore(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
        """Load the newest checkpoint into ``model`` (and ``optimizer``) on every rank; return
        its global step, 0 when training starts fresh."""
        if self.directory is None:
            return 0
        state = None
        if _rank() == 0:
            path = self.latest()
            if path is not None:
                state = torch.load(path, map_location="cpu", weights_only=True)
        if _distributed():
            state = _broadcast(state)
        if state is None:
            return 0
        _unwrapped(model).load_state_dict(state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        self.restored_step = int(state["step"])
        return self.restored_step

    # -- save -----------------------------------------------------------------------------
    def save(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
             extra: dict[str, Any] | None = None) -> Path | None:
        """Write the checkpoint of ``step`` (rank 0 only; others return None) atomically."""
        if self.directory is None or _rank() != 0:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"step-{step:08d}.pt"
        temporary = self.directory / f".{final.name}.tmp-{os.getpid()}"
        state = {"step": step, "model": _unwrapped(model).state_dict(),
                 "optimizer": optimizer.state_dict() if optimizer is not None else None,
                 "extra": extra or {}}
        with open(temporary, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
        directory_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)  # the rename itself reaches the disk
        finally:
            os.close(directory_fd)
        self._saved_at = time.monotonic()
        self._prune()
        return final

    def _prune(self) -> None:
        assert self.directory is not None
        found = sorted((int(m.group(1)), p) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))
        for _, path in found[:-self.keep]:
            path.unlink(missing_ok=True)

    def _stop_agreed(self) -> bool:
        """True on every rank when any rank was asked to stop (one small all-reduce a step)."""
        if not _distributed():
            return self._stop_requested
        flag = torch.tensor([1 if self._stop_requested else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def step_done(self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  extra: dict[str, Any] | None = None) -> bool:
        """Call after each optimizer step. Saves when an interval is due; returns True (after
        saving) when training must stop because a rank got SIGTERM."""
        if self.directory is None:
            return False
        if self._stop_agreed():
            self.save(step, model, optimizer, extra)
            return True
        due = (self.every_steps > 0 and step % self.every_steps == 0) or \
            (self.every_seconds > 0 and time.monotonic() - self._saved_at >= self.every_seconds)
        if due:  # only rank 0 writes, so the other ranks' clocks do not matter
            self.save(step, model, optimizer, extra)
        return False
