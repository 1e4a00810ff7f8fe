"""A CPU limit per process, as a pod's ``resources.limits.cpu`` gives each replica in a cluster.

The kernel's CFS bandwidth control does it: a cgroup with a quota of ``cores x period`` of CPU time
per period (cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; v2 ``cpu.max``), whichever is
mounted. Each limited replica gets a cgroup of its own under ``trainyard-bench-<pid>/``, so one
replica *is* its limit and N replicas get N quotas, however many cores the machine has.

The benches lift the quota while a replica starts (imports and connecting cost seconds of CPU,
which at 0.03 CPU would take minutes) and apply it once the replica is ready. Usage comes from
the cgroup's own accounting (v1 ``cpuacct.usage`` where mounted, else ``cpu.stat``), throttling
from ``cpu.stat`` (periods throttled).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000  # the kernel's default CFS period, as the kubelet uses it


class CpuQuotaError(SystemExit):
    """No way to limit CPU here: the run ends with this message (exit status 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"error: --cpu-limit: {message}")


def _v1_dirs() -> tuple[Path, Path | None] | None:
    cpu = CGROUP_ROOT / "cpu"
    if (cpu / "cpu.cfs_quota_us").exists():
        acct = CGROUP_ROOT / "cpuacct"
        return cpu, (acct if (acct / "cpuacct.usage").exists() and acct.resolve() != cpu.resolve() else None)
    return None


def _v2_dir() -> Path | None:
    for root in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return root
    return None


@dataclass
class Group:
    """One replica's cgroup (and, on v1 with a separate cpuacct hierarchy, its accounting twin)."""

    name: str
    cpu_dir: Path
    acct_dir: Path | None
    version: int

    def add(self, pid: int) -> None:
        for directory in (self.cpu_dir, self.acct_dir):
            if directory is not None:
                (directory / "cgroup.procs").write_text(str(pid))

    def limit(self, cores: float | None) -> None:
        """``cores`` of CPU (e.g. 0.03); None lifts the limit."""
        quota = None if cores is None else max(1000, round(cores * PERIOD_US))
        if self.version == 1:
            (self.cpu_dir / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(-1 if quota is None else quota))
        else:
            (self.cpu_dir / "cpu.max").write_text(f"{'max' if quota is None else quota} {PERIOD_US}")

    def usage_s(self) -> float:
        """CPU seconds used by the group's processes since it was made."""
        if self.version == 1 and self.acct_dir is not None:
            return int((self.acct_dir / "cpuacct.usage").read_text()) / 1e9
        stat = self._stat()
        if "usage_usec" in stat:
            return stat["usage_usec"] / 1e6
        return int((self.cpu_dir / "cpuacct.usage").read_text()) / 1e9  # v1, cpu and cpuacct co-mounted

    def throttled(self) -> tuple[int, int]:
        """(periods, periods in which the group was throttled) so far."""
        stat = self._stat()
        return stat.get("nr_periods", 0), stat.get("nr_throttled", 0)

    def _stat(self) -> dict[str, int]:
        out = {}
        for line in (self.cpu_dir / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
        return out

    def remove(self) -> None:
        for directory in (self.cpu_dir, self.acct_dir):
            if directory is None or not directory.exists():
                continue
            parent_procs = directory.parent.parent / "cgroup.procs"  # the root: the run's folder goes too
            for pid in (directory / "cgroup.procs").read_text().split():
                try:
                    parent_procs.write_text(pid)
                except OSError:
                    pass  # exited meanwhile
            try:
                directory.rmdir()
            except OSError:
                pass


class CpuQuotas:
    """The cgroups of one bench run: ``trainyard-bench-<pid>/<replica>``; ``close`` removes them."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise CpuQuotaError("needs root, to make cgroups (run the bench as root)")
        v1 = _v1_dirs()
        if v1 is not None:
            cpu, acct = v1
            self.version = 1
            self.cpu_base = cpu / f"trainyard-bench-{os.getpid()}"
            self.acct_base = acct / f"trainyard-bench-{os.getpid()}" if acct else None
        else:
            v2 = _v2_dir()
            if v2 is None:
                raise CpuQuotaError(f"no cgroup cpu controller under {CGROUP_ROOT} (v1 cpu.cfs_quota_us or "
                                    "v2 cpu.max)")
            self.version = 2
            self.cpu_base = v2 / f"trainyard-bench-{os.getpid()}"
            self.acct_base = None
        try:
            self.cpu_base.mkdir(exist_ok=True)
            if self.acct_base is not None:
                self.acct_base.mkdir(exist_ok=True)
            if self.version == 2:  # children get the cpu controller
                (self.cpu_base / "cgroup.subtree_control").write_text("+cpu")
        except OSError as err:
            raise CpuQuotaError(f"cannot make a cgroup under {self.cpu_base.parent}: {err}") from err
        self.groups: dict[str, Group] = {}

    def group(self, name: str) -> Group:
        cpu_dir = self.cpu_base / name
        acct_dir = self.acct_base / name if self.acct_base is not None else None
        for directory in (cpu_dir, acct_dir):
            if directory is not None:
                directory.mkdir(exist_ok=True)
        group = Group(name, cpu_dir, acct_dir, self.version)
        self.groups[name] = group
        return group

    def close(self) -> None:
        for group in self.groups.values():
            group.remove()
        for base in (self.cpu_base, self.acct_base):
            if base is not None:
                try:
                    base.rmdir()
                except OSError:
                    pass

    def describe(self) -> str:
        return (f"cgroup v{self.version} ({'cpu.cfs_quota_us' if self.version == 1 else 'cpu.max'}, "
                f"period {PERIOD_US // 1000} ms) under {self.cpu_base}")
