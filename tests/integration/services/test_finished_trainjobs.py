"""A finished TrainJob stays finished (kubeflow/trainer#3779), the Status column, the opt-in TTL
after finished and v2.3.0's activeDeadlineSeconds: the four services on a devcluster whose data
plane really runs the pods."""
from __future__ import annotations

import re
import time

import pytest

from fixtures.devcluster import start_devcluster
from integration.services.conftest import (
    CTR, JOBSETS, TRAINJOBS, Api, Stack, install_crds, small_runtime, trainjob, wait_for,
)

pytestmark = pytest.mark.timeout(300)

PODS = "/api/v1/namespaces/default/pods"
TTL = "trainyard.kubeflow.org/ttl-seconds-after-finished"


@pytest.fixture(scope="module")
def running(nats_server_module, tmp_path_factory):
    cluster = start_devcluster(tmp_path_factory.mktemp("devcluster") / "data", ["--dataplane"])
    api = Api(cluster)
    stack = Stack(nats_server_module, cluster, tmp_path_factory.mktemp("services"))
    try:
        install_crds(cluster)
        quick = small_runtime("quick")
        quick["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"][0]["command"] = ["/bin/sh", "-c", "echo trained"]
        slow = small_runtime("slow")
        slow["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
            "containers"][0]["command"] = ["/bin/sh", "-c", "sleep 600"]
        api.create(CTR, quick)
        api.create(CTR, slow)
        stack.start_all()
        yield stack, api
    finally:
        stack.stop_all()
        api.close()
        cluster.stop()


def condition(obj, kind):
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c["type"] == kind and c["status"] == "True"), None)


def pods_of(api, name):
    listed = api.get(PODS + f"?labelSelector=jobset.sigs.k8s.io/jobset-name%3D{name}") or {}
    return {p["metadata"]["uid"]: p for p in listed.get("items") or []}


def plans(service, result):
    text = service.get("/metrics")[1]
    found = re.search(r'^trainyard_plans_total\{result="%s"\} ([0-9.e+]+)$' % re.escape(result), text, re.M)
    return float(found.group(1)) if found else 0.0


def columns(stack, name) -> dict[str, str]:
    """``kubectl get trainjob NAME`` as {header: cell}, cut at the header offsets (cells may be blank)."""
    header, row = stack.kubectl("get", "trainjob", name).stdout.splitlines()[:2]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    bounds = list(zip(starts, starts[1:] + [None]))
    return {header[a:b].strip(): row[a:b].strip() for a, b in bounds}


def test_a_complete_trainjob_whose_jobset_is_deleted_is_not_run_again(running):
    stack, api = running
    planner = next(s for s in stack.services if s.name == "planner")
    path = TRAINJOBS.format(ns="default") + "/once"
    api.create(TRAINJOBS.format(ns="default"), trainjob("once", runtime="quick"))
    # While it runs the Status column says so (upstream's State column is blank then).
    done = wait_for(lambda: condition(api.get(path), "Complete"), timeout=120, what="Complete")
    pods_before = pods_of(api, "once")
    assert pods_before, "the training ran in pods"
    assert api.get(path)["status"]["state"] == "Complete"
    assert {k: v for k, v in columns(stack, "once").items() if k in ("STATE", "STATUS")} == \
        {"STATE": "Complete", "STATUS": "Complete"}

    assert api.delete(JOBSETS.format(ns="default") + "/once").status_code == 200
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/once") is None, what="JobSet gone")
    finished_before = plans(planner, "finished")
    stack.kubectl("label", "trainjob", "once", "touched=yes")
    # The planner saw the change and decided the TrainJob is finished.
    wait_for(lambda: plans(planner, "finished") > finished_before, timeout=60, what="planner pass")
    time.sleep(2)  # room for a (wrong) JobSet to appear
    assert api.get(JOBSETS.format(ns="default") + "/once") is None
    assert not set(pods_of(api, "once")) - set(pods_before)
    after = api.get(path)
    assert after["metadata"]["labels"] == {"touched": "yes"}
    assert condition(after, "Complete") == done
    assert after["status"]["state"] == "Complete"


def test_status_column_shows_running_and_suspended(running):
    stack, api = running
    path = TRAINJOBS.format(ns="default") + "/longrun"
    api.create(TRAINJOBS.format(ns="default"), trainjob("longrun", runtime="slow"))
    wait_for(lambda: ((api.get(path) or {}).get("status") or {}).get("state") == "Running", what="Running")
    row = columns(stack, "longrun")
    # Upstream's State (the last condition's type) has nothing to show while it runs.
    assert (row["STATE"], row["STATUS"]) == ("", "Running")
    api.merge_patch(path, {"spec": {"suspend": True}})
    wait_for(lambda: api.get(path)["status"].get("state") == "Suspended", what="Suspended")
    row = columns(stack, "longrun")
    assert (row["STATE"], row["STATUS"]) == ("Suspended", "Suspended")
    api.delete(path)


def test_ttl_after_finished_deletes_the_trainjob_and_its_children(running):
    stack, api = running
    job = trainjob("short-lived", runtime="quick")
    job["metadata"]["annotations"] = {TTL: "3"}
    api.create(TRAINJOBS.format(ns="default"), job)
    path = TRAINJOBS.format(ns="default") + "/short-lived"
    done = wait_for(lambda: condition(api.get(path), "Complete"), timeout=120, what="Complete")
    assert api.get(path) is not None
    wait_for(lambda: api.get(path) is None, timeout=60, what="TrainJob deleted after its TTL")
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/short-lived") is None, what="JobSet collected")
    assert done["lastTransitionTime"]


def test_active_deadline_fails_the_trainjob_and_stops_its_pods(running):
    stack, api = running
    api.create(TRAINJOBS.format(ns="default"), trainjob("deadline", runtime="slow", activeDeadlineSeconds=4))
    path = TRAINJOBS.format(ns="default") + "/deadline"
    wait_for(lambda: pods_of(api, "deadline"), timeout=60, what="pods")
    failed = wait_for(lambda: condition(api.get(path), "Failed"), timeout=60, what="Failed")
    assert (failed["reason"], failed["message"]) == ("DeadlineExceeded", "TrainJob exceeded its active deadline")
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/deadline") is None, what="JobSet deleted")
    # The planner does not bring it back.
    time.sleep(2)
    assert api.get(JOBSETS.format(ns="default") + "/deadline") is None
    assert api.get(path)["status"]["state"] == "Failed"


def test_suspended_time_does_not_count_toward_the_deadline(running):
    stack, api = running
    path = TRAINJOBS.format(ns="default") + "/paused-clock"
    api.create(TRAINJOBS.format(ns="default"),
               trainjob("paused-clock", runtime="slow", suspend=True, activeDeadlineSeconds=5))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/paused-clock"), what="suspended JobSet")
    time.sleep(7)  # longer than the deadline, all of it suspended
    assert condition(api.get(path), "Failed") is None
    api.merge_patch(path, {"spec": {"suspend": False}})
    resumed = time.monotonic()
    wait_for(lambda: pods_of(api, "paused-clock"), timeout=60, what="pods after the resume")
    failed = wait_for(lambda: condition(api.get(path), "Failed"), timeout=60, what="Failed")
    # The clock restarted at the resume (upstream: from the resume's transition time).
    assert time.monotonic() - resumed >= 4.5
    assert failed["reason"] == "DeadlineExceeded"
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/paused-clock") is None, what="JobSet deleted")
