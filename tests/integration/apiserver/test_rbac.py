"""devcluster authentication and RBAC with the real kubectl: deploy/'s ServiceAccounts and roles
applied the way `trainyard up` applies them, `kubectl auth can-i` per service identity against
what deploy/services/rbac.yaml (and the dispatcher's role) grant, ServiceAccount tokens,
bad and expired tokens, impersonation (`--as`, `--as-group`), non-resource URLs and
kube-apiserver's refusal texts."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.supervisor import identities
from trainyard.roles import CLUSTER_ROLES

REPO = Path(__file__).resolve().parents[3]
SYSTEM = "kubeflow-system"
SERVICES = list(CLUSTER_ROLES)
TJ = "trainjobs.trainer.kubeflow.org"


# The kinds the roles name, served so that kubectl resolves them (schemas do not matter here).
KINDS = [("trainer.kubeflow.org", "trainjobs", "TrainJob", "Namespaced"),
         ("trainer.kubeflow.org", "trainingruntimes", "TrainingRuntime", "Namespaced"),
         ("trainer.kubeflow.org", "clustertrainingruntimes", "ClusterTrainingRuntime", "Cluster"),
         ("jobset.x-k8s.io", "jobsets", "JobSet", "Namespaced"),
         ("scheduling.x-k8s.io", "podgroups", "PodGroup", "Namespaced"),
         ("kueue.x-k8s.io", "multikueueclusters", "MultiKueueCluster", "Cluster")]


def crd(group: str, plural: str, kind: str, scope: str) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": scope,
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": kind + "List"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture(scope="module")
def cluster(devcluster_module, tmp_path_factory):
    """One devcluster with deploy/'s RBAC and a kubeconfig per service identity."""
    devcluster_module.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(crd(*kind)) for kind in KINDS))
    out = tmp_path_factory.mktemp("identities")
    devcluster_module.identities = asyncio.run(identities.prepare(
        devcluster_module.kubeconfig, REPO / "deploy", out, SERVICES, dispatcher=True, worker=True))
    devcluster_module.kubectl("create", "namespace", "team")
    return devcluster_module


