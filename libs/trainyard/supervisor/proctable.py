"""Facts about OS processes, read from /proc: identity (pid + start time), and descendants.

A pid alone is not an identity: after a process exits its pid can be given to an unrelated one.
Every pid the supervisor records is paired with the process start time, and nothing is ever
signalled unless both still match.
"""
from __future__ import annotations

import ctypes
import os
import signal
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start_time: int | None  # clock ticks since boot (field 22 of /proc/<pid>/stat); None if unknown

    def is_alive(self) -> bool:
        current = process_start_time(self.pid)
        if current is None:
            return _pid_exists(self.pid) and self.start_time is None
        return self.start_time is None or current == self.start_time

    def to_json(self) -> dict[str, int | None]:
        return {"pid": self.pid, "start_time": self.start_time}

    @classmethod
    def from_json(cls, data: dict[str, int | None]) -> ProcessId:
        return cls(pid=int(data["pid"] or 0), start_time=data.get("start_time"))

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        return cls(pid=pid, start_time=process_start_time(pid))


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read_stat(pid: int) -> list[str] | None:
    try:
        raw = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last ')'.
    _, _, rest = raw.rpartition(")")
    return rest.split()


def process_start_time(pid: int) -> int | None:
    fields = _read_stat(pid)
    if fields is None or len(fields) < 20:
        return None
    if fields[0] == "Z":  # a zombie has exited; only its exit status is left to collect
        return None
    return int(fields[19])


def parent_pids() -> dict[int, int]:
    """pid -> parent pid for every live, non-zombie process on the machine."""
    parents: dict[int, int] = {}
    if not PROC.is_dir():
        return parents
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _read_stat(int(entry.name))
        if fields is None or len(fields) < 2 or fields[0] == "Z":
            continue
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(root_pid: int) -> list[ProcessId]:
    """Every live process below `root_pid`, children before grandchildren."""
    children: dict[int, list[int]] = {}
    for pid, parent in parent_pids().items():
        children.setdefault(parent, []).append(pid)
    found: list[ProcessId] = []
    frontier = [root_pid]
    while frontier:
        parent = frontier.pop(0)
        for child in sorted(children.get(parent, [])):
            found.append(ProcessId.of(child))
            frontier.append(child)
    return found


def signal_group(process: ProcessId, sig: signal.Signals) -> bool:
    """Signal the process group led by `process` (our children lead their own). False if gone."""
    if not process.is_alive():
        return False
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def signal_process(process: ProcessId, sig: signal.Signals) -> bool:
    if not process.is_alive():
        return False
    try:
        os.kill(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def become_child_subreaper() -> bool:
    """Orphaned grandchildren (a pod whose devcluster died) re-parent to us instead of init,
    so the supervisor can still find and stop them. Linux only; False elsewhere."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent() -> None:
    """Runs in the child between fork and exec: SIGTERM it if the supervisor dies, even by SIGKILL."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
