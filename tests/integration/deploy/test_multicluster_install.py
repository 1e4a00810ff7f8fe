"""The manager's multi-cluster install, run for real with kubectl on a fresh devcluster: the
MultiKueueCluster CRD (for a manager without Kueue), then deploy/ with the multicluster
component in an overlay, then a worker declared as docs/multicluster.md shows."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"

pytestmark = pytest.mark.slow


def test_manager_install_with_the_dispatcher_component(devcluster, tmp_path):
    devcluster.kubectl("apply", "--server-side", "-k", str(DEPLOY / "crds"), timeout=120)
    crd = devcluster.kubectl("apply", "--server-side", "-k", str(DEPLOY / "multicluster" / "crds"))
    assert "multikueueclusters.kueue.x-k8s.io serverside-applied" in crd.stdout
    devcluster.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")

    overlay = tmp_path / "manager"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(DEPLOY / "multicluster", overlay)],
        # What `kustomize edit set image trainyard=...` writes into a user's overlay: it names the
        # image of everything the overlay builds, the component's Deployment included.
        "images": [{"name": "trainyard", "newName": "registry.example.com/trainyard", "newTag": "0.1.0"}],
    }))
    devcluster.kubectl("apply", "--server-side", "-k", str(overlay), timeout=180)

    deployment = json.loads(devcluster.kubectl("get", "deployment", "trainyard-dispatcher", "-n", "kubeflow-system",
                                               "-o", "json").stdout)
    assert deployment["spec"]["replicas"] == 2
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/trainyard:0.1.0"
    assert container["args"] == ["dispatcher"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "trainyard-dispatcher"
    role = json.loads(devcluster.kubectl("get", "clusterrole", "trainyard-dispatcher", "-o", "json").stdout)
    granted = {(group, resource) for rule in role["rules"] for group in rule.get("apiGroups", [])
               for resource in rule.get("resources", [])}
    assert {("trainer.kubeflow.org", "trainjobs/finalizers"), ("trainer.kubeflow.org", "trainjobs/status"),
            ("kueue.x-k8s.io", "multikueueclusters/status")} <= granted
    assert not any("*" in rule.get("verbs", []) for rule in role["rules"])
    devcluster.kubectl("get", "poddisruptionbudget", "trainyard-dispatcher", "-n", "kubeflow-system")

    devcluster.kubectl("apply", "-f", str(DEPLOY / "multicluster" / "worker-example.yaml"))
    table = devcluster.kubectl("get", "multikueueclusters").stdout
    assert table.split("\n")[0].split()[:2] == ["NAME", "ACTIVE"]
    assert table.split("\n")[1].split()[0] == "worker-1"
    bad = devcluster.kubectl("apply", "-f", "-", check=False, input=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster", "metadata": {"name": "bad"},
        "spec": {"kubeConfig": {"locationType": "Elsewhere", "location": "x"}}}))
    assert bad.returncode != 0 and "spec.kubeConfig.locationType" in bad.stderr
