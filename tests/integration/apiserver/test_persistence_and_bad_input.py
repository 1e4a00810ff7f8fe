"""Restart persistence, data-dir checks, and bad input over raw HTTP(S) against a real devcluster."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import yaml

from fixtures.devcluster import REPO, api_workers_args, start_devcluster
from integration.apiserver._manifests import TRAINER_CRDS, install_trainer_crds, trainjob
from trainyard_services.devcluster.storage.store import DataDirError, Store

TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def http(cluster) -> httpx.Client:
    return cluster.client(timeout=10)


def test_restart_keeps_objects_crds_and_resource_version(tmp_path, api_workers):
    data = tmp_path / "data"
    crd = yaml.safe_load(next(p for p in TRAINER_CRDS if p.name.endswith("_trainjobs.yaml")).read_text())
    first = start_devcluster(data, api_workers_args(api_workers))
    try:
        with http(first) as c:
            assert c.post(CRDS, json=crd).status_code == 201
            assert c.post(TJ, json=yaml.safe_load(trainjob("kept", 2))).status_code == 201
            before = c.get(TJ + "/kept").json()
            list_rv = int(c.get(TJ).json()["metadata"]["resourceVersion"])
    finally:
        first.stop()
    second = start_devcluster(data, api_workers_args(api_workers))
    try:
        with http(second) as c:
            assert c.get(TJ + "/kept").json() == before
            assert int(c.get(TJ).json()["metadata"]["resourceVersion"]) == list_rv
            created = c.post("/api/v1/namespaces/default/configmaps",
                             json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "after"}})
            assert int(created.json()["metadata"]["resourceVersion"]) == list_rv + 1
        # the CRD is served again right away, and kubectl sees the kept object
        assert "kept" in second.kubectl("get", "trainjobs", "-o", "name").stdout
    finally:
        second.stop()


def _up(data_dir, port: int = 0, workers: int = 1) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainyard.cli.main", "devcluster", "up", "--port", str(port),
                           "--no-dataplane", "--data-dir", str(data_dir), *api_workers_args(workers)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_corrupt_or_foreign_data_dir_is_refused_with_a_clear_error(tmp_path):
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "devcluster.db").write_bytes(b"this is not sqlite" * 100)
    result = _up(corrupt)
    assert result.returncode == 2
    assert "error: --data-dir:" in result.stderr and "Traceback" not in result.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(DataDirError, match="not a trainyard devcluster data dir"):
        Store(foreign)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    install_trainer_crds(devcluster_module)
    return devcluster_module


def _status(response: httpx.Response, code: int, reason: str) -> dict:
    assert response.status_code == code, response.text
    body = response.json()
    assert body["kind"] == "Status" and body["code"] == code and body["reason"] == reason
    return body


def test_bad_input_gets_a_status_and_changes_nothing(cluster):
    with http(cluster) as c:
        before = c.get(TJ).json()["metadata"]["resourceVersion"]
        _status(c.post(TJ, content=b"{not json", headers={"Content-Type": "application/json"}), 400, "BadRequest")
        wrong_kind = json.loads(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}))
        assert "kind" in _status(c.post(TJ, json=wrong_kind), 400, "BadRequest")["message"]
        body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "x" * 300}, "spec": {"runtimeRef": {"name": "r"}}}
        invalid = _status(c.post(TJ, json=body), 422, "Invalid")
        assert invalid["details"]["causes"][0]["field"] == "metadata.name"
        body["metadata"] = {"name": "Bad_Name"}
        _status(c.post(TJ, json=body), 422, "Invalid")
        body["metadata"] = {"name": "ok", "namespace": "other"}
        mismatch = _status(c.post(TJ, json=body), 400, "BadRequest")
        assert mismatch["message"] == "the namespace of the provided object does not match the namespace sent on the request"
        body["metadata"] = {"name": "typed"}
        body["spec"] = {"runtimeRef": {"name": "r"}, "trainer": {"numNodes": "two"}}
        typed = _status(c.post(TJ, json=body), 422, "Invalid")
        assert typed["details"]["causes"][0]["field"] == "spec.trainer.numNodes"
        # numNodes is the TrainJob's scale path: kube-apiserver also reports its accessor error
        assert typed["message"].startswith('TrainJob.trainer.kubeflow.org "typed" is invalid: [spec.trainer.numNodes')
        assert typed["details"]["causes"][1] == {
            "reason": "FieldValueInvalid", "field": ".spec.trainer.numNodes",
            "message": "Invalid value: 0: .spec.trainer.numNodes accessor error: two is of the type string, expected int64"}
        body["spec"] = {"trainer": {"numNodes": 1}}
        required = _status(c.post(TJ, json=body), 422, "Invalid")
        assert required["details"]["causes"][0] == {"reason": "FieldValueRequired", "message": "Required value",
                                                    "field": "spec.runtimeRef"}
        _status(c.post(TJ, content=b"x" * (4 * 1024 * 1024), headers={"Content-Type": "application/json"}),
                413, "RequestEntityTooLarge")
        _status(c.get("/apis/nope.example.com/v1/things"), 404, "NotFound")
        _status(c.put(TJ, json=body), 405, "MethodNotAllowed")
        _status(c.get(TJ, params={"labelSelector": "a in ("}), 400, "BadRequest")
        _status(c.get(TJ, params={"fieldSelector": "spec.x=1"}), 400, "BadRequest")
        missing = _status(c.get(TJ + "/missing"), 404, "NotFound")
        assert missing["message"] == 'trainjobs.trainer.kubeflow.org "missing" not found'
        _status(c.post("/api/v1/namespaces/nowhere/configmaps",
                       json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}), 404, "NotFound")
        bad_yaml = c.patch(TJ + "/ok", content=b"spec: [unclosed", params={"fieldManager": "t"},
                           headers={"Content-Type": "application/apply-patch+yaml"})
        assert "error decoding YAML" in _status(bad_yaml, 400, "BadRequest")["message"]
        deep = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"data":' + b"[" * 100000 + b"]" * 100000 + b"}"
        _status(c.post("/api/v1/namespaces/default/configmaps", content=deep,
                       headers={"Content-Type": "application/json"}), 400, "BadRequest")
        assert c.get("/healthz").text == "ok"
        assert c.get(TJ).json()["metadata"]["resourceVersion"] == before


def test_strict_unknown_fields_and_warn_header(cluster):
    with http(cluster) as c:
        body = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": {"name": "strict"},
                "spec": {"runtimeRef": {"name": "r"}, "bogus": 1}}
        strict = _status(c.post(TJ, json=body, params={"fieldValidation": "Strict"}), 400, "BadRequest")
        assert strict["message"] == 'strict decoding error: unknown field "spec.bogus"'
        warned = c.post(TJ, json=body, params={"fieldValidation": "Warn"})
        assert warned.status_code == 201
        assert warned.headers["Warning"] == '299 - "unknown field \\"spec.bogus\\""'
        assert "bogus" not in warned.json()["spec"]  # pruned


def test_built_in_kinds_report_unknown_fields_and_apply_needs_a_field_manager(cluster):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typo"},
           "spec": {"containers": [{"name": "node", "image": "busybox", "imagePullPolcy": "Always"}]}}
    with http(cluster) as c:
        strict = _status(c.post("/api/v1/namespaces/default/pods", json=pod, params={"fieldValidation": "Strict"}),
                         400, "BadRequest")
        assert strict["message"] == 'strict decoding error: unknown field "spec.containers[0].imagePullPolcy"'
        warned = c.post("/api/v1/namespaces/default/pods", json=pod)
        assert warned.status_code == 201 and "imagePullPolcy" in warned.headers["Warning"]
        assert "imagePullPolcy" not in warned.json()["spec"]["containers"][0]
        no_manager = c.patch("/api/v1/namespaces/default/pods/typo", content=json.dumps(pod),
                             headers={"Content-Type": "application/apply-patch+yaml"})
        assert "fieldManager: Required value" in _status(no_manager, 400, "BadRequest")["message"]


def test_a_port_in_use_is_a_clear_error(cluster, tmp_path):
    # a second devcluster of as many workers: with 4, both would set SO_REUSEPORT, which alone
    # would let the second share the first's port (supervisor.reserve_port)
    result = _up(tmp_path / "other", port=cluster.port, workers=cluster.api_workers)
    assert result.returncode == 2
    assert f"error: --port: 127.0.0.1:{cluster.port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_requests_without_the_token_are_unauthorized(cluster):
    with cluster.client(token=None, timeout=10) as c:
        _status(c.get("/api/v1/namespaces"), 401, "Unauthorized")
        assert c.get("/version").json()["gitVersion"].startswith("v1.36.")


def test_optimistic_concurrency_and_delete_preconditions(cluster):
    with http(cluster) as c:
        cm = c.post("/api/v1/namespaces/default/configmaps",
                    json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "occ"}, "data": {"a": "1"}}).json()
        stale = dict(cm, data={"a": "2"})
        ok = c.put("/api/v1/namespaces/default/configmaps/occ", json=stale)
        assert ok.status_code == 200
        conflict = _status(c.put("/api/v1/namespaces/default/configmaps/occ", json=dict(cm, data={"a": "3"})), 409, "Conflict")
        assert "the object has been modified" in conflict["message"]
        pre = {"preconditions": {"resourceVersion": cm["metadata"]["resourceVersion"]}}
        _status(c.request("DELETE", "/api/v1/namespaces/default/configmaps/occ", json=pre), 409, "Conflict")
        done = c.delete("/api/v1/namespaces/default/configmaps/occ")
        assert done.json()["status"] == "Success"
