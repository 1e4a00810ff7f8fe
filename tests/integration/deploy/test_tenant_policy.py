"""deploy/policy with real kubectl on a devcluster: the two-tenant walk-through of docs/tenancy.md.

The trainer CRDs (deploy/crds) and the policy component (deploy/policy) are applied as a cluster
admin would; two tenant namespaces get their parameters; then TrainJobs are created with
``kubectl apply`` and what kubectl prints is compared with the text the documentation shows
(the same text kube-apiserver's policy plugin gives).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
POLICY = REPO / "deploy" / "policy"

pytestmark = pytest.mark.slow

TENANTS = """\
apiVersion: v1
kind: Namespace
metadata:
  name: team-a
  labels:
    trainyard.kubeflow.org/tenant: team-a
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: trainyard-tenant-policy
  namespace: team-a
data:
  allowedRuntimes: torch-distributed, torch-distributed-cpu
  maxNodes: "4"
  maxAccelerators: "8"
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-b
  labels:
    trainyard.kubeflow.org/tenant: team-b
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: trainyard-tenant-policy
  namespace: team-b
data:
  allowedRuntimes: torch-distributed-cpu
  maxNodes: "2"
  maxAccelerators: "0"
---
apiVersion: v1
kind: Namespace
metadata:
  name: team-c
  labels:
    trainyard.kubeflow.org/tenant: team-c