def http(cluster, token: str | None = None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return cluster.client(token=None, headers=headers, timeout=10)


def can_i(cluster, identity: str, *args: str) -> bool:
    """``kubectl auth can-i ... --as=system:serviceaccount:kubeflow-system:trainyard-<identity>``."""
    result = cluster.kubectl("auth", "can-i", *args, f"--as=system:serviceaccount:{SYSTEM}:trainyard-{identity}",
                             check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


# (identity, kubectl auth can-i arguments, allowed): each row is a line of deploy/'s RBAC or a
# request just outside it.
CAN_I = [
    ("watcher", ("list", TJ, "-A"), True),
    ("watcher", ("watch", "jobsets.jobset.x-k8s.io", "-A"), True),
    ("watcher", ("watch", "secrets", "-n", "team"), True),
    ("watcher", ("get", "priorityclasses.scheduling.k8s.io"), True),
    ("watcher", ("create", TJ, "-n", "team"), False),
    ("watcher", ("update", TJ, "--subresource=status", "-n", "team"), False),
    ("watcher", ("patch", "jobsets.jobset.x-k8s.io", "-n", "team"), False),
    ("watcher", ("list", "pods", "-A"), False),
    ("planner", ("get", "clustertrainingruntimes.trainer.kubeflow.org"), True),
    ("planner", ("list", "trainingruntimes.trainer.kubeflow.org", "-n", "team"), False),
    ("planner", ("get", "jobsets.jobset.x-k8s.io", "-n", "team"), True),
    ("planner", ("watch", "jobsets.jobset.x-k8s.io", "-n", "team"), False),
    ("planner", ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io/validator.trainer.kubeflow.org"),
     True),
    ("planner", ("patch", "validatingwebhookconfigurations.admissionregistration.k8s.io/someone-else"), False),
    ("planner", ("create", "validatingwebhookconfigurations.admissionregistration.k8s.io"), True),
    ("planner", ("update", "secrets/kubeflow-trainer-webhook-cert", "-n", SYSTEM), True),
    ("planner", ("get", "secrets/another-secret", "-n", SYSTEM), False),
    ("planner", ("get", "secrets/kubeflow-trainer-webhook-cert", "-n", "team"), False),
    ("planner", ("list", "secrets", "-n", SYSTEM), False),
    ("planner", ("create", "secrets", "-n", SYSTEM), True),
    ("applier", ("create", "jobsets.jobset.x-k8s.io", "-n", "team"), True),
    ("applier", ("delete", "podgroups.scheduling.x-k8s.io", "-n", "team"), True),
    ("applier", ("patch", "configmaps", "-n", "team"), True),
    ("applier", ("update", TJ, "--subresource=finalizers", "-n", "team"), True),
    ("applier", ("patch", TJ, "--subresource=finalizers", "-n", "team"), False),
    ("applier", ("update", TJ, "-n", "team"), False),
    ("applier", ("list", "jobsets.jobset.x-k8s.io", "-n", "team"), False),
    ("applier", ("create", "events", "-n", "team"), True),
    ("status", ("update", TJ, "--subresource=status", "-n", "team"), True),
    ("status", ("patch", TJ, "--subresource=status", "-n", "team"), True),
    ("status", ("update", TJ, "-n", "team"), False),
    ("status", ("delete", TJ, "-n", "team"), True),  # past its TTL after finished
    ("status", ("delete", "jobsets.jobset.x-k8s.io", "-n", "team"), True),  # past its deadline
    ("status", ("create", "jobsets.jobset.x-k8s.io", "-n", "team"), False),
    ("status", ("patch", "clustertrainingruntimes.trainer.kubeflow.org"), True),
    ("status", ("get", "secrets", "-n", "team"), False),
    ("dispatcher", ("watch", TJ, "-A"), True),
    ("dispatcher", ("patch", TJ, "--subresource=status", "-n", "team"), True),
    ("dispatcher", ("delete", TJ, "-n", "team"), False),
    ("dispatcher", ("update", "multikueueclusters.kueue.x-k8s.io", "--subresource=status"), True),
    ("dispatcher", ("get", "/apis/kueue.x-k8s.io/v1beta1"), True),
    ("dispatcher", ("get", "/metrics"), False),
    # the manager's dispatcher on a worker (deploy/multicluster/worker-rbac.yaml)
    ("dispatcher-remote", ("create", TJ, "-n", "team"), True),
    ("dispatcher-remote", ("update", TJ, "--subresource=status", "-n", "team"), False),
    ("dispatcher-remote", ("list", "pods", "-A"), True),
    ("dispatcher-remote", ("watch", "pods", "-A"), True),  # the capacity summary's watch
    ("dispatcher-remote", ("delete", "pods", "-n", "team"), False),
    ("dispatcher-remote", ("patch", "secrets", "-n", "team"), True),
    ("dispatcher-remote", ("delete", "secrets", "-n", "team"), False),
]


@pytest.mark.parametrize("identity,args,allowed", CAN_I, ids=[f"{r[0]}-{'-'.join(r[1][:2])}-{r[2]}" for r in CAN_I])
def test_can_i_per_service_identity(cluster, identity, args, allowed) -> None:
    assert can_i(cluster, identity, *args) is allowed


def test_every_rule_shipped_in_deploy_is_granted(cluster) -> None:
    """Each verb x group x resource x name of each shipped role, asked as its ServiceAccount
    through SubjectAccessReview: all allowed (the roles are bound as deploy/ binds them)."""
    docs = identities.rbac_manifests(REPO / "deploy", dispatcher=True, worker=True)
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    asked = 0
    with http(cluster, cluster.token) as client:
        for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
            role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
            namespace = binding["metadata"].get("namespace", "team")
            for subject in binding["subjects"]:
                user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
                for rule in role["rules"]:
                    for verb in rule["verbs"]:
                        for group in rule.get("apiGroups", []):
                            for resource in rule.get("resources", []):
                                name = (rule.get("resourceNames") or [""])[0]
                                resource, _, sub = resource.partition("/")
                                attributes = {"resourceAttributes": {"namespace": namespace, "verb": verb,
                                              "group": group, "resource": resource, "subresource": sub,
                                              "name": name}}
                                review = client.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={
                                    "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                    "spec": {"user": user, **attributes}}).json()
                                assert review["status"]["allowed"], (user, attributes)
                                asked += 1
                        for url in rule.get("nonResourceURLs", []):
                            review = client.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={
                                "kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
                                "spec": {"user": user, "nonResourceAttributes": {"path": url.replace("*", "x"),
                                                                                "verb": verb}}}).json()
                            assert review["status"]["allowed"], (user, url)
                            asked += 1
    assert asked > 80


def test_a_service_token_authenticates_and_is_refused_outside_its_role(cluster) -> None:
    watcher = cluster.identities["watcher"]
    who = json.loads(cluster.kubectl("--kubeconfig", str(watcher), "auth", "whoami", "-o", "json").stdout)
    assert who["status"]["userInfo"]["username"] == f"system:serviceaccount:{SYSTEM}:trainyard-watcher"
    assert who["status"]["userInfo"]["groups"] == ["system:serviceaccounts", f"system:serviceaccounts:{SYSTEM}",
                                                   "system:authenticated"]
    assert cluster.kubectl("--kubeconfig", str(watcher), "get", "secrets", "-n", "team").returncode == 0
    refused = cluster.kubectl("--kubeconfig", str(watcher), "delete", "configmap", "kube-root-ca.crt", "-n", "team",
                              check=False)
    assert refused.returncode != 0
    assert ('Error from server (Forbidden): configmaps "kube-root-ca.crt" is forbidden: User '
            f'"system:serviceaccount:{SYSTEM}:trainyard-watcher" cannot delete resource "configmaps" in API group "" '
            'in the namespace "team"') in refused.stderr
    listed = cluster.kubectl("--kubeconfig", str(watcher), "get", "pods", "-A", check=False)
    assert ('pods is forbidden: User "system:serviceaccount:kubeflow-system:trainyard-watcher" cannot list resource '
            '"pods" in API group "" at the cluster scope') in listed.stderr
    rules = cluster.kubectl("--kubeconfig", str(watcher), "auth", "can-i", "--list", "-n", "team").stdout
    assert "trainjobs.trainer.kubeflow.org" in rules and "[get list watch]" in rules


def test_bad_expired_and_orphaned_tokens_are_401(cluster) -> None:
    unauthorized = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Unauthorized", "reason": "Unauthorized", "code": 401}
    key = sat.SigningKey.from_pem((cluster.data_dir / "sa-signing.key").read_bytes())
    cluster.kubectl("create", "serviceaccount", "short-lived", "-n", "team")
    account = json.loads(cluster.kubectl("get", "sa", "short-lived", "-n", "team", "-o", "json").stdout)
    expired = sat.issue(key, issuer=cluster.url, namespace="team", service_account="short-lived",
                        service_account_uid=account["metadata"]["uid"], audiences=[cluster.url],
                        expiration_seconds=600, now=int(time.time()) - 3600)
    foreign = sat.issue(sat.SigningKey.generate(), issuer=cluster.url, namespace="team", service_account="short-lived",
                        service_account_uid=account["metadata"]["uid"], audiences=[cluster.url],
                        expiration_seconds=600, now=int(time.time()))
    other_audience = cluster.kubectl("create", "token", "short-lived", "-n", "team", "--audience", "elsewhere").stdout
    valid = cluster.kubectl("create", "token", "short-lived", "-n", "team").stdout.strip()
    for token in ("not-a-token", expired, foreign, other_audience.strip()):
        with http(cluster, token) as client:
            answer = client.get("/api/v1/namespaces/team/configmaps")
            assert (answer.status_code, answer.json()) == (401, unauthorized)
    with http(cluster, valid) as client:
        assert client.get("/apis").status_code == 200
        cluster.kubectl("delete", "serviceaccount", "short-lived", "-n", "team")
        assert client.get("/apis").status_code == 401  # its ServiceAccount is gone
    refused = cluster.kubectl("--token", "not-a-token", "get", "pods", check=False)
    assert "error: You must be logged in to the server (Unauthorized)" in refused.stderr


def test_non_resource_urls_and_the_forbidden_status(cluster) -> None:
    token = cluster.kubectl("create", "token", "trainyard-status", "-n", SYSTEM).stdout.strip()
    with http(cluster, token) as client:
        for path in ("/version", "/healthz", "/api", "/apis", "/apis/trainer.kubeflow.org", "/openapi/v3"):
            assert client.get(path).status_code == 200, path
        metrics = client.get("/metrics")
        assert metrics.status_code == 403
        assert metrics.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                  "message": 'forbidden: User "system:serviceaccount:kubeflow-system:trainyard-status" '
                                             'cannot get path "/metrics"', "reason": "Forbidden", "code": 403}
        denied = client.put("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs/j", json={})
        assert denied.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": 'trainjobs.trainer.kubeflow.org "j" is forbidden: User '
                       '"system:serviceaccount:kubeflow-system:trainyard-status" cannot update resource "trainjobs" '
                       'in API group "trainer.kubeflow.org" in the namespace "team"',
            "reason": "Forbidden", "details": {"name": "j", "group": "trainer.kubeflow.org", "kind": "trainjobs"},
            "code": 403}


