"""bench/process_cpu.py (issue #32: where the suite's CPU goes): each process is counted once, by
kind, for what it used after the command started, under the command line it had while alive."""
from __future__ import annotations

import pytest

from fixtures.benchmodules import load_bench

_bench = load_bench("process_cpu", "bench_process_cpu")
Reading = _bench.Reading


@pytest.mark.parametrize("command, kind", [
    ("/v/bin/python -m trainyard.cli.main planner --kubeconfig /tmp/pytest-of-root/k", "trainyard planner"),
    ("/v/bin/python -m trainyard.cli.main devcluster up --data-dir /tmp/d", "trainyard devcluster up"),
    ("/v/bin/python /v/bin/trainyard up --free-ports", "trainyard up"),
    ("/v/bin/nats-server --config /tmp/pytest-of-root/nats.conf", "nats-server"),
    ("/v/bin/python -m pytest -q -n 2 tests", "pytest"),
    ("/v/bin/python -c import sys;exec(eval(sys.stdin.readline()))", "pytest"),
    ("/v/bin/python /v/bin/torchrun --nproc-per-node 1 /opt/torch-ddp-cpu/train.py", "torchrun"),
    ("/v/bin/python -u /opt/torch-ddp-cpu/train.py", "python train.py"),
    ("/v/bin/kubectl --kubeconfig /tmp/k get pods", "kubectl"),
    ("[kworker/1:2-events]", "kernel or exited: kworker"),
])
def test_a_process_is_known_by_its_command_line(command: str, kind: str) -> None:
    assert _bench.kind_of(command) == kind


def test_cpu_counts_from_the_start_and_an_exiting_process_keeps_its_name() -> None:
    before = {(10, 1): Reading("/v/bin/nats-server -js", 5.0)}
    seen: dict = {}
    _bench.remember(seen, {(10, 1): Reading("/v/bin/nats-server -js", 6.0),
                           (20, 7): Reading("/v/bin/python -m trainyard.cli.main watcher", 1.0)})
    # Exiting: its command line is gone from /proc, its CPU still grows.
    _bench.remember(seen, {(10, 1): Reading("/v/bin/nats-server -js", 6.5),
                           (20, 7): Reading("[python]", 1.4),
                           (99, 3): Reading("/v/bin/python bench/process_cpu.py -- make test", 0.2)})
    cpu, count = _bench.totals(before, seen, skip={99})
    assert cpu == {"nats-server": pytest.approx(1.5), "trainyard watcher": pytest.approx(1.4)}
    assert count == {"nats-server": 1, "trainyard watcher": 1}
