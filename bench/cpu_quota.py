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


# ------------------------------------------------------------------ shared by the benches
# bench/e2e.py, bench/multicluster.py and bench/takeover.py take the same --cpu-limit and
# --limit-roles options and report the limited replicas the same way.

AT_LIMIT = 0.9  # of its CPU limit: a limited replica this busy is at its limit


def add_arguments(parser, default_roles: str, roles_help: str) -> None:
    """``--cpu-limit CORES`` and ``--limit-roles SERVICES`` on a bench's parser."""
    parser.add_argument("--cpu-limit", type=float, default=0.0, metavar="CORES",
                        help="run each replica of --limit-roles in a cgroup of its own with this CPU quota "
                             "(e.g. 0.03), as a pod's resources.limits.cpu does: lifted while it starts, applied "
                             "once it is ready; needs root and a cgroup cpu controller (v1 or v2)")
    parser.add_argument("--limit-roles", default=default_roles, metavar="SERVICES",
                        help=f"with --cpu-limit: {roles_help} (comma list; default {default_roles})")


def parse_limit(cpu_limit: float, limit_roles: str, known) -> tuple[str, ...]:
    """The checked --limit-roles (a tuple of names out of ``known``); ends the run with a message
    for an unknown role or a negative --cpu-limit."""
    roles = tuple(s.strip() for s in limit_roles.split(",") if s.strip())
    unknown = sorted(set(roles) - set(known))
    if unknown:
        raise SystemExit(f"error: --limit-roles: unknown services {unknown} (of {', '.join(known)})")
    if cpu_limit < 0:
        raise SystemExit(f"error: --cpu-limit: cores, above 0, got {cpu_limit}")
    if cpu_limit and not roles:
        raise SystemExit("error: --limit-roles: --cpu-limit needs at least one service to limit")
    return roles


class LimitedReplicas:
    """The CPU-limited replicas of one bench run by label (``dispatcher-2``, ``applier-4``):
    each in a cgroup of its own, the limit lifted while it starts (``starting``) and applied
    once it is ready (``apply``). Without a limit (``cores`` 0) every call does nothing, and no
    cgroup is made."""

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self.quotas = CpuQuotas() if cores else None
        self.groups: dict[str, Group] = {}

    def __bool__(self) -> bool:
        return self.quotas is not None

    def starting(self, label: str, pid: int) -> None:
        """The replica ``pid`` (new, or a replacement under the same label) in its cgroup,
        unlimited: starting costs seconds of CPU."""
        if self.quotas is None:
            return
        group = self.groups.get(label) or self.quotas.group(label)
        group.limit(None)
        group.add(pid)
        self.groups[label] = group

    def apply(self, *labels: str) -> None:
        """The limit on these replicas (all of them when none is named)."""
        if self.quotas is None:
            return
        for label in labels or tuple(self.groups):
            self.groups[label].limit(self.cores)

    def snapshot(self, labels=None) -> dict[str, tuple[float, tuple[int, int]]]:
        """Per replica (all, or those of ``labels`` that are limited): CPU seconds and
        (periods, periods throttled) so far, for ``shares`` at the end of a run."""
        chosen = self.groups if labels is None else {k: self.groups[k] for k in labels if k in self.groups}
        return {label: (group.usage_s(), group.throttled()) for label, group in chosen.items()}

    def shares(self, before: dict[str, tuple[float, tuple[int, int]]], wall: float) -> dict[str, tuple[float, float]]:
        """``limit_shares`` of the replicas in ``before``, from the cgroups' own accounting."""
        if not before or wall <= 0:
            return {}
        groups = {label: self.groups[label] for label in before}
        used = {label: self.groups[label].usage_s() - before[label][0] for label in before}
        return limit_shares(groups, {label: value[1] for label, value in before.items()}, used, wall, self.cores)

    def describe(self) -> str:
        return self.quotas.describe() if self.quotas is not None else "no CPU limit"

    def close(self) -> None:
        if self.quotas is not None:
            self.quotas.close()


def limit_shares(limited: dict, throttled_before: dict, cpu_each: dict[str, float], wall: float,
                 cores: float) -> dict[str, tuple[float, float]]:
    """Each limited replica's CPU over the run as a share of its limit, and the share of CFS
    periods in which the kernel throttled it."""
    out = {}
    for name, group in limited.items():
        periods0, throttled0 = throttled_before[name]
        periods1, throttled1 = group.throttled()
        periods = periods1 - periods0
        out[name] = (cpu_each.get(name, 0.0) / wall / cores, (throttled1 - throttled0) / periods if periods else 0.0)
    return out


def at_limit(shares: dict[str, tuple[float, float]]) -> list[str]:
    """The replicas at their limit (>= AT_LIMIT of it), the busiest first."""
    return sorted((name for name, (share, _) in shares.items() if share >= AT_LIMIT), key=lambda name: -shares[name][0])


def share_list(shares: dict[str, tuple[float, float]]) -> str:
    """``dispatcher 97% (80%), dispatcher-2 40% (0%)``: CPU as a share of the limit (periods throttled)."""
    return ", ".join(f"{name} {100 * share:.0f}% ({100 * throttled:.0f}%)" for name, (share, throttled) in shares.items())


def limit_lines(shares: dict[str, tuple[float, float]], cores: float) -> list[str]:
    """Per limited replica: its CPU as a share of its limit (and periods throttled); the replicas
    at their limit named."""
    if not shares:
        return []
    busy = at_limit(shares)
    return [f"CPU of each limited replica as a share of its {cores:g}-CPU limit (periods throttled): " +
            share_list(shares),
            f"at their limit (>= {100 * AT_LIMIT:.0f}%): " + (", ".join(busy) if busy else "none")]


def limited_saturation(shares: dict[str, tuple[float, float]], cores: float) -> str | None:
    """The limit of a run with CPU-limited replicas: the replicas at their limit, if any."""
    busy = at_limit(shares)
    if not busy:
        return None
    name = busy[0]
    more = f" and {len(busy) - 1} more of {len(shares)} limited replicas" if len(busy) > 1 else ""
    return f"{name} at {100 * shares[name][0]:.0f}% of its {cores:g}-CPU limit{more}"
