"""Where a container's output goes: one file per run, read back by ``pods/log``.

``<data dir>/pods/<namespace>/<pod>/<container>.log`` is the current run,
``<container>.previous.log`` the run before it (``kubectl logs --previous``), and every earlier
run stays as ``<container>.<attempt>.log``.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path


def log_paths(data_dir: Path, namespace: str, pod: str, container: str) -> tuple[Path, Path]:
    """Current and previous instance log files of one container (read by pods/log)."""
    directory = data_dir / "pods" / namespace / pod
    return directory / f"{container}.log", directory / f"{container}.previous.log"


def attempt_log_path(data_dir: Path, namespace: str, pod: str, container: str, attempt: int) -> Path:
    """The log of one run of a container, 0 for the first (container names have no dots)."""
    return data_dir / "pods" / namespace / pod / f"{container}.{attempt}.log"


def run_log(data_dir: Path, namespace: str, pod: str, container: str, restart_count: int) -> Path:
    """The file the run about to start writes to, after the last run's log has moved aside."""
    current, previous = log_paths(data_dir, namespace, pod, container)
    current.parent.mkdir(parents=True, exist_ok=True)
    if restart_count > 0 and current.exists():
        # `kubectl logs --previous` shows the run before this one, as on a kubelet; every
        # earlier run also stays beside it as <container>.<attempt>.log (a hard link, no
        # copy), so the run that set off a series of restarts can still be read.
        os.replace(current, previous)
        with contextlib.suppress(FileExistsError):
            os.link(previous, attempt_log_path(data_dir, namespace, pod, container, restart_count - 1))
    return current
