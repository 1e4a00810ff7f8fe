"""Health, readiness, metrics and graceful shutdown of the four service processes."""
from __future__ import annotations

import json

import pytest

from integration.services.conftest import CTR, JOBSETS, TRAINJOBS, small_runtime, trainjob, wait_for

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def running(stack, api):
    services = stack.start_all()
    api.create(CTR, small_runtime())
    return services


def test_health_readiness_and_metrics(stack, api, running):
    api.create(TRAINJOBS.format(ns="default"), trainjob("observed"))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/observed"), what="JobSet")
    for name, service in running.items():
        assert service.get("/healthz") == (200, "ok\n")
        assert service.get("/readyz")[0] == 200
    metrics = {name: service.get("/metrics")[1] for name, service in running.items()}
    assert 'trainyard_watch_events_total{kind="TrainJob",type="ADDED"}' in metrics["watcher"]
    assert 'trainyard_plans_total{result="published"}' in metrics["planner"]
    assert 'trainyard_applies_total{outcome="applied"}' in metrics["applier"]
    assert "controller_runtime_reconcile_total" in metrics["status"]
    assert "workqueue_queue_duration_seconds_bucket" in metrics["applier"]
    # Losing NATS makes every service unready (and ready again once it is back).
    stack.nats.stop()
    wait_for(lambda: all(s.get("/readyz")[0] == 503 for s in running.values()), what="unready")
    assert "not ready: nats" in running["planner"].get("/readyz")[1]
    stack.nats.start()
    wait_for(lambda: all(s.get("/readyz")[0] == 200 for s in running.values()), what="ready again")


    # SIGTERM: each service finishes, logs "stopped" and exits 0.
    for service in running.values():
        assert service.stop() == 0
    logs = [json.loads(line) for line in running["applier"].log_path.read_text().splitlines()
            if line.startswith("{")]
    assert logs[-1]["msg"] == "stopped" and logs[-1]["service"] == "applier"
