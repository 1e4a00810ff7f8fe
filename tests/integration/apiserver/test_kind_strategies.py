"""Per-kind rules that live in the strategy registry (services/devcluster/apiserver/registry/strategies.py),
as a client sees them over HTTPS: each kind's name rule, its cross-field checks, what its
creation and deletion bring along, and the review kinds' handlers.

One devcluster for the module. Each row names the kube-apiserver source of the rule
(kubernetes/kubernetes at v1.36, pkg/apis/<group>/validation and pkg/registry).
"""
from __future__ import annotations

from typing import Any, Iterator

import httpx
import pytest

RBAC = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture(scope="module")
def client(devcluster_module) -> Iterator[httpx.Client]:
    with devcluster_module.client(timeout=20) as c:
        yield c


def causes(answer: httpx.Response) -> list[tuple[str, str]]:
    assert answer.status_code == 422, answer.text
    return [(c["field"], c["message"]) for c in answer.json()["details"]["causes"]]


def meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    return {"name": name, **({"namespace": namespace} if namespace else {})}


# (path, body, the first cause's field and the start of its message; None: created)
NAME_RULES = {
    # pkg/apis/core/validation ValidateNamespaceName: a DNS-1123 label
    "namespace-is-a-label": ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": meta("a.b")},
                             ("metadata.name", 'Invalid value: "a.b": a lowercase RFC 1123 label must consist of')),
    # ValidateServiceName: a DNS-1035 label (starts with a letter)
    "service-is-dns1035": ("/api/v1/namespaces/default/services",
                           {"apiVersion": "v1", "kind": "Service", "metadata": meta("1svc"),
                            "spec": {"ports": [{"port": 80}]}},
                           ("metadata.name", 'Invalid value: "1svc": a DNS-1035 label must consist of')),
    # ValidateConfigMapName (NameIsDNSSubdomain): dots are fine
    "configmap-is-a-subdomain": ("/api/v1/namespaces/default/configmaps",
                                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("a.b")}, None),
    # pkg/apis/rbac/validation ValidateRBACName (path.IsValidPathSegmentName): ':' is fine, '%' is not
    "rbac-colon-is-a-path-segment": (f"{RBAC}/clusterroles", {"apiVersion": "rbac.authorization.k8s.io/v1",
                                     "kind": "ClusterRole", "metadata": meta("team:reader"), "rules": []}, None),
    "rbac-percent-is-refused": (f"{RBAC}/clusterroles", {"apiVersion": "rbac.authorization.k8s.io/v1",
                                "kind": "ClusterRole", "metadata": meta("50%"), "rules": []},
                                ("metadata.name", "Invalid value: \"50%\": may not contain '%'")),
    # events: any path-segment name (their names carry a dot-separated suffix)
    "event-percent-is-refused": ("/api/v1/namespaces/default/events",
                                 {"apiVersion": "v1", "kind": "Event", "metadata": meta("a%b"),
                                  "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"}},
                                 ("metadata.name", "Invalid value: \"a%b\": may not contain '/' or '%'")),
}


@pytest.mark.parametrize("case", NAME_RULES)
def test_each_kind_validates_names_by_its_rule(client, case):
    path, body, expected = NAME_RULES[case]
    answer = client.post(path, json=body)
    if expected is None:
        assert answer.status_code == 201, answer.text
        return
    field, message = expected
    found = causes(answer)
    assert found[0][0] == field and found[0][1].startswith(message), found


FIELD_RULES = {
    # pkg/apis/policy/validation ValidatePodDisruptionBudgetSpec
    "pdb-min-and-max": ("/apis/policy/v1/namespaces/default/poddisruptionbudgets",
                        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("pdb"),
                         "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {"matchLabels": {"a": "b"}}}},
                        [("spec", "Invalid value: minAvailable and maxUnavailable cannot be both set")]),
    # pkg/apis/rbac/validation ValidateClusterRoleBinding: roleRef.kind must be ClusterRole
    "clusterrolebinding-to-a-role": (f"{RBAC}/clusterrolebindings",
                                     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                                      "metadata": meta("crb"), "subjects": [],
                                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                  "name": "r"}},
                                     [("roleRef.kind", 'Unsupported value: "Role": supported values: "ClusterRole"')]),
    # pkg/apis/apps/validation ValidateDeploymentSpec: the selector selects the template
    "deployment-selector": ("/apis/apps/v1/namespaces/default/deployments",
                            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("d"),
                             "spec": {"selector": {"matchLabels": {"app": "x"}},
                                      "template": {"metadata": {"labels": {"app": "y"}},
                                                   "spec": {"containers": [{"name": "c", "image": "i"}]}}}},
                            [("spec.template.metadata.labels",
                              "Invalid value: {'app': 'y'}: `selector` does not match template `labels`")]),
}


