"""The CPU limit this process runs under: a pod's ``resources.limits.cpu`` as the kernel applies
it (a CFS quota on the process's cgroup), read the way Go's automaxprocs reads it.

cgroup v2: ``cpu.max`` (``<quota> <period>``, or ``max``); v1: ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us`` (-1: none). The effective limit is the smallest quota of the process's
cgroup and its ancestors. Read again whenever asked: a process can be moved into a limited
cgroup after it started (the benches apply a replica's quota once it is ready).
"""
from __future__ import annotations

from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _ratio(quota: str | None, period: str | None) -> float | None:
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _v2_limit(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if not text:
        return None
    parts = text.split()
    return _ratio(parts[0], parts[1] if len(parts) > 1 else "100000") if parts[0] != "max" else None


def _v1_limit(directory: Path) -> float | None:
    return _ratio(_read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us"))


def _smallest_up_to(mount: Path, relative: str, read) -> float | None:
    """The smallest limit of ``mount/relative`` and its ancestors within the mount. In a
    container the mount's root is the container's own cgroup while /proc/self/cgroup may name
    the host's path, which is then not under the mount: the mount's root still applies."""
    limits = []
    directory = mount / relative.strip("/")
    while True:
        if directory.is_dir():
            found = read(directory)
            if found is not None:
                limits.append(found)
        if directory == mount or mount not in directory.parents:
            break
        directory = directory.parent
    return min(limits) if limits else None


def cpu_limit_cores(proc_cgroup: Path = PROC_CGROUP, root: Path = CGROUP_ROOT) -> float | None:
    """Cores this process may use (e.g. 0.5), or None when no quota limits it."""
    text = _read(proc_cgroup)
    if not text:
        return None
    limits = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            found = _smallest_up_to(root, path, _v2_limit)
            if found is None and (root / "unified").is_dir():
                found = _smallest_up_to(root / "unified", path, _v2_limit)
        elif "cpu" in controllers.split(","):
            mount = next((root / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                          if (root / name / "cpu.cfs_quota_us").exists()), None)
            found = _smallest_up_to(mount, path, _v1_limit) if mount is not None else None
        else:
            continue
        if found is not None:
            limits.append(found)
    return min(limits) if limits else None
