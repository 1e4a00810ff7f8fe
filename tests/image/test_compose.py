"""docker-compose.yml: parsed and resolved by podman-compose (Debian's), and what it must hold."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from trainyard.roles import CLUSTER_ROLES

REPO = Path(__file__).resolve().parents[2]
SERVICES = CLUSTER_ROLES


def test_compose_file_builds_from_the_dockerfile_with_healthchecks() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"bus-credentials", "nats", "bus-bootstrap", *SERVICES}
    for name in SERVICES:
        service = services[name]
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert service["build"]["args"]["BASE"] == "${TRAINYARD_BASE:-python:3.11-slim}"
        assert "/readyz" in service["healthcheck"]["test"]  # string form: CMD-SHELL
        assert service["read_only"] is True and service["user"] == "10001:10001"
        assert service["depends_on"]["nats"]["condition"] == "service_healthy"
        assert service["depends_on"]["bus-bootstrap"]["condition"] == "service_completed_successfully"
        assert service["command"] == [name]  # the image's entrypoint is `trainyard`
    assert "healthz" in services["nats"]["healthcheck"]["test"]
    assert "TRAINYARD_WEBHOOK_URL" in services["planner"]["environment"]


@pytest.mark.skipif(shutil.which("podman-compose") is None, reason="podman-compose not installed (make image-tools)")
def test_podman_compose_resolves_the_file(tmp_path: Path) -> None:
    # Debian bookworm's podman-compose (1.0.3) has no `config`; `--dry-run ps` parses, merges the
    # anchors and interpolates the whole file, and runs nothing.
    result = subprocess.run(["podman-compose", "--dry-run", "-f", str(REPO / "docker-compose.yml"), "ps"],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text((REPO / "docker-compose.yml").read_text().replace("<<: *service", "<<: *nowhere", 1))
    bad = subprocess.run(["podman-compose", "--dry-run", "-f", str(broken), "ps"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode != 0


IMAGE = os.environ.get("TRAINYARD_TEST_IMAGE", "")


@pytest.mark.image
@pytest.mark.skipif(not IMAGE, reason="set TRAINYARD_TEST_IMAGE to a built image (make test-image)")
@pytest.mark.skipif(not (shutil.which("podman-compose") and shutil.which("runc")),
                    reason="podman-compose and runc not installed (make image-tools)")
def test_compose_stack_starts_and_serves_a_trainjob(tmp_path: Path) -> None:
    """`podman-compose up` of docker-compose.yml, as a user would, against a devcluster on the host
    (reached as host.containers.internal); no registry here, so NATS runs from our image too (it
    carries nats-server), and the stack uses free host ports."""
    from fixtures.devcluster import start_devcluster
    from fixtures.nats import free_port

    cluster = start_devcluster(tmp_path / "dev", ["--host", "0.0.0.0"])
    project = f"tytest{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    ports = {name: str(free_port()) for name in ("NATS_PORT", "NATS_MONITOR_PORT", "WATCHER_PORT", "PLANNER_PORT",
                                                 "WEBHOOK_HOST_PORT", "APPLIER_PORT", "STATUS_PORT")}
    env.update(ports, STORAGE_DRIVER="vfs", TRAINYARD_IMAGE=IMAGE, NATS_IMAGE=IMAGE,
               TRAINYARD_WEBHOOK_URL=f"https://127.0.0.1:{ports['WEBHOOK_HOST_PORT']}")
    compose = ["podman-compose", "-p", project, "--podman-args", "--runtime runc",
               "--podman-run-args", "--ulimit nofile=8192:8192 --ulimit nproc=4096:4096"]
    try:
        # The host's view (the server certificate names 127.0.0.1) and the containers' view.
        document = yaml.safe_load(cluster.kubeconfig.read_text())
        port = document["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1]
        document["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
        host_kubeconfig = tmp_path / "host-kubeconfig"
        host_kubeconfig.write_text(yaml.safe_dump(document))
        kubectl = [str(Path(sys.executable).parent / "kubectl"), "--kubeconfig", str(host_kubeconfig),
                   f"--cache-dir={tmp_path / 'cache'}"]

        def run_kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
            result = subprocess.run([*kubectl, *args], capture_output=True, text=True, timeout=120, input=stdin)
            assert result.returncode == 0, result.stderr
            return result

        for target in ("crds", "crds/dependencies"):
            run_kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / target))
        run_kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        run_kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / "runtimes"))
        inside = document["clusters"][0]["cluster"]
        inside.pop("certificate-authority-data", None)
        inside.update(server=f"https://host.containers.internal:{port}", **{"insecure-skip-tls-verify": True})
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(document))
        (tmp_path / "kubeconfig").chmod(0o644)  # read by uid 10001
        shutil.copy(REPO / "docker-compose.yml", tmp_path / "docker-compose.yml")

        up = subprocess.run([*compose, "up", "-d"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        deadline = time.monotonic() + 120
        for service in ("WATCHER_PORT", "PLANNER_PORT", "APPLIER_PORT", "STATUS_PORT"):
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{ports[service]}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    logs = subprocess.run(["podman", "logs", f"{project}_{service.split('_')[0].lower()}_1"],
                                          env=env, capture_output=True, text=True).stderr[-3000:]
                    raise AssertionError(f"{service} not ready: {logs}")
                time.sleep(1)
        for service in ("watcher", "planner", "applier", "status"):  # the compose healthcheck itself
            check = subprocess.run(["podman", "--runtime", "runc", "healthcheck", "run", f"{project}_{service}_1"],
                                   env=env, capture_output=True, text=True, timeout=60)
            assert check.returncode == 0, (service, check.stdout, check.stderr)
        run_kubectl("apply", "-f", "-", stdin="""
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata: {name: from-compose, namespace: default}
spec:
  suspend: true
  runtimeRef: {name: torch-distributed-cpu, kind: ClusterTrainingRuntime}
""")
        deadline = time.monotonic() + 60
        while subprocess.run([*kubectl, "get", "jobsets.jobset.x-k8s.io", "from-compose"],
                             capture_output=True).returncode != 0:
            assert time.monotonic() < deadline, "no JobSet from the compose stack"
            time.sleep(1)
    finally:
        subprocess.run([*compose, "down"], cwd=tmp_path, env=env, capture_output=True, timeout=300)
        for kind, name in (("network", f"{project}_default"), ("volume", f"{project}_nats-data"),
                           ("volume", f"{project}_bus")):
            subprocess.run(["podman", kind, "rm", name], env=env, capture_output=True, timeout=60)
        cluster.stop()
