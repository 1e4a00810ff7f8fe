"""The trainer status endpoint against a real devcluster: a projected-style token made by
``kubectl create token`` for the TrainJob's status audience, verified through the cluster
issuer's OIDC discovery and JWKS; the report lands in ``status.trainerStatus`` by server-side
apply, and the Kubeflow SDK 0.5.0's own ``update_trainjob_status`` is a client of it."""
from __future__ import annotations

import asyncio
import json
import os
import re
import ssl
from pathlib import Path

import httpx
import pytest

from integration.apiserver._manifests import install_trainer_crds, trainjob
from trainyard.kube.client import KubeClient
from trainyard.pipeline.trainer_status import status_path, token_audience
from trainyard.security import pki
from trainyard_services.status.progress import serve

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    install_trainer_crds(devcluster_module)
    devcluster_module.kubectl("apply", "-f", "-", input=trainjob("mnist", 1))
    return devcluster_module


def token_for(cluster, name: str) -> str:
    return cluster.kubectl("create", "token", "default", "--audience", token_audience("default", name)).stdout.strip()


@pytest.fixture
async def endpoint(cluster, tmp_path: Path):
    pki.save_bundle(tmp_path, pki.issue(["127.0.0.1"], ca_common_name="status-endpoint-test"))
    client = await KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    runner = await serve(client, "127.0.0.1", 0, str(tmp_path))  # as the status service does
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}", tmp_path / "ca.crt"
    finally:
        await runner.cleanup()
        await client.close()


async def post(endpoint, name: str, body: bytes | dict, token: str | None) -> httpx.Response:
    url, ca = endpoint
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(ca)), timeout=10) as http:
        return await http.post(url + status_path("default", name), content=content,
                                headers={**headers, "Content-Type": "application/json"})


def trainer_status(cluster, name: str = "mnist") -> dict:
    return json.loads(cluster.kubectl("get", "trainjob", name, "-o", "json").stdout)["status"].get("trainerStatus", {})


async def test_a_report_with_the_trainjobs_token_is_written_to_its_status(cluster, endpoint) -> None:
    report = {"trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 30,
                                "metrics": [{"name": "loss", "value": "0.25"}],
                                "lastUpdatedTime": "2026-11-25T02:21:00.123456+00:00"}}
    answer = await post(endpoint, "mnist", report, token_for(cluster, "mnist"))
    assert (answer.status_code, answer.json()) == (200, report)
    assert trainer_status(cluster) == {"progressPercentage": 40, "estimatedRemainingSeconds": 30,
                                       "metrics": [{"name": "loss", "value": "0.25"}],
                                       "lastUpdatedTime": "2026-11-25T02:21:00Z"}
    managers = json.loads(cluster.kubectl("get", "trainjob", "mnist", "-o", "json", "--show-managed-fields").stdout)
    assert any(m["manager"] == "trainer-status" and m.get("subresource") == "status"
               for m in managers["metadata"]["managedFields"])


@pytest.mark.parametrize("case", ["other-trainjobs-token", "no-token", "garbage-token"])
async def test_reports_without_the_trainjobs_token_are_forbidden(cluster, endpoint, case: str) -> None:
    token = {"other-trainjobs-token": token_for(cluster, "other"), "no-token": None, "garbage-token": "a.b.c"}[case]
    answer = await post(endpoint, "mnist", {"trainerStatus": {"progressPercentage": 1,
                                                              "lastUpdatedTime": "2026-11-25T02:21:00Z"}}, token)
    assert answer.status_code == 403
    assert answer.json() == {"metadata": {}, "status": "Failure", "message": "Forbidden", "reason": "Forbidden",
                             "code": 403}


