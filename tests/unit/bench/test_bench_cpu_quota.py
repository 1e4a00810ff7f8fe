"""bench/cpu_quota.py and bench/e2e.py --cpu-limit: each limited replica is a cgroup of its own
with a CFS quota, as a pod's resources.limits.cpu gives it; the report names the replicas at
their limit (issue #33)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.benchmodules import load_bench

_quota = load_bench("cpu_quota")
_e2e = load_bench("e2e", "bench_e2e")

V1_CPU = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
needs_cgroup = pytest.mark.skipif(os.geteuid() != 0 or not (V1_CPU.exists() or Path("/sys/fs/cgroup/cpu.max").exists()
                                                           or Path("/sys/fs/cgroup/cgroup.controllers").exists()),
                                  reason="needs root and a cgroup cpu controller")


@needs_cgroup
def test_a_replica_is_moved_into_its_own_cgroup_limited_lifted_and_the_cgroups_removed() -> None:
    quotas = _quota.CpuQuotas()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        group = quotas.group("planner-1")
        group.add(sleeper.pid)
        assert str(sleeper.pid) in (group.cpu_dir / "cgroup.procs").read_text().split()
        group.limit(0.03)
        if quotas.version == 1:
            assert (group.cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "3000"
            assert (group.cpu_dir / "cpu.cfs_period_us").read_text().strip() == "100000"
        else:
            assert (group.cpu_dir / "cpu.max").read_text().split() == ["3000", "100000"]
        group.limit(None)
        if quotas.version == 1:
            assert (group.cpu_dir / "cpu.cfs_quota_us").read_text().strip() == "-1"
        else:
            assert (group.cpu_dir / "cpu.max").read_text().split()[0] == "max"
        assert group.usage_s() >= 0.0
        periods, throttled = group.throttled()
        assert 0 <= throttled <= periods
    finally:
        quotas.close()
        sleeper.kill()
        sleeper.wait()
    assert not quotas.cpu_base.exists()


def test_without_root_the_bench_says_why(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit, match="--cpu-limit: needs root"):
        _quota.CpuQuotas()


class _Group:
    def __init__(self, periods: int, throttled: int) -> None:
        self.now = (periods, throttled)

    def throttled(self) -> tuple[int, int]:
        return self.now


def test_each_limited_replica_is_reported_as_a_share_of_its_limit_and_the_busiest_named() -> None:
    limited = {"planner-1": _Group(100, 80), "planner-2": _Group(100, 0), "applier": _Group(100, 0)}
    before = {"planner-1": (0, 0), "planner-2": (0, 0), "applier": (0, 0)}
    # 10 s at a 0.03-CPU limit: 0.3 CPU-seconds is all of it
    shares = _quota.limit_shares(limited, before, {"planner-1": 0.29, "planner-2": 0.12, "applier": 0.3}, 10.0, 0.03)
    assert shares["planner-1"] == pytest.approx((0.29 / 0.3, 0.8))
    assert shares["planner-2"] == pytest.approx((0.4, 0.0))
    lines = _quota.limit_lines(shares, 0.03)
    assert lines[0].startswith("CPU of each limited replica as a share of its 0.03-CPU limit")
    assert "planner-1 97% (80%)" in lines[0] and "planner-2 40% (0%)" in lines[0]
    assert lines[1] == "at their limit (>= 90%): applier, planner-1"
    assert _quota.limited_saturation(shares, 0.03) == (
        "applier at 100% of its 0.03-CPU limit and 1 more of 3 limited replicas")
    assert _quota.limited_saturation({"planner": (0.5, 0.0)}, 0.03) is None
    assert _quota.limit_lines({}, 0.0) == []
    # bench/e2e.py reports with the same code (shared with multicluster and takeover), not a copy
    assert (_e2e.limit_shares, _e2e.limit_lines, _e2e.limited_saturation) == (
        _quota.limit_shares, _quota.limit_lines, _quota.limited_saturation)


def test_leases_lost_and_presences_withdrawn_are_reported_per_replica() -> None:
    assert _e2e.lease_lines({"planner-1": (2.0, 3.0), "planner-2": (0.0, 0.0)}) == [
        "leases lost while a presence was gone: 2 (planner-1 2); presences withdrawn (a stalled event loop): "
        "planner-1 3"]
    assert _e2e.lease_lines({"planner": (0.0, 0.0)}) == [
        "leases lost while a presence was gone: 0; presences withdrawn (a stalled event loop): none"]
    assert _e2e.lease_lines({}) == []


def test_the_busiest_replicas_share_of_the_trainjobs_is_printed_with_the_rate_ceiling_it_sets() -> None:
    """A run's TrainJobs hash unevenly onto the partitions; the replica with the most of them
    bounds the run's rate, so each row says how far from even the split was."""
    before = {"handled": {("planner", 1): 10.0, ("planner", 2): 10.0, ("applier", 3): 5.0}}
    after = {"handled": {("planner", 1): 190.0, ("planner", 2): 130.0, ("applier", 3): 305.0}}
    assert _e2e.share_lines(before, after) == [
        "planner replicas' shares of the TrainJobs: 180, 120; the busiest over an even share 1.20 "
        "(a rate ceiling of 1.67x one replica's)"]  # one applier: no split to show
