"""The default runtimes in deploy/runtimes/ are upstream's v2.1.0 set, v2.3.0's new JAX and
XGBoost runtimes, plus a CPU torch runtime,
and every one of them is usable by kubectl users, trainyard's own models and the Kubeflow SDK."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
RUNTIMES_DIR = REPO / "deploy" / "runtimes"
UPSTREAM_RUNTIMES = REPO.parent / "shared" / "reference" / "trainer-v2.1.0" / "runtimes"
UPSTREAM_V23_RUNTIMES = REPO.parent / "shared" / "reference" / "trainer-v2.3.0" / "runtimes"
# Runtimes v2.3.0 added; the ones it changed (torch image, deepspeed/mlx launcher order) stay as
# in v2.1.0 (docs/compatibility.md).
V23_NEW = ("jax_distributed.yaml", "xgboost_distributed.yaml")

UPSTREAM_NAMES = {
    "torch-distributed",
    "torch-distributed-with-cache",
    "deepspeed-distributed",
    "mlx-distributed",
    "torchtune-llama3.2-1b",
    "torchtune-llama3.2-3b",
    "torchtune-qwen2.5-1.5b",
    "jax-distributed",
    "xgboost-distributed",
}
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def kustomization_resources() -> list[str]:
    return yaml.safe_load((RUNTIMES_DIR / "kustomization.yaml").read_text())["resources"]


def load_runtimes() -> dict[str, dict[str, Any]]:
    runtimes = {}
    for file_name in kustomization_resources():
        doc = yaml.safe_load((RUNTIMES_DIR / file_name).read_text())
        runtimes[doc["metadata"]["name"]] = doc
    return runtimes


def test_kustomization_lists_every_runtime_file_once() -> None:
    listed = kustomization_resources()
    on_disk = sorted(p.name for p in RUNTIMES_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


def test_each_file_is_named_after_its_runtime() -> None:
    for file_name in kustomization_resources():
        doc = yaml.safe_load((RUNTIMES_DIR / file_name).read_text())
        assert f"{doc['metadata']['name']}.yaml" == file_name


def test_the_upstream_set_and_a_cpu_torch_runtime_are_shipped() -> None:
    names = set(load_runtimes())
    assert names == UPSTREAM_NAMES | {"torch-distributed-cpu"}


@pytest.mark.skipif(not UPSTREAM_RUNTIMES.is_dir(), reason=f"upstream reference not found at {UPSTREAM_RUNTIMES}")
@pytest.mark.parametrize("upstream_file", sorted(p.name for p in UPSTREAM_RUNTIMES.glob("*.yaml")))
def test_matches_upstream_v2_1_0_field_for_field(upstream_file: str) -> None:
    upstream = yaml.safe_load((UPSTREAM_RUNTIMES / upstream_file).read_text())
    ours = load_runtimes()[upstream["metadata"]["name"]]
    if upstream["metadata"]["name"] == "torch-distributed-with-cache":
        # The one change: the `initializer` mount v2.3.0's webhook requires (docs/compatibility.md A17).
        pod = ours["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod.pop("volumes") == [{"name": "initializer", "emptyDir": {}}]
        assert pod["containers"][0].pop("volumeMounts") == [{"name": "initializer", "mountPath": "/workspace"}]
    assert ours == upstream


@pytest.mark.parametrize("name", sorted(UPSTREAM_NAMES | {"torch-distributed-cpu"}))
def test_trainjobs_with_initializers_pass_v2_3_0_admission(name: str) -> None:
    """Every initializer a shipped runtime has can be configured by a TrainJob at the default
    level, whose webhook requires the `initializer` volumeMount (v2.3.0)."""
    from trainyard.pipeline import validate_trainjob

    runtime = load_runtimes()[name]
    jobs = {job["name"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    initializer = {section: {"storageUri": "hf://org/data"} for section, job in
                   (("dataset", "dataset-initializer"), ("model", "model-initializer")) if job in jobs}
    trainjob = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                "metadata": {"name": "job", "namespace": "default"},
                "spec": {"runtimeRef": {"name": name}, **({"initializer": initializer} if initializer else {})}}
    result = validate_trainjob(trainjob, runtime=runtime)
    assert [t for t in result.texts() if "volumeMount" in t] == []


@pytest.mark.skipif(not UPSTREAM_V23_RUNTIMES.is_dir(), reason=f"upstream reference not found at {UPSTREAM_V23_RUNTIMES}")
@pytest.mark.parametrize("upstream_file", V23_NEW)
def test_new_v2_3_0_runtimes_match_upstream_field_for_field(upstream_file: str) -> None:
    upstream = yaml.safe_load((UPSTREAM_V23_RUNTIMES / upstream_file).read_text())
    assert load_runtimes()[upstream["metadata"]["name"]] == upstream


def test_cpu_runtime_runs_one_torch_process_per_requested_cpu() -> None:
    runtime = load_runtimes()["torch-distributed-cpu"]
    assert runtime["kind"] == "ClusterTrainingRuntime"
    assert runtime["metadata"]["labels"][FRAMEWORK_LABEL] == "torch"
    assert runtime["spec"]["mlPolicy"]["torch"]["numProcPerNode"] == "cpu"
    [node_job] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node_job["name"] == "node"
    assert node_job["template"]["metadata"]["labels"][ANCESTOR_LABEL] == "trainer"
    [container] = node_job["template"]["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "node"
    # No resource limits: a limit would make the scheduler reserve CPUs a laptop may not have.
    assert "resources" not in container


@pytest.mark.parametrize("name", sorted(UPSTREAM_NAMES | {"torch-distributed-cpu"}))
def test_kubeflow_sdk_accepts_the_runtime(name: str) -> None:
    """The SDK parses runtimes strictly; one malformed runtime breaks `list_runtimes` entirely."""
    from kubeflow.trainer.backends.kubernetes import utils as sdk_utils
    from kubeflow_trainer_api import models

    runtime = load_runtimes()[name]
    parsed = models.TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime)
    assert parsed.kind == "ClusterTrainingRuntime"
    trainer = sdk_utils.get_runtime_trainer(
        parsed.metadata.labels[FRAMEWORK_LABEL],
        parsed.spec.template.spec.replicated_jobs,
        parsed.spec.ml_policy,
    )
    assert trainer.image
    expected_entrypoint = {"torchtune": "tune", "deepspeed": "mpirun", "mlx": "mpirun"}.get(
        runtime["metadata"]["labels"][FRAMEWORK_LABEL], "bash"
    )
    assert trainer.command[0] == expected_entrypoint


def _api_objects_available() -> bool:
    return importlib.util.find_spec("trainyard.api.objects") is not None


@pytest.mark.skipif(not _api_objects_available(), reason="trainyard.api.objects not available yet (models helper)")
@pytest.mark.parametrize("name", sorted(UPSTREAM_NAMES | {"torch-distributed-cpu"}))
def test_trainyard_models_parse_and_round_trip(name: str) -> None:
    from trainyard.api.objects import dump_object, parse_object
    from trainyard.api.trainer import ClusterTrainingRuntime

    runtime = load_runtimes()[name]
    model = parse_object(runtime)
    assert isinstance(model, ClusterTrainingRuntime)
    assert dump_object(model) == runtime
