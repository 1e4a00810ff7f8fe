"""A body captured from the real kubectl decodes to the object kubectl meant to create."""
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainyard.apimachinery.protobuf import decode_kubernetes_protobuf, is_kubernetes_protobuf

KUBECTL = Path(__file__).resolve().parents[3] / ".venv" / "bin" / "kubectl"

DISCOVERY = {
    "/version": {"major": "1", "minor": "36", "gitVersion": "v1.36.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}}]},
    "/apis/batch/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "batch/v1", "resources": [
        {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job", "verbs": ["create", "get"]}]},
    "/api/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [
        {"name": "configmaps", "singularName": "configmap", "namespaced": True, "kind": "ConfigMap",
         "verbs": ["create", "get", "list"], "shortNames": ["cm"]},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "verbs": ["create", "get", "list"], "shortNames": ["ns"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": ["create", "get"]},
    ]},
}


class RecordingServer(ThreadingHTTPServer):
    bodies: list[tuple[str, bytes]]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path in DISCOVERY:
            self.send_json(200, DISCOVERY[path])
        else:
            self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                 "code": 404, "message": "the server could not find the requested resource"})

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.bodies.append((self.headers.get("Content-Type", ""), body))
        obj = decode_kubernetes_protobuf(body) if is_kubernetes_protobuf(body) else json.loads(body)
        self.send_json(201, obj)


@pytest.fixture
def recording_server():
    server = RecordingServer(("127.0.0.1", 0), Handler)
    server.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def run_kubectl(server: RecordingServer, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "t", "user": {}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t", "namespace": "default"}}],
    }))
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache"), *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl wheel not installed")
def test_kubectl_create_configmap_body_decodes(recording_server: RecordingServer, tmp_path: Path) -> None:
    result = run_kubectl(recording_server, tmp_path, "create", "configmap", "x", "--from-literal=a=b",
                         "--from-literal=empty=", "--dry-run=server", "-o", "json")
    assert result.returncode == 0, result.stderr
    content_type, body = recording_server.bodies[-1]
    assert content_type == "application/vnd.kubernetes.protobuf"
    decoded = decode_kubernetes_protobuf(body)
    assert decoded == {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "x"}, "data": {"a": "b", "empty": ""}}


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl wheel not installed")
def test_kubectl_create_namespace_body_decodes(recording_server: RecordingServer, tmp_path: Path) -> None:
    result = run_kubectl(recording_server, tmp_path, "create", "namespace", "team-a", "--dry-run=server")
    assert result.returncode == 0, result.stderr
    decoded = decode_kubernetes_protobuf(recording_server.bodies[-1][1])
    assert decoded["kind"] == "Namespace" and decoded["metadata"] == {"name": "team-a"}


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl wheel not installed")
def test_kubectl_run_pod_body_decodes(recording_server: RecordingServer, tmp_path: Path) -> None:
    result = run_kubectl(recording_server, tmp_path, "run", "p", "--image=busybox", "--restart=Never",
                         "--env=A=1", "--labels=team=ml", "--dry-run=server", "--", "sh", "-c", "echo hi")
    assert result.returncode == 0, result.stderr
    content_type, body = recording_server.bodies[-1]
    # kubectl 1.37 sends `run` bodies as JSON; older ones used protobuf. Both must give this pod.
    pod = decode_kubernetes_protobuf(body) if is_kubernetes_protobuf(body) else json.loads(body)
    assert pod["metadata"]["labels"] == {"team": "ml"}
    container = pod["spec"]["containers"][0]
    assert container["name"] == "p" and container["image"] == "busybox"
    assert container["args"] == ["sh", "-c", "echo hi"] or container.get("command") == ["sh", "-c", "echo hi"]
    assert container["env"] == [{"name": "A", "value": "1"}]
    assert pod["spec"]["restartPolicy"] == "Never"


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl wheel not installed")
def test_kubectl_create_job_body_decodes(recording_server: RecordingServer, tmp_path: Path) -> None:
    result = run_kubectl(recording_server, tmp_path, "create", "job", "j", "--image=busybox", "--dry-run=server",
                         "--", "echo", "hi")
    assert result.returncode == 0, result.stderr
    content_type, body = recording_server.bodies[-1]
    job = decode_kubernetes_protobuf(body) if is_kubernetes_protobuf(body) else json.loads(body)
    assert job["kind"] == "Job" and job["apiVersion"] == "batch/v1"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "busybox" and container["command"] == ["echo", "hi"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl wheel not installed")
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["create", "secret", "generic", "s", "--from-literal=k=v"],
         {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "dg=="}}),
        (["create", "serviceaccount", "sa"], {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"}}),
        (["create", "service", "nodeport", "np", "--tcp=80:http"],
         {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "np", "labels": {"app": "np"}},
          "spec": {"ports": [{"name": "80-http", "protocol": "TCP", "port": 80, "targetPort": "http"}],
                   "selector": {"app": "np"}, "type": "NodePort"},
          "status": {"loadBalancer": {}}}),
        (["create", "job", "j", "--image=busybox", "--", "echo", "hi"],
         {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
          "spec": {"template": {"metadata": {}, "spec": {
              "containers": [{"name": "j", "image": "busybox", "command": ["echo", "hi"], "resources": {}}],
              "restartPolicy": "Never"}}},
          "status": {}}),
    ],
)
def test_kubectl_generator_bodies_decode_exactly(recording_server: RecordingServer, tmp_path: Path,
                                                  args: list[str], expected: dict) -> None:
    result = run_kubectl(recording_server, tmp_path, "--dry-run=server", *args)
    assert result.returncode == 0, result.stderr
    content_type, body = recording_server.bodies[-1]
    assert content_type == "application/vnd.kubernetes.protobuf"
    assert decode_kubernetes_protobuf(body) == expected
