"""`trainyard up` with NATS and devcluster (no services): the CRDs, default runtimes and the SDK's
public ConfigMap are installed, the Kubeflow SDK can list runtimes, and a second `up` on the same
data dir resumes with every object kept."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from fixtures.stack import start_stack

pytestmark = pytest.mark.slow

INFRA_ONLY = ("--skip", "watcher", "--skip", "planner", "--skip", "applier", "--skip", "status")
DEFAULT_RUNTIMES = {
    "torch-distributed", "torch-distributed-cpu", "torch-distributed-with-cache", "deepspeed-distributed",
    "mlx-distributed", "torchtune-llama3.2-1b", "torchtune-llama3.2-3b", "torchtune-qwen2.5-1.5b",
    "jax-distributed", "xgboost-distributed",
}
TRAINJOB = """
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: survives-restart
spec:
  runtimeRef:
    name: torch-distributed-cpu
"""


@pytest.fixture(autouse=True)
def needs_devcluster() -> None:
    from trainyard.cli.main import COMMANDS

    if "devcluster" not in COMMANDS:
        pytest.skip("`trainyard devcluster` command not available (trainyard_services.devcluster.cli)")


def test_installs_runtimes_and_resumes_with_objects_kept(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data_dir = tmp_path / "data"
    first = start_stack(data_dir, *INFRA_ONLY)
    try:
        runtimes = json.loads(first.kubectl("get", "clustertrainingruntimes", "-o", "json").stdout)["items"]
        assert {r["metadata"]["name"] for r in runtimes} == DEFAULT_RUNTIMES
        configmap = json.loads(first.kubectl("get", "configmap", "-n", "kubeflow-system",
                                             "kubeflow-trainer-public", "-o", "json").stdout)
        assert configmap["data"]["kubeflow_trainer_version"] == "v2.3.0"  # the default level

        from kubeflow.common.types import KubernetesBackendConfig
        from kubeflow.trainer import TrainerClient

        with caplog.at_level(logging.WARNING):
            client = TrainerClient(KubernetesBackendConfig(config_file=str(first.kubeconfig)))
        assert "version info is not available" not in caplog.text
        assert {runtime.name for runtime in client.list_runtimes()} == DEFAULT_RUNTIMES

        first.kubectl("apply", "-f", "-", stdin=TRAINJOB)
        before = json.loads(first.kubectl("get", "trainjob", "survives-restart", "-o", "json").stdout)
        assert first.stop().returncode == 0
        assert first.survivors() == []
    finally:
        first.kill()

    second = start_stack(data_dir, *INFRA_ONLY)
    try:
        after = json.loads(second.kubectl("get", "trainjob", "survives-restart", "-o", "json").stdout)
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["spec"] == before["spec"]
        runtimes = json.loads(second.kubectl("get", "clustertrainingruntimes", "-o", "json").stdout)["items"]
        assert sorted(r["metadata"]["name"] for r in runtimes) == sorted(DEFAULT_RUNTIMES)
        assert second.stop().returncode == 0
        assert second.survivors() == []
    finally:
        second.kill()
