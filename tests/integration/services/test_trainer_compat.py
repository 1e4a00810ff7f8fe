"""The two compatibility levels through the real services (real nats-server, real devcluster):
v2.1.0 behaviour under ``--trainer-compat v2.1`` (docs/compatibility.md)."""
from __future__ import annotations

import time

import pytest

from integration.services.conftest import CTR, JOBSETS, TRAINJOBS, small_runtime, trainjob, wait_for

pytestmark = pytest.mark.timeout(240)
FINALIZER = "trainer.kubeflow.org/resource-in-use"


def start_at(stack, level: str) -> None:
    v21 = ["--trainer-compat", level]
    stack.start_services([("watcher", []), ("planner", v21), ("applier", []), ("status", v21)])


def test_v2_1_keeps_the_runtime_in_use_finalizer(stack, api):
    start_at(stack, "v2.1")
    api.create(CTR, small_runtime("held"))
    api.create(TRAINJOBS.format(ns="default"), trainjob("held-job", runtime="held"))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/held-job"), what="JobSet")
    wait_for(lambda: FINALIZER in (api.get(CTR + "/held")["metadata"].get("finalizers") or []), what="finalizer")
    # Deleting a runtime in use only marks it; it goes once its last TrainJob is gone.
    api.delete(CTR + "/held")
    time.sleep(0.5)
    assert api.get(CTR + "/held")["metadata"].get("deletionTimestamp")
    api.delete(TRAINJOBS.format(ns="default") + "/held-job")
    wait_for(lambda: api.get(CTR + "/held") is None, what="runtime released and deleted")
