"""A replica knows the CPU limit it runs under, as a pod's limits.cpu gives it: cgroup v1 and v2,
a limit set on an ancestor, a container whose /proc/self/cgroup names the host's path, no
limit at all, and a process moved into a limited cgroup after it started."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainyard.telemetry.cpu_limit import cpu_limit_cores


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_and_max(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    write(proc, "0::/kubepods/pod1/c1\n")
    write(tmp_path / "fs/kubepods/pod1/c1/cpu.max", "max 100000\n")
    assert cpu_limit_cores(proc, tmp_path / "fs") is None
    write(tmp_path / "fs/kubepods/pod1/cpu.max", "50000 100000\n")  # the pod's limit, on the parent
    assert cpu_limit_cores(proc, tmp_path / "fs") == 0.5
    write(tmp_path / "fs/kubepods/pod1/c1/cpu.max", "3000 100000\n")
    assert cpu_limit_cores(proc, tmp_path / "fs") == pytest.approx(0.03)


def test_cgroup_v1_quota_unlimited_and_container_paths(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    write(proc, "4:memory:/x\n3:cpu,cpuacct:/kubepods/pod1/c1\n")
    fs = tmp_path / "fs"
    write(fs / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(fs / "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    assert cpu_limit_cores(proc, fs) is None  # the path is not under the mount, the root has none
    write(fs / "cpu,cpuacct/cpu.cfs_quota_us", "200000\n")  # a container: its cgroup is the mount root
    assert cpu_limit_cores(proc, fs) == 2.0
    write(fs / "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_quota_us", "25000\n")
    write(fs / "cpu,cpuacct/kubepods/pod1/c1/cpu.cfs_period_us", "100000\n")
    assert cpu_limit_cores(proc, fs) == 0.25  # the smallest of the cgroup and its ancestors


def test_nothing_to_read_means_no_limit(tmp_path: Path) -> None:
    assert cpu_limit_cores(tmp_path / "missing", tmp_path) is None
    write(tmp_path / "cgroup", "garbage\n1:cpu:/\n")
    assert cpu_limit_cores(tmp_path / "cgroup", tmp_path / "fs") is None


def test_a_process_moved_into_a_limited_cgroup_reads_its_limit() -> None:
    """On this machine's real cgroup hierarchy (as root with the v1 cpu controller)."""
    cpu = Path("/sys/fs/cgroup/cpu")
    if os.geteuid() != 0 or not (cpu / "cpu.cfs_quota_us").exists():
        pytest.skip("needs root and the cgroup v1 cpu controller")
    group = cpu / f"trainyard-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_quota_us").write_text("30000")
        code = ("import sys, time; from trainyard.telemetry.cpu_limit import cpu_limit_cores; "
                "print(cpu_limit_cores()); sys.stdout.flush(); sys.stdin.readline(); print(cpu_limit_cores())")
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdin is not None
            before = child.stdout.readline().strip()
            (group / "cgroup.procs").write_text(str(child.pid))
            child.stdin.write("\n")
            child.stdin.flush()
            after = child.stdout.readline().strip()
        finally:
            child.wait(timeout=30)
        assert (before, after) == ("None", "0.3")
    finally:
        group.rmdir()