"""


def trainjob(name: str, namespace: str, runtime: str, nodes: int | None = 2, gpus: int | None = 1,
             managed_by: str | None = None) -> str:
    trainer: dict = {}
    if nodes is not None:
        trainer["numNodes"] = nodes
    if gpus is not None:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": gpus}}
    spec: dict = {"runtimeRef": {"name": runtime}, "trainer": trainer}
    if managed_by:
        spec["managedBy"] = managed_by
    return yaml.safe_dump({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                           "metadata": {"name": name, "namespace": namespace}, "spec": spec})


@pytest.fixture(scope="module")
def cluster(devcluster_module):
    c = devcluster_module
    c.kubectl("apply", "--server-side", "-k", str(REPO / "deploy" / "crds"), timeout=120)
    c.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    applied = c.kubectl("apply", "--server-side", "-k", str(POLICY)).stdout
    c.kubectl("apply", "-f", "-", input=TENANTS)
    return c, applied


def refused(c, manifest: str) -> str:
    result = c.kubectl("apply", "-f", "-", input=manifest, check=False)
    assert result.returncode == 1, result.stdout
    return result.stderr.strip()


def test_the_component_installs_every_policy_and_binding(cluster):
    c, applied = cluster
    rendered = [d for d in yaml.safe_load_all(c.kubectl("kustomize", str(POLICY)).stdout) if d]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in rendered) == sorted(
        [(k, n) for n in ("trainyard-tenant-runtimes", "trainyard-tenant-limits", "trainyard-managed-by",
                          "trainyard-tenant-parameters")
         for k in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")])
    assert applied.count("serverside-applied") == 8, applied
    names = c.kubectl("get", "validatingadmissionpolicies", "-o", "name").stdout.split()
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/trainyard-tenant-runtimes" in names
    # kube-apiserver's columns
    table = [line.split() for line in c.kubectl("get", "validatingadmissionpolicies").stdout.splitlines()]
    assert table[0] == ["NAME", "VALIDATIONS", "PARAMKIND", "AGE"]
    assert [row[:3] for row in table[1:]] == [["trainyard-managed-by", "1", "v1/ConfigMap"],
                                              ["trainyard-tenant-limits", "4", "v1/ConfigMap"],
                                              ["trainyard-tenant-parameters", "1", "<unset>"],
                                              ["trainyard-tenant-runtimes", "1", "v1/ConfigMap"]]
    table = [line.split() for line in c.kubectl("get", "validatingadmissionpolicybindings").stdout.splitlines()]
    assert table[0] == ["NAME", "POLICYNAME", "PARAMREF", "AGE"]
    assert table[1][:3] == ["trainyard-managed-by", "trainyard-managed-by", "*/trainyard-tenant-policy"]
    assert table[3][:3] == ["trainyard-tenant-parameters", "trainyard-tenant-parameters", "<unset>"]


def test_runtimes_a_tenant_may_reference(cluster):
    c, _ = cluster
    ok = c.kubectl("apply", "-f", "-", input=trainjob("train", "team-a", "torch-distributed"))
    assert ok.stdout.strip() == "trainjob.trainer.kubeflow.org/train created"
    assert refused(c, trainjob("train", "team-b", "torch-distributed", gpus=0)) == (
        'Error from server (Forbidden): error when creating "STDIN": trainjobs.trainer.kubeflow.org "train" is '
        "forbidden: ValidatingAdmissionPolicy 'trainyard-tenant-runtimes' with binding 'trainyard-tenant-runtimes' "
        "denied request: ClusterTrainingRuntime torch-distributed is not allowed in namespace team-b "
        "(allowed: torch-distributed-cpu)")
    ok = c.kubectl("apply", "-f", "-", input=trainjob("train", "team-b", "torch-distributed-cpu", gpus=0))
    assert ok.stdout.strip() == "trainjob.trainer.kubeflow.org/train created"


def test_a_namespace_without_parameters_is_refused(cluster):
    c, _ = cluster
    # 422 Invalid: kubectl prints it as a field error with an empty field, as against a real cluster
    # (which of the three policies answers first is not defined there; devcluster goes by name)
    assert refused(c, trainjob("train", "team-c", "torch-distributed-cpu", gpus=0)) == (
        'The trainjobs "train" is invalid: : ValidatingAdmissionPolicy \'trainyard-managed-by\' with binding '
        "'trainyard-managed-by' denied request: failed to configure binding: no params found for policy binding "
        "with `Deny` parameterNotFoundAction")


def test_node_and_accelerator_caps(cluster):
    c, _ = cluster
    prefix = ('Error from server (Forbidden): error when creating "STDIN": trainjobs.trainer.kubeflow.org "{}" is '
              "forbidden: ValidatingAdmissionPolicy 'trainyard-tenant-limits' with binding 'trainyard-tenant-limits' "
              "denied request: ")
    assert refused(c, trainjob("big", "team-a", "torch-distributed", nodes=5)) == prefix.format("big") + (
        "spec.trainer.numNodes 5 exceeds the cap of 4 nodes in namespace team-a")
    assert refused(c, trainjob("greedy", "team-a", "torch-distributed", nodes=3, gpus=4)) == prefix.format(
        "greedy") + "3 nodes x 4 nvidia.com/gpu = 12 exceeds the cap of 8 in namespace team-a"
    assert refused(c, trainjob("implicit", "team-a", "torch-distributed", nodes=None)) == prefix.format(
        "implicit") + ("spec.trainer.numNodes must be set: namespace team-a caps it at 4 and admission cannot see "
                       "the runtime default")
    assert refused(c, trainjob("nogpu", "team-b", "torch-distributed-cpu", gpus=None)) == prefix.format(
        "nogpu") + ("spec.trainer.resourcesPerNode must request nvidia.com/gpu (0 for none): namespace team-b caps "
                    "it at 0 per TrainJob and admission cannot see the runtime default")
    # an update is checked too
    patch = c.kubectl("patch", "trainjob", "train", "-n", "team-a", "--type=merge",
                      "-p", json.dumps({"spec": {"trainer": {"numNodes": 9}}}), check=False)
    assert patch.returncode == 1
    assert "denied request: spec.trainer.numNodes 9 exceeds the cap of 4 nodes in namespace team-a" in patch.stderr


def test_scale_requests_are_capped_too(cluster):
    c, _ = cluster
    resources = c.kubectl("api-resources", "--api-group=trainer.kubeflow.org", "-o", "wide").stdout
    crd = json.loads(c.kubectl("get", "crd", "trainjobs.trainer.kubeflow.org", "-o", "json").stdout)
    if not any("scale" in (v.get("subresources") or {}) for v in crd["spec"]["versions"]):
        pytest.skip(f"the TrainJob CRD has no scale subresource yet:\n{resources}")
    result = c.kubectl("scale", "trainjob/train", "-n", "team-a", "--replicas=6", check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (Forbidden): trainjobs.trainer.kubeflow.org "train" is forbidden: '
        "ValidatingAdmissionPolicy 'trainyard-tenant-limits' with binding 'trainyard-tenant-limits' denied request: "
        "replicas 6 exceeds the cap of 4 nodes in namespace team-a")


def test_managed_by_and_the_parameters_guard(cluster):
    c, _ = cluster
    multikueue = trainjob("delegated", "team-a", "torch-distributed", managed_by="kueue.x-k8s.io/multikueue")
    assert refused(c, multikueue) == (
        'Error from server (Forbidden): error when creating "STDIN": trainjobs.trainer.kubeflow.org "delegated" is '
        "forbidden: ValidatingAdmissionPolicy 'trainyard-managed-by' with binding 'trainyard-managed-by' denied "
        "request: user devcluster-admin may not set spec.managedBy to kueue.x-k8s.io/multikueue in namespace team-a")
    # the cluster admin (system:masters) may change the parameters; listing the group allows it
    c.kubectl("patch", "configmap", "trainyard-tenant-policy", "-n", "team-a", "--type=merge",
              "-p", json.dumps({"data": {"managedByGroups": "system:masters", "managedByUsers": "alice"}}))
    ok = c.kubectl("apply", "-f", "-", input=multikueue)
    assert ok.stdout.strip() == "trainjob.trainer.kubeflow.org/delegated created"


TENANT_RBAC = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: tenant-user
  namespace: team-a
rules:
  - apiGroups: ["trainer.kubeflow.org"]
    resources: ["trainjobs"]
    verbs: ["get", "list", "create", "patch"]
  - apiGroups: [""]
    resources: ["configmaps"]
    verbs: ["get", "list", "create", "patch", "update", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: tenant-users
  namespace: team-a
subjects:
  - {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
  - {kind: User, name: bob, apiGroup: rbac.authorization.k8s.io}
roleRef: {kind: Role, name: tenant-user, apiGroup: rbac.authorization.k8s.io}
"""