def test_impersonation_is_authorized_by_the_impersonate_verb(cluster) -> None:
    cluster.kubectl("create", "serviceaccount", "operator", "-n", "team")
    cluster.kubectl("create", "role", "impersonate-watcher", "-n", SYSTEM, "--verb=impersonate",
                    "--resource=serviceaccounts", "--resource-name=trainyard-watcher")
    cluster.kubectl("create", "rolebinding", "operator-impersonates", "-n", SYSTEM, "--role=impersonate-watcher",
                    "--serviceaccount=team:operator")
    token = cluster.kubectl("create", "token", "operator", "-n", "team").stdout.strip()
    as_watcher = cluster.kubectl("--token", token, "get", "secrets", "-n", "team", "-o", "name",
                                 f"--as=system:serviceaccount:{SYSTEM}:trainyard-watcher")
    assert as_watcher.returncode == 0
    assert cluster.kubectl("--token", token, "get", "secrets", "-n", "team", check=False).returncode != 0
    refused = cluster.kubectl("--token", token, "get", "secrets", "-n", "team",
                              f"--as=system:serviceaccount:{SYSTEM}:trainyard-applier", check=False)
    assert ('serviceaccounts "trainyard-applier" is forbidden: User "system:serviceaccount:team:operator" cannot '
            'impersonate resource "serviceaccounts" in API group "" in the namespace "kubeflow-system"') in refused.stderr
    escalate = cluster.kubectl("--token", token, "get", "secrets", f"--as=system:serviceaccount:{SYSTEM}:trainyard-watcher",
                               "--as-group=system:masters", check=False)
    assert ('groups "system:masters" is forbidden: User "system:serviceaccount:team:operator" cannot impersonate '
            'resource "groups" in API group "" at the cluster scope') in escalate.stderr
    # the administrator may impersonate anyone; the request is then judged as that user
    jane = cluster.kubectl("get", "pods", "-n", "team", "--as=jane", "--as-group=developers", check=False)
    assert 'pods is forbidden: User "jane" cannot list resource "pods" in API group "" in the namespace "team"' \
        in jane.stderr
    assert cluster.kubectl("auth", "can-i", "get", "pods", "--as=jane", check=False).stdout.strip() == "no"
    cluster.kubectl("create", "rolebinding", "devs-view", "-n", "team", "--clusterrole=view", "--group=developers")
    assert cluster.kubectl("get", "pods", "-n", "team", "--as=jane", "--as-group=developers").returncode == 0
    whoami = json.loads(cluster.kubectl("auth", "whoami", "--as=jane", "--as-group=developers", "-o", "json").stdout)
    assert whoami["status"]["userInfo"] == {"username": "jane", "groups": ["developers", "system:authenticated"]}


