"""Kubernetes RBAC semantics, pure: request attributes from URLs, rule matching, subjects,
bindings, refusal texts and impersonation (facts from the Kubernetes RBAC and authorization
docs: verbs from methods, ``*`` and ``*/subresource``, resourceNames never matching list or
create, non-resource URL prefixes, RoleBindings to ClusterRoles, ServiceAccount subjects)."""
from __future__ import annotations

import pytest

from trainyard.apimachinery import rbac, rbac_bootstrap

ALICE = rbac.UserInfo("alice", ("dev", rbac.AUTHENTICATED))
BOT = rbac.service_account_user("team-a", "bot")


def attrs(method: str, path: str, query: dict[str, str] | None = None, user: rbac.UserInfo = ALICE) -> rbac.Attributes:
    return rbac.request_info(user, method, path, query or {})


@pytest.mark.parametrize("method,path,query,expected", [
    ("GET", "/api/v1/namespaces/ns/pods", {}, ("list", "ns", "", "pods", "", "")),
    ("GET", "/api/v1/namespaces/ns/pods", {"watch": "true"}, ("watch", "ns", "", "pods", "", "")),
    ("GET", "/api/v1/namespaces/ns/pods", {"watch": "1", "fieldSelector": "metadata.name=p"},
     ("watch", "ns", "", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/ns/pods", {"fieldSelector": "metadata.name==p,status.phase=Running"},
     ("list", "ns", "", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/ns/pods", {"fieldSelector": "metadata.name!=p"}, ("list", "ns", "", "pods", "", "")),
    ("HEAD", "/api/v1/namespaces/ns/pods/p", {}, ("get", "ns", "", "pods", "", "p")),
    ("GET", "/api/v1/namespaces/ns/pods/p/log", {}, ("get", "ns", "", "pods", "log", "p")),
    ("POST", "/api/v1/namespaces/ns/pods", {}, ("create", "ns", "", "pods", "", "")),
    ("PUT", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/j/status", {},
     ("update", "ns", "trainer.kubeflow.org", "trainjobs", "status", "j")),
    ("PATCH", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets/j", {},
     ("patch", "ns", "jobset.x-k8s.io", "jobsets", "", "j")),
    ("DELETE", "/apis/batch/v1/namespaces/ns/jobs/j", {}, ("delete", "ns", "batch", "jobs", "", "j")),
    ("DELETE", "/apis/batch/v1/namespaces/ns/jobs", {}, ("deletecollection", "ns", "batch", "jobs", "", "")),
    ("GET", "/apis/trainer.kubeflow.org/v1alpha1/trainjobs", {}, ("list", "", "trainer.kubeflow.org", "trainjobs", "", "")),
    ("GET", "/api/v1/nodes/n1", {}, ("get", "", "", "nodes", "", "n1")),
    # the Namespace object is in its own namespace; status and finalize are its subresources
    ("GET", "/api/v1/namespaces/ns", {}, ("get", "ns", "", "namespaces", "", "ns")),
    ("PUT", "/api/v1/namespaces/ns/finalize", {}, ("update", "ns", "", "namespaces", "finalize", "ns")),
    ("GET", "/api/v1/namespaces", {}, ("list", "", "", "namespaces", "", "")),
    ("POST", "/api/v1/namespaces/ns/serviceaccounts/sa/token", {}, ("create", "ns", "", "serviceaccounts", "token", "sa")),
    ("GET", "/api/v1/watch/namespaces/ns/pods", {}, ("watch", "ns", "", "pods", "", "")),
])
def test_resource_request_attributes(method, path, query, expected) -> None:
    got = attrs(method, path, query)
    assert got.resource_request
    assert (got.verb, got.namespace, got.api_group, got.resource, got.subresource, got.name) == expected


@pytest.mark.parametrize("method,path,verb", [
    ("GET", "/healthz", "get"), ("GET", "/api", "get"), ("GET", "/api/v1", "get"), ("GET", "/apis", "get"),
    ("GET", "/apis/trainer.kubeflow.org", "get"), ("GET", "/apis/trainer.kubeflow.org/v1alpha1", "get"),
    ("GET", "/openapi/v3/apis/batch/v1", "get"), ("POST", "/metrics", "post"), ("GET", "/", "get"),
])
def test_non_resource_request_attributes(method, path, verb) -> None:
    got = attrs(method, path)
    assert not got.resource_request and got.verb == verb and got.path == path


RULE_CASES = [
    # (rule, request attributes, allowed)
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, ("get", "ns", "", "pods", "", "p"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, ("list", "ns", "", "pods", "", ""), False),
    ({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}, ("deletecollection", "ns", "", "pods", "", ""), True),
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}, ("get", "", "batch", "jobs", "", "j"), True),
    ({"verbs": ["get"], "apiGroups": ["apps"], "resources": ["pods"]}, ("get", "ns", "", "pods", "", "p"), False),
    # a subresource is its own resource: pods does not grant pods/log, and * grants both
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}, ("get", "ns", "", "pods", "log", "p"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}, ("get", "ns", "", "pods", "log", "p"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}, ("get", "ns", "", "pods", "", "p"), False),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["*"]}, ("get", "ns", "", "pods", "log", "p"), True),
    ({"verbs": ["update"], "apiGroups": ["*"], "resources": ["*/status"]},
     ("update", "ns", "trainer.kubeflow.org", "trainjobs", "status", "j"), True),
    ({"verbs": ["update"], "apiGroups": ["*"], "resources": ["*/status"]},
     ("update", "ns", "trainer.kubeflow.org", "trainjobs", "", "j"), False),
    # resourceNames: only requests naming one of them
    ({"verbs": ["get", "update", "list", "create"], "apiGroups": [""], "resources": ["secrets"],
      "resourceNames": ["cert"]}, ("get", "ns", "", "secrets", "", "cert"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cert"]},
     ("get", "ns", "", "secrets", "", "other"), False),
    ({"verbs": ["list"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cert"]},
     ("list", "ns", "", "secrets", "", ""), False),
    ({"verbs": ["create"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cert"]},
     ("create", "ns", "", "secrets", "", ""), False),
    ({"verbs": ["watch"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cert"]},
     ("watch", "ns", "", "secrets", "", "cert"), True),
    # a resource rule never grants a non-resource URL and the other way round
    ({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}, ("get", "/healthz"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, ("get", "/healthz"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, ("get", "/healthz/etcd"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz/*"]}, ("get", "/healthz/etcd"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/apis/kueue.x-k8s.io", "/apis/kueue.x-k8s.io/*"]},
     ("get", "/apis/kueue.x-k8s.io/v1beta1"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["*"]}, ("get", "/anything/at/all"), True),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, ("post", "/healthz"), False),
    ({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}, ("get", "/healthz", "resource"), False),
]


@pytest.mark.parametrize("rule,request_parts,allowed", RULE_CASES)
def test_rule_matching(rule, request_parts, allowed) -> None:
    if len(request_parts) == 2:
        request = rbac.Attributes(ALICE, request_parts[0], False, path=request_parts[1])
    elif len(request_parts) == 3:  # a resource request with a resource named like the URL
        request = rbac.Attributes(ALICE, request_parts[0], True, "", "", request_parts[1].strip("/"))
    else:
        verb, ns, group, resource, sub, name = request_parts
        request = rbac.Attributes(ALICE, verb, True, ns, group, resource, sub, name)
    assert rbac.rule_allows(request, rule) is allowed


def _role(kind: str, name: str, rules: list[dict], namespace: str = "") -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "rules": rules}


def _binding(kind: str, name: str, role_kind: str, role: str, subjects: list[dict], namespace: str = "") -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role}, "subjects": subjects}


@pytest.fixture(scope="module")
def policy() -> rbac.Policy:
    read_pods = _role("ClusterRole", "pod-reader", [{"verbs": ["get", "list", "watch"], "apiGroups": [""],
                                                     "resources": ["pods"]}])
    secrets = _role("Role", "secret-writer", [{"verbs": ["create"], "apiGroups": [""], "resources": ["secrets"]}], "team-a")
    nodes = _role("ClusterRole", "node-reader", [{"verbs": ["get"], "apiGroups": [""], "resources": ["nodes"]}])
    return rbac.Policy(
        roles=[secrets],
        cluster_roles=[read_pods, nodes, *rbac_bootstrap.cluster_roles()],
        role_bindings=[
            _binding("RoleBinding", "dev-reads-pods", "ClusterRole", "pod-reader",
                     [{"kind": "Group", "name": "dev", "apiGroup": "rbac.authorization.k8s.io"}], "team-a"),
            # a ServiceAccount subject without a namespace is the binding's namespace's
            _binding("RoleBinding", "bot-writes-secrets", "Role", "secret-writer",
                     [{"kind": "ServiceAccount", "name": "bot"}], "team-a"),
            # a RoleBinding to a ClusterRole grants only namespaced resources of its namespace
            _binding("RoleBinding", "bot-nodes", "ClusterRole", "node-reader",
                     [{"kind": "ServiceAccount", "name": "bot", "namespace": "team-a"}], "team-a"),
            _binding("RoleBinding", "dangling", "Role", "gone", [{"kind": "User", "name": "carol"}], "team-b"),
        ],
        cluster_role_bindings=[*rbac_bootstrap.cluster_role_bindings(),
                               _binding("ClusterRoleBinding", "ops-view", "ClusterRole", "view",
                                        [{"kind": "User", "name": "olga"}])],
    )


@pytest.mark.parametrize("user,method,path,query,allowed", [
    (ALICE, "GET", "/api/v1/namespaces/team-a/pods", {}, True),
    (ALICE, "GET", "/api/v1/namespaces/team-a/pods", {"watch": "true"}, True),
    (ALICE, "GET", "/api/v1/namespaces/team-b/pods", {}, False),
    (ALICE, "GET", "/api/v1/pods", {}, False),  # every namespace needs a ClusterRoleBinding
    (ALICE, "DELETE", "/api/v1/namespaces/team-a/pods/p", {}, False),
    (ALICE, "GET", "/api/v1/namespaces/team-a/pods/p/log", {}, False),
    (BOT, "POST", "/api/v1/namespaces/team-a/secrets", {}, True),
    (BOT, "POST", "/api/v1/namespaces/team-b/secrets", {}, False),
    (BOT, "GET", "/api/v1/nodes/n1", {}, False),
    (rbac.service_account_user("team-b", "bot"), "POST", "/api/v1/namespaces/team-a/secrets", {}, False),
    (rbac.UserInfo("olga", (rbac.AUTHENTICATED,)), "GET", "/apis/apps/v1/deployments", {}, True),
    (rbac.UserInfo("olga", (rbac.AUTHENTICATED,)), "GET", "/api/v1/namespaces/x/secrets", {}, False),
    (rbac.UserInfo("root", (rbac.SYSTEM_MASTERS,)), "DELETE", "/api/v1/nodes", {}, True),
    # the bootstrap roles: discovery, self reviews and public info for every authenticated user
    (ALICE, "GET", "/apis", {}, True),
    (ALICE, "GET", "/apis/trainer.kubeflow.org/v1alpha1", {}, True),
    (ALICE, "GET", "/openapi/v3", {}, True),
    (ALICE, "GET", "/version", {}, True),
    (ALICE, "GET", "/metrics", {}, False),
    (ALICE, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {}, True),
    (ALICE, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {}, False),
    (rbac.UserInfo("system:anonymous", (rbac.UNAUTHENTICATED,)), "GET", "/healthz", {}, True),
    (rbac.UserInfo("system:anonymous", (rbac.UNAUTHENTICATED,)), "GET", "/apis", {}, False),
])
def test_policy_decisions(policy, user, method, path, query, allowed) -> None:
    assert policy.authorize(attrs(method, path, query, user))[0] is allowed


def test_reasons_name_the_binding_and_the_missing_role(policy) -> None:
    allowed, reason = policy.authorize(attrs("GET", "/api/v1/namespaces/team-a/pods"))
    assert allowed and reason == ('RBAC: allowed by RoleBinding "dev-reads-pods/team-a" of ClusterRole "pod-reader" '
                                  'to Group "dev"')
    carol = rbac.UserInfo("carol", (rbac.AUTHENTICATED,))
    denied, why = policy.authorize(attrs("GET", "/api/v1/namespaces/team-b/pods", user=carol))
    assert not denied and why == 'RBAC: role.rbac.authorization.k8s.io "gone" not found'


def test_rules_review_lists_the_rules_of_a_namespace(policy) -> None:
    rules, problems = policy.rules_for(BOT, "team-a")
    status = rbac.rules_review_status(rules, problems)
    assert {"verbs": ["create"], "apiGroups": [""], "resources": ["secrets"]} in status["resourceRules"]
    assert {"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]} \
        in status["nonResourceRules"]
    assert status["incomplete"] is False


@pytest.mark.parametrize("method,path,query,user,message,details", [
    ("GET", "/api/v1/namespaces/ns/pods/p", {}, ALICE,
     'pods "p" is forbidden: User "alice" cannot get resource "pods" in API group "" in the namespace "ns"',
     {"name": "p", "kind": "pods"}),
    ("GET", "/api/v1/namespaces/ns/pods", {}, BOT,
     'pods is forbidden: User "system:serviceaccount:team-a:bot" cannot list resource "pods" in API group "" '
     'in the namespace "ns"', {"kind": "pods"}),
    ("PUT", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/j/status", {}, ALICE,
     'trainjobs.trainer.kubeflow.org "j" is forbidden: User "alice" cannot update resource "trainjobs/status" '
     'in API group "trainer.kubeflow.org" in the namespace "ns"',
     {"name": "j", "group": "trainer.kubeflow.org", "kind": "trainjobs"}),
    ("GET", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", {}, ALICE,
     'clustertrainingruntimes.trainer.kubeflow.org is forbidden: User "alice" cannot list resource '
     '"clustertrainingruntimes" in API group "trainer.kubeflow.org" at the cluster scope',
     {"group": "trainer.kubeflow.org", "kind": "clustertrainingruntimes"}),
    ("GET", "/metrics", {}, ALICE, 'forbidden: User "alice" cannot get path "/metrics"', {}),
    ("GET", "/api/v1/namespaces/ns", {}, rbac.UserInfo("<b>"),
     'namespaces "ns" is forbidden: User "&lt;b&gt;" cannot get resource "namespaces" in API group "" in the '
     'namespace "ns"', {"name": "ns", "kind": "namespaces"}),
])
def test_forbidden_texts_are_kube_apiservers(method, path, query, user, message, details) -> None:
    assert rbac.forbidden(attrs(method, path, query, user)) == (message, details)
    assert rbac.forbidden(attrs(method, path, query, user), "RBAC: x")[0] == message + ": RBAC: x"


def test_impersonating_a_user_with_groups_and_extras() -> None:
    headers = [("Impersonate-User", "jane"), ("Impersonate-Group", "dev"), ("Impersonate-Group", "ops"),
               ("Impersonate-Extra-Scopes", "view"), ("Impersonate-Extra-acme.com%2Fproject", "p1"),
               ("Impersonate-Uid", "1234")]
    requests = rbac.impersonation_requests(headers)
    assert [(r.kind, r.name) for r in requests] == [("User", "jane"), ("Group", "dev"), ("Group", "ops"),
                                                    ("UserExtra", "view"), ("UserExtra", "p1"), ("UID", "1234")]
    checks = [r.attributes(ALICE) for r in requests]
    assert [(a.verb, a.api_group, a.resource, a.subresource, a.name) for a in checks] == [
        ("impersonate", "", "users", "", "jane"), ("impersonate", "", "groups", "", "dev"),
        ("impersonate", "", "groups", "", "ops"),
        ("impersonate", "authentication.k8s.io", "userextras", "scopes", "view"),
        ("impersonate", "authentication.k8s.io", "userextras", "acme.com/project", "p1"),
        ("impersonate", "authentication.k8s.io", "uids", "", "1234")]
    user = rbac.impersonated_user(requests)
    assert user == rbac.UserInfo("jane", ("dev", "ops", rbac.AUTHENTICATED), "1234",
                                 {"scopes": ("view",), "acme.com/project": ("p1",)})


def test_impersonating_a_service_account_checks_serviceaccounts_in_its_namespace() -> None:
    requests = rbac.impersonation_requests([("Impersonate-User", "system:serviceaccount:team-a:bot")])
    check = requests[0].attributes(ALICE)
    assert (check.resource, check.namespace, check.name) == ("serviceaccounts", "team-a", "bot")
    assert rbac.forbidden(check)[0] == ('serviceaccounts "bot" is forbidden: User "alice" cannot impersonate resource '
                                        '"serviceaccounts" in API group "" in the namespace "team-a"')
    assert rbac.impersonated_user(requests) == BOT  # the groups of a ServiceAccount when none are named


def test_impersonation_needs_a_user_and_headers_alone_change_nothing() -> None:
    assert rbac.impersonation_requests([("Authorization", "Bearer x")]) == []
    with pytest.raises(rbac.ImpersonationError, match="without impersonating a user"):
        rbac.impersonation_requests([("Impersonate-Group", "system:masters")])


def test_bootstrap_policy_binds_what_kube_apiserver_binds() -> None:
    bindings = {b["metadata"]["name"]: ([s["name"] for s in b["subjects"]], b["roleRef"]["name"])
                for b in rbac_bootstrap.cluster_role_bindings()}
    assert bindings == {"cluster-admin": (["system:masters"], "cluster-admin"),
                        "system:discovery": (["system:authenticated"], "system:discovery"),
                        "system:basic-user": (["system:authenticated"], "system:basic-user"),
                        "system:public-info-viewer": (["system:authenticated", "system:unauthenticated"],
                                                      "system:public-info-viewer")}
    roles = {r["metadata"]["name"] for r in rbac_bootstrap.cluster_roles()}
    assert {"cluster-admin", "admin", "edit", "view"} <= roles
    view = rbac.Policy([], rbac_bootstrap.cluster_roles(), [], [
        _binding("ClusterRoleBinding", "v", "ClusterRole", "view", [{"kind": "User", "name": "alice"}]),
        _binding("ClusterRoleBinding", "e", "ClusterRole", "edit", [{"kind": "User", "name": "ed"}])])
    assert view.authorize(attrs("GET", "/api/v1/namespaces/x/pods/p/log"))[0]
    assert not view.authorize(attrs("GET", "/api/v1/namespaces/x/secrets/s"))[0]  # view does not read Secrets
    ed = rbac.UserInfo("ed", (rbac.AUTHENTICATED,))
    assert view.authorize(attrs("GET", "/api/v1/namespaces/x/secrets/s", user=ed))[0]
    assert not view.authorize(attrs("POST", "/apis/rbac.authorization.k8s.io/v1/namespaces/x/roles", user=ed))[0]


@pytest.mark.parametrize("held,granted,missing", [
    ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}], [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}], 0),
    ([{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}],
     [{"verbs": ["get", "list", "delete"], "apiGroups": [""], "resources": ["pods"]}], 1),
    # a wildcard is only covered by the same wildcard
    ([{"verbs": ["get", "list", "watch"], "apiGroups": [""], "resources": ["pods"]}],
     [{"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}], 1),
    ([{"verbs": ["get"], "apiGroups": [""], "resources": ["*/status"]}],
     [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods/status", "pods"]}], 1),
    # names: a named owner rule covers only those names, an unnamed one every name
    ([{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]}],
     [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a", "b"]}], 1),
    ([{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}],
     [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a", "b"]}], 0),
    ([{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["a"]}],
     [{"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}], 1),
    ([{"verbs": ["get"], "nonResourceURLs": ["/apis/*"]}], [{"verbs": ["get"], "nonResourceURLs": ["/apis/x", "/metrics"]}], 1),
])
def test_escalation_counts_the_rights_not_held(held, granted, missing) -> None:
    assert len(rbac.missing_rules(held, granted)) == missing
