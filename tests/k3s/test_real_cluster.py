"""The same four services against a real Kubernetes API server (k3s via testcontainers).

"Same code, any cluster": nothing in the services may depend on devcluster. Only the kubeconfig
differs. Needs a Docker engine; where none runs (this project's dev machines), the test skips
and says so. On a real cluster there is no JobSet controller unless one is installed, so the
test checks the control-plane half: CRDs install, the runtime is accepted, a TrainJob becomes
exactly its JobSet (applied by field manager `trainer`), and JobSet status folds into the
TrainJob's conditions.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard.roles import CLUSTER_ROLES
from fixtures.waiting import wait_for as poll

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = str(Path(sys.executable).parent / "kubectl")
SERVICES = CLUSTER_ROLES


def _docker_engine_problem() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return "no Docker engine reachable (`docker info` failed): k3s via testcontainers cannot start"
    return None


@pytest.fixture(scope="module")
def k3s_kubeconfig(tmp_path_factory) -> Path:
    problem = _docker_engine_problem()
    if problem:
        pytest.skip(problem)
    from testcontainers.community.k3s import K3SContainer

    container = K3SContainer()
    container.start()
    try:
        path = tmp_path_factory.mktemp("k3s") / "kubeconfig"
        path.write_text(container.config_yaml())
        yield path
    finally:
        container.stop()


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), *args], input=stdin,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"kubectl {' '.join(args)} failed: {result.stderr}"
    return result


TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: on-k3s
  namespace: default
spec:
  runtimeRef:
    name: torch-distributed
  trainer:
    numNodes: 2
"""


def wait_for(predicate, timeout: float = 120.0, what: str = "condition"):
    return poll(predicate, timeout=timeout, interval=1.0, what=what)


def get_json(kubeconfig: Path, *args: str):
    result = subprocess.run([KUBECTL, "--kubeconfig", str(kubeconfig), "get", *args, "-o", "json"],
                            capture_output=True, text=True, timeout=60)
    return json.loads(result.stdout) if result.returncode == 0 else None


def test_services_turn_a_trainjob_into_its_jobset_on_k3s(k3s_kubeconfig: Path, nats_server, tmp_path: Path) -> None:
    kubectl(k3s_kubeconfig, "apply", "--server-side", "-k", str(ROOT / "deploy" / "crds"))
    kubectl(k3s_kubeconfig, "apply", "--server-side", "-k", str(ROOT / "deploy" / "crds" / "dependencies"))
    for crd in ("trainjobs.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io",
                "clustertrainingruntimes.trainer.kubeflow.org"):
        kubectl(k3s_kubeconfig, "wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    kubectl(k3s_kubeconfig, "apply", "--server-side", "-f",
            str(ROOT / "deploy" / "runtimes" / "torch-distributed.yaml"))

    processes: list[subprocess.Popen] = []
    try:
        for name in SERVICES:
            # The webhook is off: k3s in a container cannot call back into this host's port.
            extra = ["--webhook-port", "off"] if name == "planner" else []
            log = open(tmp_path / f"{name}.log", "wb")
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "trainyard.cli.main", name, "--kubeconfig", str(k3s_kubeconfig),
                 "--nats-url", nats_server.url, "--http-port", "0", *extra],
                stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")))
            log.close()

        kubectl(k3s_kubeconfig, "apply", "-f", "-", stdin=TRAINJOB)
        jobset = wait_for(lambda: get_json(k3s_kubeconfig, "jobset", "on-k3s", "-n", "default"),
                          what="the JobSet of TrainJob on-k3s")
        owners = jobset["metadata"].get("ownerReferences", [])
        assert [(o["kind"], o["name"]) for o in owners] == [("TrainJob", "on-k3s")]
        managers = {entry["manager"] for entry in jobset["metadata"].get("managedFields", [])}
        assert "trainer" in managers
        node = next(rj for rj in jobset["spec"]["replicatedJobs"] if rj["name"] == "node")
        env = {e["name"]: e.get("value") for e in
               node["template"]["spec"]["template"]["spec"]["containers"][0].get("env", [])}
        assert env["PET_NNODES"] == "2"

        # No JobSet controller on a bare k3s: play its part and mark the JobSet Completed.
        status = {"status": {"conditions": [{
            "type": "Completed", "status": "True", "reason": "AllJobsCompleted",
            "message": "jobset completed successfully", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
        kubectl(k3s_kubeconfig, "patch", "jobset", "on-k3s", "-n", "default", "--subresource=status",
                "--type=merge", "-p", json.dumps(status))

        def complete():
            job = get_json(k3s_kubeconfig, "trainjob", "on-k3s", "-n", "default") or {}
            conditions = (job.get("status") or {}).get("conditions") or []
            return next((c for c in conditions if c["type"] == "Complete" and c["status"] == "True"), None)

        condition = wait_for(complete, what="TrainJob Complete")
        assert (condition["reason"], condition["message"]) == ("AllJobsCompleted", "jobset completed successfully")
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
