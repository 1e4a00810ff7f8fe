"""The resource types the server serves: built-in kinds plus those of installed CRDs."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterable

VERBS_ALL = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = {
    "status": ("get", "patch", "update"),
    "log": ("get",),
    "binding": ("create",),
    "finalize": ("update",),
    "token": ("create",),
    "scale": ("get", "patch", "update"),
}


@dataclass(frozen=True)
class ResourceType:
    """One served resource (group, version, plural) and how the server treats it."""

    group: str
    version: str
    resource: str
    kind: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    builtin: bool = True
    definition: str | None = None  # OpenAPI definition name of a built-in kind
    schema: dict[str, Any] | None = field(default=None, compare=False, hash=False)  # CR openAPIV3Schema
    printer_columns: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)
    served_versions: tuple[str, ...] = ()
    storage_version: str = ""
    return_deleted_object: bool = False
    verbs: tuple[str, ...] = VERBS_ALL
    virtual: bool = False  # create-only review resources answered from the request, never stored
    validated: bool = False  # built-in kind checked against its definition (types, required fields)
    # a CRD version's subresources.scale: specReplicasPath, statusReplicasPath, labelSelectorPath
    scale: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_resource(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def storage_key(self) -> tuple[str, str]:
        return STORAGE_ALIASES.get((self.group, self.resource), (self.group, self.resource))


# Core kinds a cluster install creates: validated against their definitions like the stored-only
# kinds below (pods, events, nodes are written by our own controllers and left as they were).
_VALIDATED_CORE = {"Namespace", "Service", "ConfigMap", "Secret", "ServiceAccount"}


def _core(resource: str, kind: str, namespaced: bool, short: tuple[str, ...] = (), subs: Iterable[str] = (),
          categories: tuple[str, ...] = (), returns_object: bool = False) -> ResourceType:
    return ResourceType(
        group="", version="v1", resource=resource, kind=kind, singular=kind.lower(), namespaced=namespaced,
        short_names=short, categories=categories, subresources=frozenset(subs),
        definition=f"io.k8s.api.core.v1.{kind}", return_deleted_object=returns_object,
        validated=kind in _VALIDATED_CORE,
    )


BUILTIN_TYPES: tuple[ResourceType, ...] = (
    _core("namespaces", "Namespace", False, ("ns",), ("status", "finalize")),
    _core("pods", "Pod", True, ("po",), ("status", "log", "binding"), ("all",), returns_object=True),
    _core("services", "Service", True, ("svc",), ("status",), ("all",)),
    _core("configmaps", "ConfigMap", True, ("cm",)),
    _core("secrets", "Secret", True),
    _core("serviceaccounts", "ServiceAccount", True, ("sa",), ("token",)),
    _core("events", "Event", True, ("ev",)),
    _core("nodes", "Node", False, ("no",), ("status",)),
    ResourceType("events.k8s.io", "v1", "events", "Event", "event", True, (),
                 definition="io.k8s.api.events.v1.Event"),
    ResourceType("batch", "v1", "jobs", "Job", "job", True, (), ("all",), frozenset({"status"}),
                 definition="io.k8s.api.batch.v1.Job"),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", "lease", True,
                 definition="io.k8s.api.coordination.v1.Lease"),
    ResourceType("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
                 "customresourcedefinition", False, ("crd", "crds"), (), frozenset({"status"}),
                 definition="io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition"),
    ResourceType("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations",
                 "ValidatingWebhookConfiguration", "validatingwebhookconfiguration", False, (), ("api-extensions",),
                 definition="io.k8s.api.admissionregistration.v1.ValidatingWebhookConfiguration", validated=True),
    ResourceType("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations",
                 "MutatingWebhookConfiguration", "mutatingwebhookconfiguration", False, (), ("api-extensions",),
                 definition="io.k8s.api.admissionregistration.v1.MutatingWebhookConfiguration", validated=True),
)

def _stored(api_version: str, resource: str, kind: str, namespaced: bool, short: tuple[str, ...] = (),
            subs: Iterable[str] = (), categories: tuple[str, ...] = ()) -> ResourceType:
    """A built-in kind devcluster stores and validates but runs no controller for (a cluster
    install's Deployments, RBAC, policies): its schema is the Kubernetes definition."""
    group, version = api_version.split("/")
    package = {"rbac.authorization.k8s.io": "rbac", "networking.k8s.io": "networking",
               "scheduling.k8s.io": "scheduling", "discovery.k8s.io": "discovery",
               "admissionregistration.k8s.io": "admissionregistration"}.get(group, group)
    return ResourceType(group, version, resource, kind, kind.lower(), namespaced, short, categories,
                        frozenset(subs), definition=f"io.k8s.api.{package}.{version}.{kind}", validated=True)


# What a cluster install of trainyard (deploy/) creates besides core kinds: stored and validated.
BUILTIN_TYPES += (
    _stored("apps/v1", "deployments", "Deployment", True, ("deploy",), ("status",), ("all",)),
    _stored("apps/v1", "statefulsets", "StatefulSet", True, ("sts",), ("status",), ("all",)),
    _stored("apps/v1", "replicasets", "ReplicaSet", True, ("rs",), ("status",), ("all",)),
    _stored("apps/v1", "daemonsets", "DaemonSet", True, ("ds",), ("status",), ("all",)),
    _stored("apps/v1", "controllerrevisions", "ControllerRevision", True),
    _stored("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("pdb",), ("status",)),
    _stored("networking.k8s.io/v1", "networkpolicies", "NetworkPolicy", True, ("netpol",)),
    _stored("rbac.authorization.k8s.io/v1", "roles", "Role", True),
    _stored("rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
    _stored("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
    _stored("rbac.authorization.k8s.io/v1", "clusterrolebindings", "ClusterRoleBinding", False),
    _stored("scheduling.k8s.io/v1", "priorityclasses", "PriorityClass", False, ("pc",)),
    # The addresses of selector-less Services (a host process the pods reach by Service name).
    _stored("discovery.k8s.io/v1", "endpointslices", "EndpointSlice", True),
    # Autoscalers of custom resources' scale subresources; no HPA controller runs here.
    _stored("autoscaling/v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", True, ("hpa",), ("status",),
            ("all",)),
    # Enforced on every write by services/devcluster/apiserver/admission/policies.py (docs/devcluster.md).
    _stored("admissionregistration.k8s.io/v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False,
            (), ("status",), ("api-extensions",)),
    _stored("admissionregistration.k8s.io/v1", "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding", False, (), (), ("api-extensions",)),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", "persistentvolumeclaim", True,
                 ("pvc",), (), frozenset({"status"}), definition="io.k8s.api.core.v1.PersistentVolumeClaim",
                 validated=True),
)


def _review(group: str, resource: str, kind: str) -> ResourceType:
    return ResourceType(group, "v1", resource, kind, "", False, definition=f"io.k8s.api.{group.split('.')[0]}.v1.{kind}",
                        verbs=("create",), virtual=True)


# kubectl auth can-i / auth whoami: answered by RBAC (services/devcluster/apiserver/filters/authorization.py)
BUILTIN_TYPES += (
    _review("authorization.k8s.io", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    _review("authorization.k8s.io", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
    _review("authorization.k8s.io", "subjectaccessreviews", "SubjectAccessReview"),
    ResourceType("authorization.k8s.io", "v1", "localsubjectaccessreviews", "LocalSubjectAccessReview", "", True,
                 definition="io.k8s.api.authorization.v1.LocalSubjectAccessReview", verbs=("create",), virtual=True),
    _review("authentication.k8s.io", "selfsubjectreviews", "SelfSubjectReview"),
)

# Events are stored once (core/v1) and shown through events.k8s.io/v1 converted.
STORAGE_ALIASES = {("events.k8s.io", "events"): ("", "events")}


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """The resource types one CRD object serves (one per served version)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    versions = [v for v in spec.get("versions") or [] if v.get("served", True)]
    storage = next((v["name"] for v in spec.get("versions") or [] if v.get("storage")), versions[0]["name"] if versions else "")
    served = tuple(v["name"] for v in versions)
    result = []
    for version in versions:
        declared = version.get("subresources") or {}
        subs = set(declared.keys())
        subs &= {"status", "scale"}
        schema = (version.get("schema") or {}).get("openAPIV3Schema") or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        result.append(ResourceType(
            group=group, version=version["name"], resource=names.get("plural", ""), kind=names.get("kind", ""),
            singular=names.get("singular") or names.get("kind", "").lower(),
            namespaced=spec.get("scope", "Namespaced") == "Namespaced",
            short_names=tuple(names.get("shortNames") or ()), categories=tuple(names.get("categories") or ()),
            subresources=frozenset(subs), builtin=False, schema=schema,
            printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            served_versions=served, storage_version=storage,
            scale=declared.get("scale") if "scale" in subs else None,
        ))
    return result


class Registry:
    """Lookup of served types by URL parts and by kind; CRD types come and go at run time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._builtin = list(BUILTIN_TYPES)
        self._crd_types: dict[str, list[ResourceType]] = {}  # CRD name -> its types
        self.generation = 0  # bumps whenever the set of served types or schemas changes
        self._rebuild()

    def _rebuild(self) -> None:
        types = list(self._builtin)
        for crd_types in self._crd_types.values():
            types.extend(crd_types)
        self._all = types
        self._by_path = {(t.group, t.version, t.resource): t for t in types}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        for t in types:
            self._by_kind.setdefault((t.api_version, t.kind), t)
        self.generation += 1

    def all(self) -> list[ResourceType]:
        return list(self._all)

    def lookup(self, group: str, version: str, resource: str) -> ResourceType | None:
        return self._by_path.get((group, version, resource))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def by_group_resource(self, group: str, resource: str) -> ResourceType | None:
        for t in self._all:
            if t.group == group and t.resource == resource:
                return t
        return None

    def groups(self) -> dict[str, list[str]]:
        """Group name -> versions in preferred order (the storage version first)."""
        out: dict[str, list[str]] = {}
        for t in self._all:
            versions = out.setdefault(t.group, [])
            if t.version not in versions:
                versions.append(t.version)
        for t in self._all:
            if not t.builtin and t.storage_version in out[t.group]:
                out[t.group].remove(t.storage_version)
                out[t.group].insert(0, t.storage_version)
        return out

    def install_crd(self, crd: dict[str, Any]) -> None:
        with self._lock:
            self._crd_types[crd["metadata"]["name"]] = types_from_crd(crd)
            self._rebuild()

    def remove_crd(self, name: str) -> list[ResourceType]:
        with self._lock:
            removed = self._crd_types.pop(name, [])
            self._rebuild()
            return removed

    def crd_types(self, name: str) -> list[ResourceType]:
        return list(self._crd_types.get(name, []))