def test_bootstrap_roles_and_subject_access_review(cluster) -> None:
    roles = set(cluster.kubectl("get", "clusterroles", "-o", "name").stdout.split())
    assert {"clusterrole.rbac.authorization.k8s.io/" + n for n in
            ("cluster-admin", "admin", "edit", "view", "system:discovery", "system:basic-user",
             "system:public-info-viewer")} <= roles
    assert cluster.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"  # system:masters
    cluster.kubectl("create", "rolebinding", "readers-view", "-n", "team", "--clusterrole=view", "--group=readers")
    with http(cluster, cluster.token) as client:
        review = client.post("/apis/authorization.k8s.io/v1/namespaces/team/localsubjectaccessreviews", json={
            "apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
            "metadata": {"namespace": "team"},
            "spec": {"user": "ann", "groups": ["readers"],
                     "resourceAttributes": {"verb": "list", "resource": "pods"}}}).json()
        assert review["status"] == {"allowed": True, "reason": 'RBAC: allowed by RoleBinding "readers-view/team" of '
                                                              'ClusterRole "view" to Group "readers"'}
        empty = client.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}})
        assert empty.status_code == 422 and "at least one of user or group must be specified" in empty.json()["message"]


def test_server_side_apply_that_creates_needs_create(cluster) -> None:
    """trainyard-status may patch runtimes (their finalizer) but not create them: an apply of a
    runtime that does not exist is refused, one of an existing runtime goes through."""
    runtime = {"apiVersion": "trainer.kubeflow.org/v1", "kind": "ClusterTrainingRuntime",
               "metadata": {"name": "brand-new"}, "spec": {}}
    as_status = f"--as=system:serviceaccount:{SYSTEM}:trainyard-status"
    refused = cluster.kubectl("apply", "--server-side", "-f", "-", as_status, input=json.dumps(runtime), check=False)
    assert 'clustertrainingruntimes.trainer.kubeflow.org "brand-new" is forbidden' in refused.stderr
    cluster.kubectl("create", "-f", "-", input=json.dumps(runtime))
    runtime["metadata"]["labels"] = {"seen-by": "status"}
    cluster.kubectl("apply", "--server-side", "-f", "-", as_status, input=json.dumps(runtime))


