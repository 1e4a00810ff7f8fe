"""The admission endpoints over real HTTP (aiohttp's test server: no TLS, no cluster)."""
from __future__ import annotations

import asyncio
import json as jsonlib
from typing import Any

import pytest
from aiohttp.test_utils import TestClient as AioClient
from aiohttp.test_utils import TestServer

from trainyard_services.planner.webhook import WEBHOOKS, build_app


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status_code, self.body = status, body

    def json(self) -> Any:
        return jsonlib.loads(self.body)


class TestClient:
    """Posts to the app over HTTP from plain test functions (the server runs on a loop of its own)."""

    __test__ = False

    def __init__(self, app) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = AioClient(TestServer(app), loop=self._loop)
        self._loop.run_until_complete(self._client.start_server())

    def post(self, path: str, *, json: Any = None, content: str | bytes | None = None) -> Answer:
        async def send() -> Answer:
            data = jsonlib.dumps(json) if content is None else content
            async with self._client.post(path, data=data, headers={"Content-Type": "application/json"}) as answer:
                return Answer(answer.status, await answer.read())
        return self._loop.run_until_complete(send())

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()

    def __enter__(self) -> "TestClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed"},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                 "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                 "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}}}]}}},
}


def review(obj, operation="CREATE", old=None):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "req-1", "operation": operation, "object": obj, "oldObject": old}}


def trainjob(**trainer):
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "job", "namespace": "ns"},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer}}


@pytest.fixture
def client():
    async def observed(_, **__):
        return [RUNTIME]

    client = TestClient(build_app(observed))
    yield client
    client.close()


def test_valid_trainjob_is_allowed(client):
    response = client.post(WEBHOOKS[2][1], json=review(trainjob(numNodes=2)))
    assert response.status_code == 200
    assert response.json() == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": {"uid": "req-1", "allowed": True}}


def test_denial_carries_upstreams_message_and_403(client):
    body = client.post(WEBHOOKS[2][1], json=review(trainjob(
        numProcPerNode=2, env=[{"name": "PET_NNODES", "value": "1"}]))).json()["response"]
    assert body["allowed"] is False
    assert body["status"]["code"] == 403 and body["status"]["reason"] == "Forbidden"
    assert body["status"]["message"].startswith("spec.trainer.env: Invalid value: ")
    assert body["status"]["message"].endswith(
        "must not have reserved envs, invalid envs configured: [PET_NNODES]")


def test_unsupported_runtime_kind_is_a_plain_message(client):
    job = trainjob()
    job["spec"]["runtimeRef"].update(kind="Foo", apiGroup="trainer.kubeflow.org")
    status = client.post(WEBHOOKS[2][1], json=review(job)).json()["response"]["status"]
    assert status["message"] == "unsupported runtime: Foo.trainer.kubeflow.org"


def test_runtime_webhooks_answer(client):
    allowed = client.post(WEBHOOKS[0][1], json=review(RUNTIME)).json()["response"]
    assert allowed["allowed"] is True
    deprecated = dict(RUNTIME, metadata={"name": "old", "labels": {"trainer.kubeflow.org/support": "deprecated"}})
    warned = client.post(WEBHOOKS[0][1], json=review(deprecated)).json()["response"]
    assert warned["allowed"] is True
    assert warned["warnings"][0].startswith('ClusterTrainingRuntime "old" is deprecated')


@pytest.mark.parametrize("body,detail", [
    ("not json", "request body: not JSON"),
    ({"kind": "AdmissionReview"}, "request: missing AdmissionReview.request"),
    ({"request": {"uid": "x"}}, "request.object: missing"),
])
def test_malformed_reviews_get_a_clear_400(client, body, detail):
    response = client.post(WEBHOOKS[2][1], content=body) if isinstance(body, str) else \
        client.post(WEBHOOKS[2][1], json=body)
    assert response.status_code == 400
    assert response.json() == {"error": detail}


