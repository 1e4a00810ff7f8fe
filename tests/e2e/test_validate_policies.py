"""`trainyard validate` enforces the ValidatingAdmissionPolicies among its files, offline, with
the texts kubectl shows against a cluster: deploy/policy with two tenants' parameters, the
requesting user from --as/--as-group, warnings, a binding kube-apiserver would refuse."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "deploy" / "policy"
RUNTIMES = REPO / "deploy" / "runtimes"

TENANT = """
apiVersion: v1
kind: Namespace
metadata: {name: team-b, labels: {trainyard.kubeflow.org/tenant: team-b}}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: trainyard-tenant-policy, namespace: team-b}
data: {allowedRuntimes: torch-distributed-cpu, maxNodes: "2", maxAccelerators: "0", managedByUsers: alice}
"""


def trainjob(name: str, runtime: str, nodes: int = 1, managed_by: str | None = None) -> str:
    spec: dict = {"runtimeRef": {"name": runtime},
                  "trainer": {"numNodes": nodes, "resourcesPerNode": {"limits": {"nvidia.com/gpu": 0}}}}
    if managed_by:
        spec["managedBy"] = managed_by
    return yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                           "metadata": {"name": name, "namespace": "team-b"}, "spec": spec})


def validate(tmp_path: Path, *docs: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("\n---\n".join(docs))
    tenant = tmp_path / "tenant.yaml"
    tenant.write_text(TENANT)
    return subprocess.run([sys.executable, "-m", "trainyard.cli.main", "validate", "-f", str(POLICY), "-f", str(tenant),
                           "-f", str(jobs), "--runtimes", str(RUNTIMES), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_deploy_policy_offline(tmp_path: Path) -> None:
    result = validate(tmp_path, trainjob("cpu", "torch-distributed-cpu", 2), trainjob("gpu", "torch-distributed"),
                      trainjob("wide", "torch-distributed-cpu", 3),
                      trainjob("handed", "torch-distributed-cpu", managed_by="kueue.x-k8s.io/multikueue"))
    assert result.returncode == 1
    assert result.stdout.splitlines() == ["trainjob.trainer.kubeflow.org/cpu accepted (create)"]
    where = str(tmp_path / "jobs.yaml")
    prefix = 'Error from server (Forbidden): error when creating "{}": trainjobs.trainer.kubeflow.org "{}" is forbidden: '
    assert result.stderr.splitlines() == [
        prefix.format(f"{where} (document 2)", "gpu") + "ValidatingAdmissionPolicy 'trainyard-tenant-runtimes' with "
        "binding 'trainyard-tenant-runtimes' denied request: ClusterTrainingRuntime torch-distributed is not allowed "
        "in namespace team-b (allowed: torch-distributed-cpu)",
        prefix.format(f"{where} (document 3)", "wide") + "ValidatingAdmissionPolicy 'trainyard-tenant-limits' with "
        "binding 'trainyard-tenant-limits' denied request: spec.trainer.numNodes 3 exceeds the cap of 2 nodes in "
        "namespace team-b",
        prefix.format(f"{where} (document 4)", "handed") + "ValidatingAdmissionPolicy 'trainyard-managed-by' with "
        "binding 'trainyard-managed-by' denied request: user trainyard-validate may not set spec.managedBy to "
        "kueue.x-k8s.io/multikueue in namespace team-b"]
    # the listed user may hand the TrainJob over
    as_alice = validate(tmp_path, trainjob("handed", "torch-distributed-cpu", managed_by="kueue.x-k8s.io/multikueue"),
                        args=("--as", "alice", "--as-group", "team-b-users"))
    assert as_alice.returncode == 0, as_alice.stderr
    assert as_alice.stdout.strip() == "trainjob.trainer.kubeflow.org/handed accepted (create)"


def test_warnings_and_a_binding_kube_apiserver_would_refuse(tmp_path: Path) -> None:
    warn = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: labelled}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [trainer.kubeflow.org], apiVersions: ["*"], operations: [CREATE], resources: [trainjobs]}
  validations:
  - {expression: "has(object.metadata.labels) && 'team' in object.metadata.labels", message: label the team}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: labelled}
spec: {policyName: labelled, validationActions: [%s]}
"""
    result = validate(tmp_path, trainjob("cpu", "torch-distributed-cpu"), warn % "Warn")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == ("Warning: Validation failed for ValidatingAdmissionPolicy 'labelled' with "
                                     "binding 'labelled': label the team")
    refused = validate(tmp_path, trainjob("cpu", "torch-distributed-cpu"), warn % "Deny, Warn")
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'error: ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io "labelled" is invalid: '
        'spec.validationActions: Invalid value: ["Deny", "Warn"]: must not contain both Deny and Warn (repeating '
        "the same validation failure information in the API response and headers serves no purpose)")
