"""The queries of deploy/autoscaling's ScaledObjects, run as KEDA runs them, on a real Prometheus
(Debian's package) scraping a running `trainyard up` (docs/deploy.md, "Sizing and autoscaling").

Each ScaledObject's own query string is read from deploy/ (its serverAddress swapped for this
test's Prometheus). With the stack idle each returns exactly one series (KEDA's prometheus
scaler refuses more than one). Then the applier is stopped (SIGSTOP: no replica works, and
its own /metrics goes silent, as a role scaled to zero exports nothing), TrainJobs are created,
and the applier's query reaches at least their count, from the watcher's export; once the
applier runs again it falls back to zero.
"""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from fixtures.prometheus import Prometheus, scrape_config, skip_unless_prometheus
from fixtures.stack import REPO, RunningStack, skip_unless_stack_available, start_stack
from fixtures.waiting import wait_for as poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCALED_OBJECTS = REPO / "deploy" / "autoscaling" / "scaledobjects.yaml"
SERVICES = ("watcher", "planner", "planner-2", "applier", "status")
WAITING = 8  # TrainJobs created while the applier is stopped
STOPPED = "applier"


def queries() -> dict[str, str]:
    """role -> the query of its ScaledObject, exactly as deploy/ ships it."""
    out = {}
    for doc in yaml.safe_load_all(SCALED_OBJECTS.read_text()):
        (trigger,) = doc["spec"]["triggers"]
        assert trigger["type"] == "prometheus" and trigger["metadata"]["serverAddress"].startswith("http")
        out[doc["metadata"]["labels"]["app.kubernetes.io/component"]] = trigger["metadata"]["query"]
    return out


def series(prometheus: Prometheus, query: str) -> list[dict[str, Any]]:
    answer = prometheus.query(query)
    assert answer.get("status") == "success", (query, answer)
    return answer["data"]["result"]


def wait_until(what: str, check, timeout: float) -> Any:
    return poll(check, timeout=timeout, interval=0.5, what=what)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningStack, Prometheus]]:
    skip_unless_stack_available()
    skip_unless_prometheus()
    workdir = tmp_path_factory.mktemp("autoscaling")
    stack = prometheus = None
    try:
        stack = start_stack(workdir / "data", "--skip", "dashboard")
        assert set(SERVICES) <= set(stack.state["ports"]), stack.state["ports"]
        prometheus = Prometheus(workdir / "prometheus", scrape_config(stack, SERVICES))
        prometheus.start()
        yield stack, prometheus
    finally:
        if prometheus is not None:
            prometheus.stop()
        if stack is not None:
            stack.stop()
            stack.kill()


def test_each_roles_query_sees_the_backlog_of_a_stopped_role(running: tuple[RunningStack, Prometheus]) -> None:
    stack, prometheus = running
    by_role = queries()
    assert set(by_role) == {"planner", "applier", "status"}
    # Idle: one series per role (the watcher's, whatever the roles' own replicas export).
    wait_until("one series per role's query", lambda: all(len(series(prometheus, q)) == 1 for q in by_role.values()),
               timeout=60)

    pid = json.loads((stack.data_dir / "stack.json").read_text())["children"][STOPPED]["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        # The stopped role serves no /metrics of its own any more.
        wait_until(f"{STOPPED}'s scrape to fail", lambda: series(prometheus, f'up{{job="{STOPPED}"}} == 0'), timeout=30)
        trainjobs = [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                      "metadata": {"name": f"waiting-{i}", "namespace": "default"},
                      "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True}}
                     for i in range(WAITING)]
        stack.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(trainjobs))

        def backlog() -> float | None:
            found = series(prometheus, by_role[STOPPED])
            assert len(found) == 1, found
            value = float(found[0]["value"][1])
            return value if value >= WAITING else None

        value = wait_until(f"{STOPPED}'s query to reach {WAITING}", backlog, timeout=60)
        assert value >= WAITING
        for role, query in by_role.items():
            assert len(series(prometheus, query)) == 1, (role, series(prometheus, query))
    finally:
        os.kill(pid, signal.SIGCONT)
    # Running again, the applier works the backlog off: the figure a scaler scales down on.
    wait_until(f"{STOPPED}'s backlog to drain",
               lambda: [s for s in series(prometheus, by_role[STOPPED]) if float(s["value"][1]) == 0], timeout=90)
