"""v2.3.0 TrainJobStatus as table tests written from upstream's facts: off by default (plans
unchanged), and when enabled the trainer pods get the status URL, the CA and a token for the
TrainJob's audience; the status endpoint's authorization and the status a report writes."""
from __future__ import annotations

import time
from typing import Any

import pytest

from fixtures.pipeline_builders import container, container_of, env_of, find, job, pod_spec, torch_runtime, trainjob
from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.apimachinery.structural import validate
from fixtures.pipeline_builders import plan_past_snapshot as plan  # the plugins' objects (test_snapshot.py)
from trainyard.pipeline.plugins import REGISTRY
from trainyard.pipeline.plugins.trainjobstatus import StatusEndpoint, with_trainjob_status
from trainyard.pipeline.trainer_status import InvalidPayload, authorized, status_apply, token_audience
from trainyard.pipeline.validation import crd_schema

ENDPOINT = StatusEndpoint("https://trainyard-status.kubeflow-system.svc:8443", "-----BEGIN CERTIFICATE-----\nca\n")
ISSUER = "https://127.0.0.1:6443"


def runtime() -> dict[str, Any]:
    return torch_runtime([job("model-initializer", container("model-initializer"), ancestor="model-initializer"),
                          job("node", container("node"), container("sidecar"), ancestor="trainer")])


def test_off_by_default_plans_carry_nothing_of_it() -> None:
    objects = plan(trainjob(), runtime()).objects
    assert find(objects, "ConfigMap") is None
    node = container_of(find(objects, "JobSet"), "node")
    assert not any(name.startswith("KUBEFLOW_TRAINER_SERVER") for name in env_of(node))


def test_enabled_the_trainer_pods_get_url_ca_and_a_token_for_the_trainjob() -> None:
    objects = plan(trainjob("mnist", "team-a"), runtime(), plugins=with_trainjob_status(REGISTRY, ENDPOINT)).objects
    assert [o["kind"] for o in objects][-2:] == ["ConfigMap", "JobSet"]
    config = find(objects, "ConfigMap")
    assert config["metadata"]["name"] == "mnist-tls-config" and config["metadata"]["namespace"] == "team-a"
    assert config["data"] == {"ca.crt": ENDPOINT.ca_pem}
    assert config["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    jobset = find(objects, "JobSet")
    for name in ("node", "sidecar"):
        trainer = container_of(jobset, "node", name)
        assert {k: v for k, v in env_of(trainer).items() if k.startswith("KUBEFLOW_TRAINER_SERVER")} == {
            "KUBEFLOW_TRAINER_SERVER_URL": "https://trainyard-status.kubeflow-system.svc:8443"
                                           "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/mnist/status",
            "KUBEFLOW_TRAINER_SERVER_CA_CERT": "/var/run/secrets/kubeflow/trainer/ca.crt",
            "KUBEFLOW_TRAINER_SERVER_TOKEN": "/var/run/secrets/kubeflow/trainer/token"}
        assert {"name": "kubeflow-trainer-token", "mountPath": "/var/run/secrets/kubeflow/trainer",
                "readOnly": True} in trainer["volumeMounts"]
    [volume] = [v for v in pod_spec(jobset, "node")["volumes"] if v["name"] == "kubeflow-trainer-token"]
    assert volume["projected"]["sources"] == [
        {"serviceAccountToken": {"audience": "trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/mnist/status",
                                 "expirationSeconds": 3600, "path": "token"}},
        {"configMap": {"name": "mnist-tls-config", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
    initializer = container_of(jobset, "model-initializer", "model-initializer")
    assert "volumeMounts" not in initializer and not any(e.startswith("KUBEFLOW") for e in env_of(initializer))


@pytest.fixture(scope="module")
def key() -> sat.SigningKey:
    return sat.SigningKey.generate()


def header(key: sat.SigningKey, namespace: str, audience: str) -> str:
    token = sat.issue(key, issuer=ISSUER, namespace=namespace, service_account="default", service_account_uid="u",
                      audiences=[audience], expiration_seconds=3600, now=int(time.time()),
                      bound=sat.BoundObject("Pod", "p", "pu"))
    return f"Bearer {token}"


@pytest.mark.parametrize("namespace, audience, scheme, allowed", [
    pytest.param("team-a", token_audience("team-a", "mnist"), "Bearer", True, id="its-own-trainjob"),
    pytest.param("team-a", token_audience("team-a", "mnist"), "bearer", True, id="scheme-any-case"),
    pytest.param("team-a", token_audience("team-a", "other"), "Bearer", False, id="another-trainjob"),
    pytest.param("team-b", token_audience("team-a", "mnist"), "Bearer", False, id="token-of-another-namespace"),
    pytest.param("team-a", token_audience("team-a", "mnist"), "Basic", False, id="not-bearer"),
])
def test_authorization(key: sat.SigningKey, namespace: str, audience: str, scheme: str, allowed: bool) -> None:
    value = header(key, namespace, audience).replace("Bearer", scheme, 1)
    assert authorized(value, "team-a", "mnist", sat.jwks([key]), issuer=ISSUER, now=int(time.time())) is allowed


def test_authorization_refuses_tokens_of_other_issuers_and_no_token(key: sat.SigningKey) -> None:
    foreign = sat.SigningKey.generate()
    value = header(foreign, "team-a", token_audience("team-a", "mnist"))
    assert not authorized(value, "team-a", "mnist", sat.jwks([key]), issuer=ISSUER, now=int(time.time()))
    assert not authorized(None, "team-a", "mnist", sat.jwks([key]), issuer=ISSUER, now=int(time.time()))


def test_a_report_as_the_sdk_sends_it_becomes_a_status_apply() -> None:
    report = {"trainerStatus": {"lastUpdatedTime": "2026-11-25T02:21:00.123456+00:00", "progressPercentage": 40,
                                "estimatedRemainingSeconds": 30,
                                "metrics": [{"name": "loss", "value": "0.25"}]}}
    assert status_apply("team-a", "mnist", report) == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "mnist", "namespace": "team-a"},
        "status": {"trainerStatus": {"progressPercentage": 40, "estimatedRemainingSeconds": 30,
                                     "metrics": [{"name": "loss", "value": "0.25"}],
                                     "lastUpdatedTime": "2026-11-25T02:21:00Z"}}}
    assert status_apply("team-a", "mnist", {}) is None


@pytest.mark.parametrize("body", [[], {"trainerStatus": []}, {"trainerStatus": {"progressPercentage": "40"}},
                                  {"trainerStatus": {"metrics": [{"name": "loss", "value": 0.25}]}},
                                  {"trainerStatus": {"lastUpdatedTime": "yesterday"}}])
def test_malformed_reports_are_invalid_payloads(body: Any) -> None:
    with pytest.raises(InvalidPayload):
        status_apply("team-a", "mnist", body)


@pytest.mark.parametrize("reported, message", [
    ({"progressPercentage": 101, "lastUpdatedTime": "2026-11-25T02:21:00Z"},
     "Invalid value: 101: status.trainerStatus.progressPercentage in body should be less than or equal to 100"),
    ({"progressPercentage": 5}, 'Invalid value: "object": lastUpdatedTime is required when trainerStatus is present'),
])
def test_the_crd_schema_bounds_what_a_report_writes(reported: dict, message: str) -> None:
    """The API server's check of the write, by the one CEL evaluator and the CRD's own schema."""
    doc = trainjob("mnist", "team-a")
    doc["status"] = status_apply("team-a", "mnist", {"trainerStatus": reported})["status"]
    assert [c["message"] for c in validate(doc, None, crd_schema("TrainJob"))] == [message]
