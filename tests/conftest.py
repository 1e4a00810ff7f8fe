"""Shared pytest set-up.

Fixture modules live in tests/fixtures/ (one per real component a test can start: NATS,
devcluster, the service stack); every module there is loaded as a pytest plugin.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest

pytest_plugins = sorted(
    f"fixtures.{path.stem}"
    for path in (Path(__file__).parent / "fixtures").glob("*.py")
    if not path.stem.startswith("_")
)


# -- parallel runs (make test: pytest-xdist, two processes) -------------------------------------
# xdist hands out whole groups of tests: a module's tests run in one process, so its
# module-scoped fixtures (one devcluster, one stack) start once. The data plane modules share a
# session-scoped cluster (fixtures/dataplane.py), so they form one group and it starts once; the
# modules that train with torch form one group, so two trainings never share the cores (their
# rendezvous and steps are what they test, not the machine's contention).
DATAPLANE_MODULES = "tests/integration/dataplane/"
TORCH_MARK = "pytest.mark.torch"


@functools.cache
def module_group(rootpath: Path, module: str) -> str:
    if module.startswith(DATAPLANE_MODULES):
        return "dataplane"
    source = rootpath / module
    if source.suffix == ".py" and TORCH_MARK in source.read_text(errors="replace"):
        return "torch"
    return module


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own choice
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return module_group(config.rootpath, nodeid.split("::", 1)[0])

    return ModuleGroups(config, log)


# -- where the suite's CPU goes (docs/performance.md, "The suite's CPU") -------------------------
# With TRAINYARD_TEST_CPU_REPORT=FILE each test appends one JSON line: when it began, in which
# pytest process, its wall time, the CPU of the pytest process and the CPU of the processes it
# started and reaped meanwhile (the stacks, their services and pods, kubectl: each level waits
# for its children, so their CPU rolls up). A module-scoped stack's CPU lands on the test after
# which it is stopped; the data plane's session-wide cluster on the last test of its process.
CPU_REPORT_ENV = "TRAINYARD_TEST_CPU_REPORT"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    report = os.environ.get(CPU_REPORT_ENV)
    if not report:
        yield
        return
    before, started, began_at = os.times(), time.monotonic(), time.time()
    yield
    after = os.times()
    line = {"test": item.nodeid, "began_at": round(began_at, 3),
            "worker": os.environ.get("PYTEST_XDIST_WORKER", ""), "wall_s": round(time.monotonic() - started, 3),
            "pytest_cpu_s": round(after.user - before.user + after.system - before.system, 3),
            "children_cpu_s": round(after.children_user - before.children_user
                                    + after.children_system - before.children_system, 3)}
    with open(report, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")