ELASTIC_RUNTIME = {
    **RUNTIME, "metadata": {"name": "torch-elastic"},
    "spec": {**RUNTIME["spec"], "mlPolicy": {"torch": {"elasticPolicy": {"minNodes": 1, "maxNodes": 3}}}},
}


def scale_review(replicas, old_replicas=2):
    def scale(n):
        return {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": {"name": "job", "namespace": "ns"},
                "spec": {"replicas": n}}
    body = review(scale(replicas), "UPDATE", scale(old_replicas))
    body["request"].update(subResource="scale", name="job", namespace="ns",
                           kind={"group": "autoscaling", "version": "v1", "kind": "Scale"})
    return body


def scale_client(runtime):
    job = trainjob(numNodes=2)
    job["spec"]["runtimeRef"]["name"] = runtime["metadata"]["name"]

    async def observed(_, **__):
        return [runtime]

    async def trainjob_for(namespace, name):
        return job if (namespace, name) == ("ns", "job") else None

    return TestClient(build_app(observed, trainjob_for))


@pytest.mark.parametrize("runtime, replicas, message", [
    (ELASTIC_RUNTIME, 3, None),
    (ELASTIC_RUNTIME, 1, None),
    (ELASTIC_RUNTIME, 4, "spec.trainer.numNodes: Invalid value: 4: must be between minNodes (1) and maxNodes (3) "
                         "of the runtime's torch elasticPolicy"),
    (ELASTIC_RUNTIME, 0, "spec.trainer.numNodes: Invalid value: 0: must be between minNodes (1) and maxNodes (3) "
                         "of the runtime's torch elasticPolicy"),
    (RUNTIME, 3, "spec.trainer.numNodes: Forbidden: only an elastic TrainJob can be scaled: the runtime "
                 "torch-distributed has no torch elasticPolicy"),
])
def test_scale_subresource_requests_are_checked_against_the_bounds(runtime, replicas, message):
    with scale_client(runtime) as client:
        body = client.post(WEBHOOKS[2][1], json=scale_review(replicas)).json()["response"]
    assert body["allowed"] is (message is None)
    if message is not None:
        assert body["status"]["code"] == 403
        assert body["status"]["message"] == message


def test_webhook_configuration_matches_trainjob_scale():
    from trainyard_services.planner.webhook import webhook_configuration

    rules = {w["name"]: w["rules"][0]["resources"] for w in
             webhook_configuration(b"CA", url_base="https://x", service=None)["webhooks"]}
    assert rules["validator.trainjob.trainer.kubeflow.org"] == ["trainjobs", "trainjobs/scale"]
    assert rules["validator.trainingruntime.trainer.kubeflow.org"] == ["trainingruntimes"]


def suspended() -> dict:
    job = trainjob(numNodes=2)
    job["spec"]["suspend"] = True
    return job


def changed_overrides() -> dict:
    job = suspended()
    job["spec"]["podTemplateOverrides"] = [{"targetJobs": [{"name": "node"}], "spec": {"nodeSelector": {"a": "b"}}}]
    return job


def test_only_an_update_reads_the_existing_jobset_and_its_active_jobs_still_refuse_overrides():
    """A create's admission skips the JobSet read (no create rule reads it); an update reads it,
    and a suspended TrainJob whose JobSet still has active Jobs cannot change its overrides."""
    asked: list[bool] = []
    running = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "job", "namespace": "ns"},
              "status": {"replicatedJobsStatus": [{"name": "node", "active": 1}]}}

    async def observed(_, *, jobset: bool = True):
        asked.append(jobset)
        return [RUNTIME, running] if jobset else [RUNTIME]

    with TestClient(build_app(observed)) as client:
        first = client.post(WEBHOOKS[2][1], json=review(trainjob(numNodes=2))).json()["response"]
        answer = client.post(WEBHOOKS[2][1], json=review(changed_overrides(), "UPDATE", suspended())).json()["response"]
    assert first["allowed"]
    assert asked == [False, True]
    assert not answer["allowed"]
    assert "PodTemplateOverrides cannot be modified when the JobSet's ReplicatedJob node is still active" \
        in answer["status"]["message"]