@pytest.mark.parametrize("case", FIELD_RULES)
def test_each_kind_checks_its_cross_field_rules(client, case):
    path, body, expected = FIELD_RULES[case]
    assert causes(client.post(path, json=body)) == expected


def test_a_namespace_brings_its_default_service_account_and_is_deleted_by_its_controller(client):
    """The ServiceAccount controller gives every namespace a "default" ServiceAccount
    (pkg/controller/serviceaccount); deleting a namespace marks it Terminating and the namespace
    controller empties and removes it (pkg/registry/core/namespace/storage: Delete always sets
    deletionTimestamp and phase Terminating)."""
    created = client.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": meta("strategy-ns")})
    assert created.status_code == 201, created.text
    assert client.get("/api/v1/namespaces/strategy-ns/serviceaccounts/default").status_code == 200
    assert client.post("/api/v1/namespaces/strategy-ns/configmaps",
                       json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("x")}).status_code == 201
    answer = client.delete("/api/v1/namespaces/strategy-ns")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"]["phase"] == "Terminating"
    assert client.get("/api/v1/namespaces/strategy-ns/configmaps/x").status_code == 404
    assert client.get("/api/v1/namespaces/strategy-ns").status_code == 404


LOCAL_REVIEW = "/apis/authorization.k8s.io/v1/namespaces/default/localsubjectaccessreviews"


@pytest.mark.parametrize("spec,expected", [
    # pkg/apis/authorization/validation ValidateLocalSubjectAccessReview
    ({"user": "u", "nonResourceAttributes": {"path": "/x", "verb": "get"}},
     [("spec.nonResourceAttributes", "Invalid value: disallowed on this kind of request")]),
    ({"user": "u", "resourceAttributes": {"namespace": "other", "verb": "get", "resource": "pods"}},
     [("spec.resourceAttributes.namespace", 'Invalid value: "other": must match metadata.namespace')]),
])
def test_a_local_access_review_is_bound_to_its_namespace(client, spec, expected):
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
            "metadata": {"namespace": "default"}, "spec": spec}
    assert causes(client.post(LOCAL_REVIEW, json=body)) == expected
    # in its own namespace it is answered (the user holds nothing there)
    body["spec"] = {"user": "u", "resourceAttributes": {"verb": "get", "resource": "pods"}}
    answer = client.post(LOCAL_REVIEW, json=body)
    assert answer.status_code == 201 and answer.json()["status"]["allowed"] is False, answer.text


EVENTS_V1 = "/apis/events.k8s.io/v1/namespaces/default/events"


def test_events_v1_are_core_events_converted_both_ways(client):
    """events.k8s.io/v1 Events are stored as core v1 Events (a type stored as another,
    Strategies.stored_as), as kube-apiserver serves both from one storage: note <-> message,
    regarding <-> involvedObject (k8s.io/api events/v1 and pkg/apis/events/v1 conversions). A
    create, a PUT and a server-side apply through events.k8s.io/v1 are read back through both."""
    body = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("ev.1"), "reason": "Tested",
            "note": "first", "type": "Normal", "eventTime": "2026-01-01T00:00:00.000000Z",
            "reportingController": "tests", "reportingInstance": "tests-1", "action": "Test",
            "regarding": {"kind": "Pod", "name": "p", "namespace": "default"}}
    created = client.post(EVENTS_V1, json=body)
    assert created.status_code == 201, created.text
    assert created.json()["note"] == "first" and "message" not in created.json()
    core = client.get("/api/v1/namespaces/default/events/ev.1").json()
    assert core["message"] == "first" and core["involvedObject"]["name"] == "p" and "note" not in core
    updated = dict(created.json(), note="second")
    answer = client.put(f"{EVENTS_V1}/ev.1", json=updated)
    assert answer.status_code == 200 and answer.json()["note"] == "second", answer.text
    applied = client.patch(f"{EVENTS_V1}/ev.1", params={"fieldManager": "tests", "force": "true"},
                           headers={"Content-Type": "application/apply-patch+yaml"},
                           json={"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": meta("ev.1"),
                                 "note": "third"})
    assert applied.status_code == 200 and applied.json()["note"] == "third", applied.text
    assert client.get("/api/v1/namespaces/default/events/ev.1").json()["message"] == "third"
