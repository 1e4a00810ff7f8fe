"""The default ClusterRoles and ClusterRoleBindings kube-apiserver creates at start (its
bootstrap policy), limited to those that matter to a trainyard cluster.

Names, rules and bindings are Kubernetes' facts: ``cluster-admin`` (everything, bound to group
``system:masters``), ``system:discovery`` and ``system:basic-user`` (bound to
``system:authenticated``), ``system:public-info-viewer`` (bound to ``system:authenticated`` and
``system:unauthenticated``), and the user-facing ``admin``, ``edit`` and ``view`` with the rules
their aggregation of Kubernetes' built-in ``system:aggregate-to-*`` roles yields, for the kinds
this API server serves, written out (no ``aggregationRule``: roles labelled
``rbac.authorization.k8s.io/aggregate-to-*`` are not folded in).
"""
from __future__ import annotations

from typing import Any

BOOTSTRAP_LABELS = {"kubernetes.io/bootstrapping": "rbac-defaults"}
AUTOUPDATE = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
READ = ["get", "list", "watch"]
WRITE = ["create", "delete", "deletecollection", "patch", "update"]
READ_WRITE = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def _rule(verbs: list[str], groups: list[str], resources: list[str]) -> dict[str, Any]:
    return {"verbs": list(verbs), "apiGroups": list(groups), "resources": list(resources)}


def _urls(verbs: list[str], urls: list[str]) -> dict[str, Any]:
    return {"verbs": list(verbs), "nonResourceURLs": list(urls)}


_VIEW = [
    _rule(READ, [""], ["configmaps", "endpoints", "persistentvolumeclaims", "persistentvolumeclaims/status", "pods",
                       "replicationcontrollers", "replicationcontrollers/scale", "serviceaccounts", "services",
                       "services/status"]),
    _rule(READ, [""], ["bindings", "events", "limitranges", "namespaces/status", "pods/log", "pods/status",
                       "replicationcontrollers/status", "resourcequotas", "resourcequotas/status"]),
    _rule(READ, [""], ["namespaces"]),
    _rule(READ, ["discovery.k8s.io"], ["endpointslices"]),
    _rule(READ, ["apps"], ["controllerrevisions", "daemonsets", "daemonsets/status", "deployments", "deployments/scale",
                           "deployments/status", "replicasets", "replicasets/scale", "replicasets/status",
                           "statefulsets", "statefulsets/scale", "statefulsets/status"]),
    _rule(READ, ["autoscaling"], ["horizontalpodautoscalers", "horizontalpodautoscalers/status"]),
    _rule(READ, ["batch"], ["cronjobs", "cronjobs/status", "jobs", "jobs/status"]),
    _rule(READ, ["policy"], ["poddisruptionbudgets", "poddisruptionbudgets/status"]),
    _rule(READ, ["networking.k8s.io"], ["ingresses", "ingresses/status", "networkpolicies"]),
]

_EDIT = [
    _rule(READ, [""], ["pods/attach", "pods/exec", "pods/portforward", "pods/proxy", "secrets", "services/proxy"]),
    _rule(["impersonate"], [""], ["serviceaccounts"]),
    _rule(WRITE, [""], ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy"]),
    _rule(["create"], [""], ["pods/eviction"]),
    _rule(WRITE, [""], ["configmaps", "events", "persistentvolumeclaims", "replicationcontrollers",
                        "replicationcontrollers/scale", "secrets", "serviceaccounts", "services", "services/proxy"]),
    _rule(["create"], [""], ["serviceaccounts/token"]),
    _rule(WRITE, ["apps"], ["daemonsets", "deployments", "deployments/rollback", "deployments/scale", "replicasets",
                            "replicasets/scale", "statefulsets", "statefulsets/scale"]),
    _rule(WRITE, ["autoscaling"], ["horizontalpodautoscalers"]),
    _rule(WRITE, ["batch"], ["cronjobs", "jobs"]),
    _rule(WRITE, ["policy"], ["poddisruptionbudgets"]),
    _rule(WRITE, ["networking.k8s.io"], ["ingresses", "networkpolicies"]),
    _rule(READ_WRITE, ["coordination.k8s.io"], ["leases"]),
]

_ADMIN = [
    _rule(["create"], ["authorization.k8s.io"], ["localsubjectaccessreviews"]),
    _rule(READ_WRITE, ["rbac.authorization.k8s.io"], ["rolebindings", "roles"]),
]


def _cluster_role(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": dict(BOOTSTRAP_LABELS), "annotations": dict(AUTOUPDATE)},
            "rules": rules}


def _binding(name: str, role: str, groups: list[str]) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name, "labels": dict(BOOTSTRAP_LABELS), "annotations": dict(AUTOUPDATE)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in groups]}


def cluster_roles() -> list[dict[str, Any]]:
    return [
        _cluster_role("cluster-admin", [_rule(["*"], ["*"], ["*"]), _urls(["*"], ["*"])]),
        _cluster_role("system:discovery", [_urls(["get"], ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez",
                                                           "/openapi", "/openapi/*", "/readyz", "/version",
                                                           "/version/"])]),
        _cluster_role("system:basic-user", [
            _rule(["create"], ["authorization.k8s.io"], ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]),
            _rule(["create"], ["authentication.k8s.io"], ["selfsubjectreviews"]),
        ]),
        _cluster_role("system:public-info-viewer", [_urls(["get"], ["/healthz", "/livez", "/readyz", "/version",
                                                                    "/version/"])]),
        _cluster_role("view", [dict(r) for r in _VIEW]),
        _cluster_role("edit", [dict(r) for r in _EDIT + _VIEW]),
        _cluster_role("admin", [dict(r) for r in _ADMIN + _EDIT + _VIEW]),
    ]


def cluster_role_bindings() -> list[dict[str, Any]]:
    return [
        _binding("cluster-admin", "cluster-admin", ["system:masters"]),
        _binding("system:discovery", "system:discovery", ["system:authenticated"]),
        _binding("system:basic-user", "system:basic-user", ["system:authenticated"]),
        _binding("system:public-info-viewer", "system:public-info-viewer",
                 ["system:authenticated", "system:unauthenticated"]),
    ]