# --- v2.3.0's TrainJob defaulter: runtimePatches[].time (upstream's TestDefault cases) ------

def patched(*patches):
    job = trainjob()
    job["spec"]["runtimePatches"] = [dict(p) for p in patches]
    return job


def one(time=None, pod=None):
    patch = {"manager": "acme.io/one"}
    if pod is not None:
        patch["trainingRuntimeSpec"] = {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": {"spec": pod}}}}]}}}
    if time is not None:
        patch["time"] = time
    return patch


OLD = "2025-01-01T00:00:00Z"


def stamped(client, new, operation="CREATE", old=None):
    """The TrainJob after the answer's JSON Patch, and the time the request was made."""
    import base64
    import json
    from datetime import datetime, timezone

    from trainyard.apimachinery.json_patch import apply_json_patch

    before = datetime.now(timezone.utc).replace(microsecond=0)
    answer = client.post("/mutate-trainer-kubeflow-org-v1alpha1-trainjob", json=review(new, operation, old))
    assert answer.status_code == 200 and answer.json()["response"]["allowed"] is True
    response = answer.json()["response"]
    if "patch" not in response:
        return new, before
    assert response["patchType"] == "JSONPatch"
    return apply_json_patch(new, json.loads(base64.b64decode(response["patch"]))), before


def times(job):
    return [p.get("time") for p in job["spec"]["runtimePatches"]]


def is_now(value, before):
    from datetime import datetime, timedelta, timezone

    moment = datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    return before <= moment <= datetime.now(timezone.utc) + timedelta(seconds=1)


def test_create_stamps_every_patch(client):
    job, before = stamped(client, patched({"manager": "acme.io/one"}, {"manager": "acme.io/two"}))
    assert all(is_now(t, before) for t in times(job))


def test_create_keeps_a_time_the_client_set(client):
    job, before = stamped(client, patched(one(time=OLD), {"manager": "acme.io/two"}))
    assert times(job)[0] == OLD and is_now(times(job)[1], before)


@pytest.mark.parametrize("old_patch, new_patch, kept", [
    pytest.param(one(OLD, {"nodeSelector": {"a": "b"}}), one(None, {"nodeSelector": {"a": "b"}}), True,
                 id="unchanged-time-preserved"),
    pytest.param(one(OLD, {"nodeSelector": {"a": "b"}}), one(None, {"nodeSelector": {"a": "c"}}), False,
                 id="changed-time-updated"),
    pytest.param(one(OLD, {"nodeSelector": {"a": "b"}}), one(OLD, {"nodeSelector": {"a": "c"}}), False,
                 id="changed-with-pre-existing-time-updated"),
])
def test_update_keeps_the_time_of_an_unchanged_patch(client, old_patch, new_patch, kept):
    job, before = stamped(client, patched(new_patch), "UPDATE", patched(old_patch))
    assert times(job)[0] == OLD if kept else is_now(times(job)[0], before)


@pytest.mark.parametrize("new_time, expect_old", [
    pytest.param(None, False, id="new-patch-stamped"),
    pytest.param(OLD, True, id="new-patch-with-externally-set-time-preserved"),
])
def test_update_with_a_new_patch_beside_an_unchanged_one(client, new_time, expect_old):
    old = patched({"manager": "acme.io/existing", "time": OLD})
    added = {"manager": "acme.io/new", **({"time": new_time} if new_time else {})}
    job, before = stamped(client, patched({"manager": "acme.io/existing"}, added), "UPDATE", old)
    assert times(job)[0] == OLD
    assert times(job)[1] == OLD if expect_old else is_now(times(job)[1], before)


def test_without_patches_nothing_changes_and_v2_1_never_stamps(client):
    from trainyard.compat import TrainerCompat

    job, _ = stamped(client, trainjob())
    assert "runtimePatches" not in job["spec"]

    async def observed(_, **__):
        return [RUNTIME]

    with TestClient(build_app(observed, compat=TrainerCompat.V2_1)) as v21:
        job, _ = stamped(v21, patched({"manager": "acme.io/one"}))
    assert times(job) == [None]