def test_roles_and_bindings_cannot_grant_more_than_their_writer_holds(cluster) -> None:
    """Escalation prevention: a namespace admin may bind view, not cluster-admin, and may not write
    a Role with rights it lacks; roleRef cannot change."""
    cluster.kubectl("create", "serviceaccount", "lead", "-n", "team")
    cluster.kubectl("create", "rolebinding", "lead-admin", "-n", "team", "--clusterrole=admin",
                    "--serviceaccount=team:lead")
    as_lead = "--as=system:serviceaccount:team:lead"
    cluster.kubectl("create", "rolebinding", "lead-grants-view", "-n", "team", "--clusterrole=view",
                    "--user=intern", as_lead)
    refused = cluster.kubectl("create", "rolebinding", "lead-grants-all", "-n", "team", "--clusterrole=cluster-admin",
                              "--user=intern", as_lead, check=False)
    assert ('rolebindings.rbac.authorization.k8s.io "lead-grants-all" is forbidden: user '
            '"system:serviceaccount:team:lead" (groups=["system:serviceaccounts" "system:serviceaccounts:team" '
            '"system:authenticated"]) is attempting to grant RBAC permissions not currently held:\n'
            '{APIGroups:["*"], Resources:["*"], Verbs:["*"]}') in refused.stderr
    nodes = cluster.kubectl("create", "role", "node-reader", "-n", "team", "--verb=get", "--resource=nodes", as_lead,
                            check=False)
    assert '{APIGroups:[""], Resources:["nodes"], Verbs:["get"]}' in nodes.stderr
    cluster.kubectl("create", "role", "pod-reader", "-n", "team", "--verb=get", "--resource=pods", as_lead)
    changed = cluster.kubectl("patch", "rolebinding", "lead-grants-view", "-n", "team", "--type=merge",
                              "-p", '{"roleRef": {"name": "edit"}}', check=False)
    assert ('roleRef: Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", Kind:"ClusterRole", '
            'Name:"edit"}: cannot change roleRef') in changed.stderr


def test_authorization_mode_always_allow_still_authenticates(tmp_path, api_workers: int) -> None:
    from fixtures.devcluster import start_devcluster

    server = start_devcluster(tmp_path / "open", ["--authorization-mode", "AlwaysAllow", "--api-workers", str(api_workers)])
    try:
        server.kubectl("create", "serviceaccount", "anyone")
        token = server.kubectl("create", "token", "anyone").stdout.strip()
        assert server.kubectl("--token", token, "get", "secrets", "-A").returncode == 0
        assert server.kubectl("--token", token, "auth", "can-i", "delete", "nodes").stdout.strip() == "yes"
        refused = server.kubectl("--token", "not-a-token", "get", "pods", check=False)
        assert "(Unauthorized)" in refused.stderr
    finally:
        server.stop()
    bad = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "devcluster", "up", "--authorization-mode", "ABAC",
                          "--data-dir", str(tmp_path / "x")], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "invalid choice: 'ABAC'" in bad.stderr