async def test_invalid_reports_and_unknown_trainjobs(cluster, endpoint) -> None:
    token = token_for(cluster, "mnist")
    malformed = await post(endpoint, "mnist", b"{not json", token)
    assert (malformed.status_code, malformed.json()["message"]) == (422, "Invalid payload")
    too_far = await post(endpoint, "mnist", {"trainerStatus": {"progressPercentage": 101,
                                                               "lastUpdatedTime": "2026-11-25T02:21:00Z"}}, token)
    assert too_far.status_code == 422
    assert "status.trainerStatus.progressPercentage: Invalid value: 101" in too_far.json()["message"]
    ghost = await post(endpoint, "ghost", {"trainerStatus": {"progressPercentage": 1,
                                                             "lastUpdatedTime": "2026-11-25T02:21:00Z"}},
                       token_for(cluster, "ghost"))
    assert (ghost.status_code, ghost.json()["message"]) == (404, "Train job not found")


async def test_the_kubeflow_sdks_update_trainjob_status_reaches_the_status(cluster, endpoint, tmp_path: Path,
                                                                          monkeypatch) -> None:
    from kubeflow.trainer import update_trainjob_status

    url, ca = endpoint
    (tmp_path / "token").write_text(token_for(cluster, "mnist"))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", url + status_path("default", "mnist"))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", str(ca))
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(tmp_path / "token"))
    sent = await asyncio.to_thread(update_trainjob_status, progress_percent=75, estimated_remaining_seconds=12,
                                   metrics={"accuracy": 0.9})
    assert sent is True
    status = trainer_status(cluster)
    assert (status["progressPercentage"], status["estimatedRemainingSeconds"]) == (75, 12)
    assert status["metrics"] == [{"name": "accuracy", "value": "0.9"}]
    assert os.environ["KUBEFLOW_TRAINER_SERVER_URL"].endswith("/trainjobs/mnist/status")


async def test_a_slow_answer_is_logged_with_the_stage_it_spent_its_time_in(cluster, tmp_path: Path, caplog,
                                                                            monkeypatch) -> None:
    """A report answered late names where the time went (the token, the status write, the
    progress history, or a busy loop), and every stage is in the endpoint's histogram."""
    from prometheus_client import REGISTRY

    from trainyard_services.status import progress

    monkeypatch.setattr(progress, "SLOW_ANSWER_S", 0.2)

    async def slow_history(_written: dict) -> None:
        await asyncio.sleep(0.3)  # a bus that is slow to take the point

    pki.save_bundle(tmp_path, pki.issue(["127.0.0.1"], ca_common_name="status-endpoint-slow"))
    client = await KubeClient.from_kubeconfig(str(cluster.kubeconfig))
    runner = await serve(client, "127.0.0.1", 0, str(tmp_path), on_report=slow_history)
    before = {stage: REGISTRY.get_sample_value("trainyard_trainer_status_stage_seconds_count", {"stage": stage}) or 0
              for stage in ("verify", "write", "history", "total")}
    try:
        endpoint = (f"https://127.0.0.1:{runner.addresses[0][1]}", tmp_path / "ca.crt")
        answer = await post(endpoint, "mnist", {"trainerStatus": {"progressPercentage": 5,
                                                                  "lastUpdatedTime": "2026-11-25T02:21:00Z"}},
                            token_for(cluster, "mnist"))
    finally:
        await runner.cleanup()
        await client.close()
    assert answer.status_code == 200
    slow = [r.getMessage() for r in caplog.records if "answered 200 after" in r.getMessage()]
    assert len(slow) == 1 and "default/mnist" in slow[0], slow
    assert re.search(r"verify \d+\.\d\d s, write \d+\.\d\d s, history 0\.[3-9]\d s", slow[0]), slow[0]
    after = {stage: REGISTRY.get_sample_value("trainyard_trainer_status_stage_seconds_count", {"stage": stage})
             for stage in before}
    assert all(after[stage] == before[stage] + 1 for stage in before), (before, after)
    assert REGISTRY.get_sample_value("trainyard_trainer_status_reports_total", {"code": "200"}) >= 1
