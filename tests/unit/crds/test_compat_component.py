"""deploy/compat/v2.1, the kustomize component that keeps v2.1.0 behaviour (docs/compatibility.md):
built with kubectl's kustomize in overlays of deploy/crds and deploy/, as its header tells users."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from trainyard.api.crds import crds_at
from trainyard.compat import COMPAT_ENV, TrainerCompat
from trainyard.supervisor.binaries import kubectl_binary

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"


def build(tmp_path: Path, base: Path) -> list[dict]:
    overlay = tmp_path / base.name
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(base, overlay)],
        "components": [os.path.relpath(DEPLOY / "compat" / "v2.1", overlay)]}))
    out = subprocess.run([str(kubectl_binary()), "kustomize", str(overlay)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _messages(crd: dict) -> list[tuple[str, str]]:
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    return [(rule["rule"], rule["message"]) for name in ("runtimeRef", "managedBy")
            for rule in spec[name]["x-kubernetes-validations"]]


def test_crds_get_v2_1_0_messages_as_trainyard_up_installs_them(tmp_path: Path) -> None:
    built = {doc["metadata"]["name"]: doc for doc in build(tmp_path, DEPLOY / "crds")}
    trainjobs = built["trainjobs.trainer.kubeflow.org"]
    expected = next(c for c in crds_at(TrainerCompat.V2_1) if c["metadata"]["name"] == "trainjobs.trainer.kubeflow.org")
    assert _messages(trainjobs) == _messages(expected)
    assert ("self == oldSelf", "runtimeRef is immutable") in _messages(trainjobs)
    assert ("self == oldSelf", "ManagedBy value is immutable") in _messages(trainjobs)


def test_planner_and_status_run_at_v2_1(tmp_path: Path) -> None:
    built = build(tmp_path, DEPLOY)
    deployments = {d["metadata"]["name"]: d for d in built if d["kind"] == "Deployment"}
    for name in ("trainyard-planner", "trainyard-status"):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[COMPAT_ENV] == "v2.1"
        assert env["TRAINYARD_CLUSTER"] == "default"  # the Deployment's own variables stay
    public = next(d for d in built if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "kubeflow-trainer-public")
    assert public["data"]["kubeflow_trainer_version"] == "v2.1.0"
    assert not any(d["kind"] == "MutatingWebhookConfiguration" for d in built)  # v2.1.0 has none
    for name in ("trainyard-watcher", "trainyard-applier"):
        (container,) = deployments[name]["spec"]["template"]["spec"]["containers"]
        assert COMPAT_ENV not in {e["name"] for e in container["env"]}


def test_levels_parse_with_a_clear_error() -> None:
    import pytest

    from trainyard.compat import DEFAULT_COMPAT, parse_compat

    assert DEFAULT_COMPAT is TrainerCompat.V2_3
    assert parse_compat("v2.1") is TrainerCompat.V2_1 and parse_compat("2.3") is TrainerCompat.V2_3
    with pytest.raises(ValueError, match=r"--trainer-compat: expected one of v2.3, v2.1, got 'v2.2'"):
        parse_compat("v2.2")


def test_trainyard_up_installs_the_crds_of_its_level() -> None:
    from trainyard.supervisor.manifests import load_crds

    def trainjobs(level: TrainerCompat) -> dict:
        return next(c for c in load_crds(DEPLOY, level) if c["metadata"]["name"] == "trainjobs.trainer.kubeflow.org")

    assert ("self == oldSelf", "field is immutable") in _messages(trainjobs(TrainerCompat.V2_3))
    assert ("self == oldSelf", "runtimeRef is immutable") in _messages(trainjobs(TrainerCompat.V2_1))
    assert ("self == oldSelf", "ManagedBy value is immutable") in _messages(trainjobs(TrainerCompat.V2_1))