def test_impersonated_tenant_users(cluster):
    """request.userInfo is the impersonated user (kubectl --as): a listed user may set
    managedBy, another may not, and neither may change the tenant's parameters."""
    c, _ = cluster
    c.kubectl("apply", "-f", "-", input=TENANT_RBAC)
    job = trainjob("by-alice", "team-a", "torch-distributed", managed_by="kueue.x-k8s.io/multikueue")
    ok = c.kubectl("--as=alice", "apply", "-f", "-", input=job)
    assert ok.stdout.strip() == "trainjob.trainer.kubeflow.org/by-alice created"
    job = trainjob("by-bob", "team-a", "torch-distributed", managed_by="kueue.x-k8s.io/multikueue")
    result = c.kubectl("--as=bob", "apply", "-f", "-", input=job, check=False)
    assert result.returncode == 1
    assert result.stderr.strip().endswith(
        "denied request: user bob may not set spec.managedBy to kueue.x-k8s.io/multikueue in namespace team-a")
    result = c.kubectl("--as=alice", "patch", "configmap", "trainyard-tenant-policy", "-n", "team-a",
                       "--type=merge", "-p", json.dumps({"data": {"maxNodes": "100"}}), check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        'Error from server (Forbidden): configmaps "trainyard-tenant-policy" is forbidden: ValidatingAdmissionPolicy '
        "'trainyard-tenant-parameters' with binding 'trainyard-tenant-parameters' denied request: only cluster "
        "admins and trainyard:policy-admins may change trainyard-tenant-policy")
    result = c.kubectl("--as=alice", "delete", "configmap", "trainyard-tenant-policy", "-n", "team-a", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().endswith("denied request: only cluster admins and trainyard:policy-admins may "
                                          "change trainyard-tenant-policy")
    # other ConfigMaps of the tenant are not guarded
    c.kubectl("--as=alice", "create", "configmap", "notes", "-n", "team-a", "--from-literal=a=1")
    c.kubectl("--as=alice", "delete", "configmap", "notes", "-n", "team-a")


def test_updates_that_leave_the_trainer_alone_are_not_capped(cluster):
    """A TrainJob admitted before a cap existed keeps working: controllers' label and
    finalizer updates pass; a change of spec.trainer is checked against the cap."""
    c, _ = cluster
    params = ["configmap", "trainyard-tenant-policy", "-n", "team-a", "--type=json"]
    c.kubectl("patch", *params, "-p", json.dumps([{"op": "remove", "path": "/data/maxNodes"}]))
    c.kubectl("apply", "-f", "-", input=trainjob("older", "team-a", "torch-distributed", nodes=None))
    c.kubectl("patch", *params, "-p", json.dumps([{"op": "add", "path": "/data/maxNodes", "value": "4"}]))
    labelled = c.kubectl("label", "trainjob", "older", "-n", "team-a", "stage=two")
    assert labelled.stdout.strip() == "trainjob.trainer.kubeflow.org/older labeled"
    resized = c.kubectl("patch", "trainjob", "older", "-n", "team-a", "--type=merge",
                        "-p", json.dumps({"spec": {"trainer": {"numNodes": 8}}}), check=False)
    assert resized.returncode == 1
    assert "denied request: spec.trainer.numNodes 8 exceeds the cap of 4 nodes in namespace team-a" in resized.stderr


def test_the_component_composes_with_the_cluster_install(cluster, tmp_path):
    c, _ = cluster
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        # kustomize takes relative paths only
        "resources": [os.path.relpath(REPO / "deploy", overlay)], "components": [os.path.relpath(POLICY, overlay)]}))
    docs = [d for d in yaml.safe_load_all(c.kubectl("kustomize", str(overlay)).stdout) if d]
    kinds = [d["kind"] for d in docs]
    assert kinds.count("ValidatingAdmissionPolicy") == 4 and kinds.count("ValidatingAdmissionPolicyBinding") == 4
    assert "Deployment" in kinds and "ClusterTrainingRuntime" in kinds
