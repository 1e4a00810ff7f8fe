"""TrainJob lifecycle through the four services (real nats-server, real devcluster)."""
from __future__ import annotations

import json
import time

import pytest

from integration.services.conftest import (
    CTR, JOBSETS, TRAINJOBS, bus_call, small_runtime, stream_messages, trainjob, wait_for,
)

pytestmark = pytest.mark.timeout(180)


def condition(obj, kind):
    return next((c for c in (obj or {}).get("status", {}).get("conditions", []) if c["type"] == kind), None)


@pytest.fixture(scope="module")
def running(shared_stack, shared_api):
    shared_api.create(CTR, small_runtime())
    return {s.name: s for s in shared_stack.services}


@pytest.fixture
def stack(shared_stack):
    return shared_stack


@pytest.fixture
def api(shared_api):
    return shared_api


def test_invalid_trainjob_is_rejected_by_the_webhook_through_kubectl(stack, api, running):
    manifest = json.dumps(trainjob("bad-env", runtime="torch-distributed", trainer={
        "numProcPerNode": 2, "env": [{"name": "PET_NNODES", "value": "3"},
                                     {"name": "PET_MASTER_PORT", "value": "1"}]}))
    result = stack.kubectl("apply", "-f", "-", input=manifest, check=False)
    assert result.returncode == 1
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: ' \
        "spec.trainer.env: Invalid value: " in result.stderr
    assert "must not have reserved envs, invalid envs configured: [PET_MASTER_PORT PET_NNODES]" in result.stderr
    missing = json.dumps(trainjob("no-runtime", runtime="absent"))
    result = stack.kubectl("apply", "-f", "-", input=missing, check=False)
    assert 'spec.RuntimeRef: Invalid value: ' in result.stderr
    assert 'clustertrainingruntimes.trainer.kubeflow.org "absent" not found: specified ' \
        "clusterTrainingRuntime must be created before the TrainJob is created" in result.stderr
    assert api.get(TRAINJOBS.format(ns="default") + "/bad-env") is None


def test_create_and_complete(stack, api, running):
    api.create(TRAINJOBS.format(ns="default"), trainjob("mnist-v1", trainer={"numNodes": 2}))
    jobset = wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/mnist-v1"), what="JobSet")
    tj = api.get(TRAINJOBS.format(ns="default") + "/mnist-v1")
    owner = jobset["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
        ("TrainJob", "mnist-v1", tj["metadata"]["uid"], True)
    assert [m["manager"] for m in jobset["metadata"]["managedFields"]] == ["trainer"]
    assert jobset["spec"]["suspend"] is False
    node = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert node["parallelism"] == 2

    # The JobSet finishes: the TrainJob gets upstream's Complete condition, copied from it.
    api.merge_patch(JOBSETS.format(ns="default") + "/mnist-v1", {"status": {
        "conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "replicatedJobsStatus": [{"name": "node", "ready": 0, "succeeded": 1, "failed": 0,
                                  "active": 0, "suspended": 0}],
    }}, status=True)
    done = wait_for(lambda: condition(api.get(TRAINJOBS.format(ns="default") + "/mnist-v1"), "Complete"),
                    what="Complete condition")
    assert (done["status"], done["reason"], done["message"], done["lastTransitionTime"]) == \
        ("True", "AllJobsCompleted", "jobset completed successfully", "2026-01-01T00:00:00Z")
    status = api.get(TRAINJOBS.format(ns="default") + "/mnist-v1")["status"]
    assert status["jobsStatus"] == [{"name": "node", "ready": 0, "succeeded": 1, "failed": 0,
                                     "active": 0, "suspended": 0}]
    assert [c["type"] for c in status["conditions"]] == ["Complete"]
    printed = stack.kubectl("get", "trainjob", "mnist-v1", "-n", "default").stdout
    assert "Complete" in printed


