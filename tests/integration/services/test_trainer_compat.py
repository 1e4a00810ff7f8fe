"""The two compatibility levels through the real services (real nats-server, real devcluster):
v2.1.0 behaviour under ``--trainer-compat v2.1`` (docs/compatibility.md)."""
from __future__ import annotations

import re
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


def node_command(jobset: dict | None) -> list[str] | None:
    if not jobset:
        return None
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return pod["containers"][0].get("command")


@pytest.mark.parametrize("level, resumed_with", [
    pytest.param("v2.3", "echo v1", id="v2.3-snapshot-keeps-the-runtime-as-first-planned"),
    pytest.param("v2.1", "echo v2", id="v2.1-reads-the-runtime-live"),
])
def test_a_runtime_edit_and_a_trainjob_that_already_uses_it(stack, api, level, resumed_with):
    """A TrainJob planned before its runtime is edited: at v2.3 its JobSet keeps the runtime as
    first planned (the snapshot ConfigMap), even when the JobSet is applied again on resume; a
    TrainJob created after the edit gets it. v2.1.0 re-reads the runtime on every reconcile.
    The TrainJob created after carries a runtime patch, which v2.3.0's defaulter stamps."""
    start_at(stack, level)
    runtime = small_runtime("editable")
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["command"] = ["/bin/sh", "-c", "echo v1"]
    api.create(CTR, runtime)
    api.create(TRAINJOBS.format(ns="default"), trainjob("before", runtime="editable", suspend=True))
    jobset = wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/before"), what="JobSet of 'before'")
    assert node_command(jobset) == ["/bin/sh", "-c", "echo v1"] and jobset["spec"]["suspend"] is True
    snapshot_path = "/api/v1/namespaces/default/configmaps/before-runtime-snapshot"
    if level == "v2.3":
        snapshot = wait_for(lambda: api.get(snapshot_path), what="runtime snapshot")
        owner = snapshot["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", "before", True)
        assert "echo v1" in snapshot["data"]["runtime"]

    edited = runtime["spec"]["template"]
    edited["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"] = \
        ["/bin/sh", "-c", "echo v2"]
    api.merge_patch(CTR + "/editable", {"spec": {"template": edited}})
    # A TrainJob created after the edit gets it (so the planner has seen the edit).
    patch = {"manager": "kueue.x-k8s.io/manager",
             "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"team": "a"}}}}}
    api.create(TRAINJOBS.format(ns="default"), trainjob("after", runtime="editable", suspend=True,
                                                        runtimePatches=[patch]))
    wait_for(lambda: node_command(api.get(JOBSETS.format(ns="default") + "/after")) == ["/bin/sh", "-c", "echo v2"],
             what="JobSet of 'after' with the edit")
    # v2.3.0's mutating webhook stamped the patch (B3); v2.1.0 has none.
    (stored,) = api.get(TRAINJOBS.format(ns="default") + "/after")["spec"]["runtimePatches"]
    if level == "v2.3":
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stored["time"])
    else:
        assert "time" not in stored

    # Resuming applies the JobSet of 'before' again, planned from the runtime of its level.
    api.merge_patch(TRAINJOBS.format(ns="default") + "/before", {"spec": {"suspend": False}})
    resumed = wait_for(lambda: (lambda j: j if j and j["spec"]["suspend"] is False else None)(
        api.get(JOBSETS.format(ns="default") + "/before")), what="resumed JobSet of 'before'")
    assert node_command(resumed) == ["/bin/sh", "-c", resumed_with]
    if level == "v2.1":
        assert api.get(snapshot_path) is None


MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/defaulter.trainer.kubeflow.org"


def test_a_planner_switched_back_to_v2_1_removes_the_defaulter_webhook(stack, api):
    """v2.3 registers the TrainJob defaulter; a planner restarted at v2.1 (which has none)
    removes it, so the cluster looks like v2.1.0 and no stale registration (old address, old CA,
    failurePolicy Fail) is left to reject TrainJob writes."""
    planner = stack.start_service("planner", "--trainer-compat", "v2.3")
    wait_for(lambda: api.get(MUTATING), what="the v2.3 defaulter configuration")
    planner.stop()
    stack.start_service("planner", "--trainer-compat", "v2.1")
    wait_for(lambda: api.get(MUTATING) is None, what="the defaulter configuration removed at v2.1")
    api.create(CTR, small_runtime("plain"))
    api.create(TRAINJOBS.format(ns="default"), trainjob("after-switch", runtime="plain", suspend=True))
    assert "runtimePatches" not in api.get(TRAINJOBS.format(ns="default") + "/after-switch")["spec"]