def test_suspend_change_resume_lands_the_new_spec(stack, api, running):
    # v2.3.0 makes spec.trainer immutable (docs/compatibility.md A8): a suspended TrainJob is
    # changed through its runtime patches, as Kueue does.
    def patches(pool):
        return [{"manager": "example.com/scheduler", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": {"nodeSelector": {"pool": pool}}}}}}]}}}}]

    path = TRAINJOBS.format(ns="default") + "/paused"
    api.create(TRAINJOBS.format(ns="default"), trainjob("paused", suspend=True, runtimePatches=patches("a")))
    jobset_path = JOBSETS.format(ns="default") + "/paused"
    jobset = wait_for(lambda: api.get(jobset_path), what="suspended JobSet")
    assert jobset["spec"]["suspend"] is True
    suspended = wait_for(lambda: condition(api.get(path), "Suspended"), what="Suspended condition")
    assert (suspended["status"], suspended["reason"], suspended["message"]) == \
        ("True", "Suspended", "TrainJob is suspended")

    def pool(js):
        return js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]["pool"]

    # Change while suspended: the JobSet follows.
    api.merge_patch(path, {"spec": {"runtimePatches": patches("b")}})
    wait_for(lambda: pool(api.get(jobset_path)) == "b", what="JobSet pool b")
    # Change and resume in one update: the new spec lands and the JobSet runs.
    api.merge_patch(path, {"spec": {"suspend": False, "runtimePatches": patches("c")}})
    resumed = wait_for(lambda: (lambda js: js if js["spec"]["suspend"] is False else None)(api.get(jobset_path)),
                       what="resumed JobSet")
    assert pool(resumed) == "c"
    # Not suspended any more: the Suspended condition is dropped (docs/compatibility.md #11).
    wait_for(lambda: condition(api.get(path), "Suspended") is None, what="Suspended condition dropped")
    # Running: a spec change is not applied (upstream never modifies a running JobSet).
    api.merge_patch(path, {"spec": {"labels": {"late": "yes"}}})
    time.sleep(1.5)
    assert "late" not in (api.get(jobset_path)["metadata"].get("labels") or {})


def test_printed_state_is_right_after_resume(stack, api, running):
    """kubeflow/trainer#3666: `kubectl get trainjob` must not say Suspended once resumed."""
    path = TRAINJOBS.format(ns="default") + "/printed"
    api.create(TRAINJOBS.format(ns="default"), trainjob("printed", suspend=True))
    wait_for(lambda: condition(api.get(path), "Suspended"), what="Suspended condition")
    api.merge_patch(path, {"spec": {"suspend": False}})
    wait_for(lambda: condition(api.get(path), "Suspended") is None, what="resumed")
    printed = stack.kubectl("get", "trainjob", "printed", "-n", "default").stdout
    assert "Suspended" not in printed.splitlines()[1].split()[1:2]


def test_missing_runtime_becomes_a_condition_and_recovers(stack, api, running):
    # A TrainJob that slipped past admission (webhook configuration removed for the moment;
    # the planner puts it back at its next certificate check).
    api.delete("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
               "validator.trainer.kubeflow.org")
    path = TRAINJOBS.format(ns="default") + "/orphan"
    api.create(TRAINJOBS.format(ns="default"), trainjob("orphan", runtime="not.there"))
    failed = wait_for(lambda: condition(api.get(path), "Failed"), what="Failed condition")
    assert failed["status"] == "True"
    assert failed["reason"] == "TrainJobResourcesCreationFailed"
    assert 'clustertrainingruntimes.trainer.kubeflow.org "not.there" not found' in failed["message"]
    events = wait_for(lambda: [e for e in api.get("/api/v1/namespaces/default/events")["items"]
                               if e["reason"] == "TrainJobResourcesCreationFailed"], what="event")
    assert events[0]["type"] == "Warning"
    assert events[0]["involvedObject"]["name"] == "orphan"
    assert events[0]["message"].startswith("TrainJob resources reconciliation failed: ")
    # The runtime appears: the TrainJob is planned and the Failed condition goes away.
    api.create(CTR, small_runtime("not.there"))  # a dotted name travels safely on the bus
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/orphan"), what="JobSet after runtime appeared")
    wait_for(lambda: condition(api.get(path), "Failed") is None, what="Failed removed")


def test_trainjob_managed_by_multikueue_is_left_alone(stack, api, running):
    api.create(TRAINJOBS.format(ns="default"),
               trainjob("remote", managedBy="kueue.x-k8s.io/multikueue"))
    api.create(TRAINJOBS.format(ns="default"), trainjob("local"))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/local"), what="local JobSet")
    time.sleep(1.0)
    assert api.get(JOBSETS.format(ns="default") + "/remote") is None
    assert "status" not in api.get(TRAINJOBS.format(ns="default") + "/remote") or \
        not api.get(TRAINJOBS.format(ns="default") + "/remote")["status"]


def test_delete_cascades_and_the_runtime_is_not_held(stack, api, running):
    """v2.3.0: the runtime carries no in-use finalizer (one left by v2.1.0 behaviour is removed),
    so deleting it is immediate; the TrainJob keeps its JobSet (planned from its runtime snapshot)."""
    runtime = small_runtime("short-lived")
    runtime["metadata"]["finalizers"] = ["trainer.kubeflow.org/resource-in-use"]
    api.create(CTR, runtime)
    wait_for(lambda: not (api.get(CTR + "/short-lived")["metadata"].get("finalizers") or []),
             what="leftover finalizer removed")
    api.create(TRAINJOBS.format(ns="default"), trainjob("cascade", runtime="short-lived"))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/cascade"), what="JobSet")
    api.delete(CTR + "/short-lived")
    wait_for(lambda: api.get(CTR + "/short-lived") is None, what="runtime deleted at once")
    assert api.get(JOBSETS.format(ns="default") + "/cascade") is not None
    api.delete(TRAINJOBS.format(ns="default") + "/cascade")
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/cascade") is None, what="JobSet collected")

    async def applied_entry(session):
        from trainyard.bus.kv import applied_key

        return (await session.applied.read(applied_key("default", "default", "cascade"))).value

    wait_for(lambda: bus_call(stack.nats.url, applied_entry) is None, what="applied-plan entry forgotten")


def test_poison_messages_go_to_the_dead_letter_and_consuming_goes_on(stack, api, running):
    from trainyard.bus.envelopes import DeadLetter, decode

    from trainyard.bus.subjects import trainjob_partition
    from trainyard.bus.topology import partition_durable

    home = trainjob_partition("default", "poison")  # where the TrainJob default/poison would be

    async def publish_garbage(session):
        await session.js.publish(f"ty.events.default.p{home}.TrainJob.default.poison", b"{not json")
        await session.js.publish(f"ty.desired.default.p{home}.TrainJob.default.poison", b'{"v":1}')

    bus_call(stack.nats.url, publish_garbage)
    letters = wait_for(lambda: (lambda msgs: msgs if len(msgs) >= 3 else None)(
        stream_messages(stack.nats.url, "TY_DEAD_LETTER")), what="dead letters")
    by_consumer = {}
    for msg in letters:
        letter = decode(DeadLetter, msg.data)
        by_consumer[letter.consumer] = letter
    planner, status, applier = (partition_durable(role, "default", home) for role in ("planner", "status", "applier"))
    assert set(by_consumer) == {planner, status, applier}
    assert by_consumer[planner].subject == f"ty.events.default.p{home}.TrainJob.default.poison"
    assert by_consumer[planner].error.startswith("invalid ObjectEvent")
    assert by_consumer[applier].error.startswith("invalid PlanMessage: ")
    # The services keep consuming.
    api.create(TRAINJOBS.format(ns="default"), trainjob("after-poison"))
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/after-poison"), what="JobSet after poison")


def test_health_readiness_metrics_and_graceful_shutdown(stack, api, running):
    """Last in this module: it stops NATS and then every service."""
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
