"""Per-kind strategies: what kube-apiserver's registry of each kind decides for the generic store.

The generic store (``resources.Api``), the write chain and the deletion stage ask the kind's
``Strategy`` instead of switching on the kind: the status a create starts with
(PrepareForCreate), the defaults it gets, what decoding does to its body, the rule its names
follow, its validation on create (beyond its definition's types) and update, which RBAC
escalation check its writes get, the default deletion propagation, whether a deletion waits for
a controller (namespaces), what the server creates beside a new object, and what happens after a
commit or a removal. ``Strategies.of(rt)`` answers the strategy registered for the kind's
storage key, else the plain one. (The ``kubectl get`` columns are printers registered the same
way, in ``tables.py``.)
"""
from __future__ import annotations

import base64
import json
from typing import Any, Callable

from trainyard.apimachinery import openapi_definitions
from trainyard.apimachinery.admission_policy import set_defaults as set_policy_defaults
from trainyard.apimachinery.admission_policy import spec_causes
from trainyard.apimachinery.admission_typecheck import (CheckedKind, definitions_resolver, gvk_string,
                                                        matched_resources, type_checking)

from .. import errors
from . import naming
from trainyard_services.devcluster.apiserver.registry.builtin_fields import (hpa_causes, job_update_causes, pdb_causes, role_ref_kind_causes,
                              workload_selector_causes)
from .clock import now_rfc3339
from ..errors import field_cause
from .events import core_to_events_v1, events_v1_to_core
from .kinds import Registry, ResourceType, types_from_crd
from ...storage.store import StaleWrite, Store, StoredObject

CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
Causes = list[dict[str, str]]


class Strategy:
    """The plain kind: no status of its own on create, no defaults, Background deletion."""

    default_propagation = "Background"
    # RBAC escalation check of a write (filters/authorization.py): "rules" (Roles: the rules granted), "binding"
    # (bindings: the role referenced); None: none
    escalation_check: str | None = None
    # the controller a deletion is left to: the object is always marked (deletionTimestamp) and
    # the controller removes it ("namespace": the namespace controller empties it, then it goes)
    deletion_controller: str | None = None

    def name_errors(self, name: str) -> Causes:
        """``metadata.name`` of a create, by the kind's rule: a DNS-1123 subdomain."""
        return naming.subdomain_name_errors(name)

    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        """A built-in kind's cross-field rules, checked once its definition's types hold."""
        return []

    def validate_update(self, obj: dict[str, Any], old: dict[str, Any]) -> Causes:
        """Rules of an update of the main resource (not of ``/status``)."""
        return []

    def mark_deleting(self, marked: dict[str, Any]) -> None:
        """What a deletion that marks the object (deletionTimestamp) changes besides it."""

    def follow_ups(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """Objects the server's controllers create once ``obj`` is created (the namespace's
        ``default`` ServiceAccount); created unless they exist."""
        return []

    def initial_status(self) -> dict[str, Any] | None:
        """The status a create starts with (a kind with a status subresource); None: none."""
        return None

    def defaults_on_create(self, obj: dict[str, Any]) -> None:
        """Defaults the kind's registry sets on a create (after admission's mutation)."""

    def decode(self, obj: dict[str, Any]) -> None:
        """What decoding a body of the kind does beyond pruning (conversion of the body)."""

    def prepare_for_update(self, obj: dict[str, Any], old: dict[str, Any]) -> None:
        """Fields the server owns on an update."""

    def validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
        """The kind's own checks (beyond its definition's types); empty when valid."""
        return []

    def grace_period(self, obj: dict[str, Any], options: dict[str, Any]) -> int | None:
        """A graceful deletion's period in seconds (``CheckGracefulDelete``); None: the kind is
        deleted at once."""
        return None

    def after_commit(self, obj: dict[str, Any]) -> None:
        """What the server does once the object is stored."""

    async def after_removal(self, obj: dict[str, Any]) -> None:
        """What the server does once the object is gone."""


class PodStrategy(Strategy):
    def initial_status(self) -> dict[str, Any] | None:
        return {"phase": "Pending", "qosClass": "BestEffort"}

    def defaults_on_create(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")

    def grace_period(self, obj: dict[str, Any], options: dict[str, Any]) -> int | None:
        """kube-apiserver's pod ``CheckGracefulDelete``: the request's ``gracePeriodSeconds``,
        else the pod's ``terminationGracePeriodSeconds``; 0 for a pod no node runs (unbound) or
        one that has finished, at least 1 when negative."""
        requested = options.get("gracePeriodSeconds")
        if requested is None:
            requested = (obj.get("spec") or {}).get("terminationGracePeriodSeconds") or 0
        try:
            period = int(requested)
        except (TypeError, ValueError):
            raise errors.bad_request(
                f"DeleteOptions.gracePeriodSeconds: must be an integer, got {json.dumps(requested)[:100]}") from None
        if not (obj.get("spec") or {}).get("nodeName"):
            return 0
        if (obj.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return 0
        return 1 if period < 0 else period


class NamespaceStrategy(Strategy):
    deletion_controller = "namespace"

    def name_errors(self, name: str) -> Causes:
        return naming.label_name_errors(name)

    def initial_status(self) -> dict[str, Any] | None:
        return {"phase": "Active"}

    def mark_deleting(self, marked: dict[str, Any]) -> None:
        marked.setdefault("status", {})["phase"] = "Terminating"

    def follow_ups(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """The ServiceAccount controller's part: every namespace has a ``default`` ServiceAccount
        (pods run as it unless they name another, and their projected tokens are its tokens)."""
        return [{"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": "default", "namespace": obj["metadata"]["name"]}}]

    def defaults_on_create(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])


class ServiceStrategy(Strategy):
    """A ClusterIP Service gets the next address of 10.96.0.0/12 (kube-apiserver's allocator,
    in order; addresses are not reused within one server run)."""

    def __init__(self) -> None:
        self._next = 11
        self._step = 1

    def share(self, index: int, count: int) -> None:
        """API worker ``index`` of ``count`` hands out every ``count``-th address from its own
        offset: two workers never allocate the same one, without asking each other."""
        self._next, self._step = 11 + index, count

    def name_errors(self, name: str) -> Causes:
        return naming.dns1035_name_errors(name)

    def initial_status(self) -> dict[str, Any] | None:
        return {"loadBalancer": {}}

    def defaults_on_create(self, obj: dict[str, Any]) -> None:
        spec = obj.setdefault("spec", {})
        if spec.get("type", "ClusterIP") == "ClusterIP" and not spec.get("clusterIP"):
            allocated, self._next = self._next, self._next + self._step
            ip = f"10.96.{allocated // 250}.{allocated % 250 + 1}"
            spec["clusterIP"] = ip
            spec["clusterIPs"] = [ip]
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")


class JobStrategy(Strategy):
    # batch/v1 Jobs default to orphaning their pods (kube-apiserver's job registry)
    default_propagation = "Orphan"

    def initial_status(self) -> dict[str, Any] | None:
        return {}

    def validate_update(self, obj: dict[str, Any], old: dict[str, Any]) -> Causes:
        return job_update_causes(obj, old)


class EventStrategy(Strategy):
    def name_errors(self, name: str) -> Causes:
        return naming.event_name_errors(name)


class WorkloadStrategy(Strategy):
    """Deployments, StatefulSets, ReplicaSets, DaemonSets (stored, no controller)."""

    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        return workload_selector_causes(obj)


class DisruptionBudgetStrategy(Strategy):
    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        return pdb_causes(obj)


class AutoscalerStrategy(Strategy):
    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        return hpa_causes(obj)


class SecretStrategy(Strategy):
    def decode(self, obj: dict[str, Any]) -> None:
        """``stringData`` is merged into ``data`` (base64) by the conversion of a body."""
        if "stringData" not in obj:
            return
        string_data = obj.pop("stringData") or {}
        data = obj.setdefault("data", {}) or {}
        for k, v in string_data.items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        obj["data"] = data


class PolicyStrategy(Strategy):
    """ValidatingAdmissionPolicy and its binding: kube-apiserver's v1 defaults; a policy's
    ``status`` is what kube-apiserver's type-checking controller writes once it has seen the
    generation: ``observedGeneration`` and ``typeChecking`` (trainyard.apimachinery.admission_typecheck)."""

    def __init__(self, kind: str, registry: Registry | None = None) -> None:
        self.kind = kind
        self.registry = registry  # a policy's: its status is type checked against the registry's kinds

    def decode(self, obj: dict[str, Any]) -> None:
        set_policy_defaults(self.kind, obj)

    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        return spec_causes(self.kind, obj)

    def validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
        if self.registry is not None and isinstance(obj.get("spec"), dict):  # a policy (bindings: no status)
            generation = 1 if old is None else \
                int((old.get("metadata") or {}).get("generation") or 0) + (obj["spec"] != old.get("spec"))
            obj["status"] = {"observedGeneration": generation, "typeChecking": self._type_checking(obj["spec"])}
        return []

    def _schema(self, found: ResourceType | None) -> dict[str, Any] | None:
        """The definition of a built-in kind (type checking skips custom resources)."""
        if found is None or not found.builtin or not found.definition \
                or not openapi_definitions.has_definition(found.definition):
            return None
        return openapi_definitions.definition(found.definition)

    def _type_checking(self, spec: dict[str, Any]) -> dict[str, Any]:
        assert self.registry is not None
        kinds = []
        for group, version, resource in matched_resources(spec.get("matchConstraints")):
            found = self.registry.lookup(group, version, resource)
            schema = self._schema(found)
            if found is not None and schema is not None:
                kinds.append(CheckedKind(gvk_string(group, version, found.kind), schema))
        param_kind = spec.get("paramKind") if isinstance(spec.get("paramKind"), dict) else {}
        params = self._schema(self.registry.by_kind(str(param_kind.get("apiVersion", "")),
                                                    str(param_kind.get("kind", "")))) if param_kind else None
        namespace = self._schema(self.registry.lookup("", "v1", "namespaces"))
        return type_checking(spec, kinds, definitions_resolver(openapi_definitions.load_definitions()),
                             params_schema=params, namespace_schema=namespace)


class RoleStrategy(Strategy):
    """Roles and ClusterRoles: path-segment names; a write granting rules the writer does not
    hold needs ``escalate`` (filters/authorization.py)."""

    escalation_check = "rules"

    def name_errors(self, name: str) -> Causes:
        return naming.path_segment_name_errors(name)


class RoleBindingStrategy(RoleStrategy):
    """RoleBindings (roleRef: Role or ClusterRole) and ClusterRoleBindings (ClusterRole); a
    binding to a role whose rights the writer does not hold needs ``bind`` (filters/authorization.py)."""

    escalation_check = "binding"

    def __init__(self, role_kinds: frozenset[str]) -> None:
        self.role_kinds = role_kinds

    def validate_fields(self, obj: dict[str, Any]) -> Causes:
        return role_ref_kind_causes(obj, self.role_kinds)

    def validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
        """kube-apiserver's ValidateRoleBindingUpdate: a binding's roleRef cannot change."""
        if old is None or obj.get("roleRef") == old.get("roleRef"):
            return []
        ref = obj.get("roleRef") if isinstance(obj.get("roleRef"), dict) else {}
        shown = ", ".join(f'{k}:{json.dumps(str(ref.get(j, "")))}' for k, j in
                          (("APIGroup", "apiGroup"), ("Kind", "kind"), ("Name", "name")))
        return [field_cause("roleRef", "FieldValueInvalid", f"Invalid value: rbac.RoleRef{{{shown}}}: cannot change roleRef")]


class CrdStrategy(Strategy):
    """CustomResourceDefinitions: checked, given their status, installed into the registry
    once stored, and their objects removed with them."""

    def __init__(self, registry: Registry, store: Store) -> None:
        self.registry = registry
        self.store = store

    def prepare_for_update(self, obj: dict[str, Any], old: dict[str, Any]) -> None:
        crd_status(obj)

    def validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> Causes:
        spec = obj.get("spec")
        name = obj["metadata"]["name"]
        if not isinstance(spec, dict):
            return [field_cause("spec", "FieldValueRequired", "Required value")]
        causes = []
        names = spec.get("names") or {}
        group = spec.get("group") or ""
        if not group:
            causes.append(field_cause("spec.group", "FieldValueRequired", "Required value"))
        if not names.get("plural"):
            causes.append(field_cause("spec.names.plural", "FieldValueRequired", "Required value"))
        if not names.get("kind"):
            causes.append(field_cause("spec.names.kind", "FieldValueRequired", "Required value"))
        if names.get("plural") and group and name != f"{names['plural']}.{group}":
            causes.append(field_cause("metadata.name", "FieldValueInvalid",
                                      f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
        versions = spec.get("versions") or []
        if not versions or sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(field_cause("spec.versions", "FieldValueInvalid",
                                      "Invalid value: must have exactly one version marked as storage version"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(field_cause("spec.scope", "FieldValueNotSupported",
                                      f'Unsupported value: {json.dumps(spec.get("scope"))}: supported values: '
                                      '"Cluster", "Namespaced"'))
        if not causes:
            crd_status(obj)
        return causes

    def after_commit(self, obj: dict[str, Any]) -> None:
        self.registry.install_crd(obj)

    async def after_removal(self, obj: dict[str, Any]) -> None:
        # the types from the CRD itself: in an API worker the change stream may have removed
        # them from the registry already (``process.worker``)
        self.registry.remove_crd(obj["metadata"]["name"])
        types = types_from_crd(obj)
        if not types:
            return
        rt = types[0]
        for (ns, name), found in self.store.list(rt.storage_key):
            current: StoredObject | None = found
            while current is not None:  # written meanwhile by another API worker: remove what is there now
                try:
                    await self.store.remove(rt.storage_key, ns, name, current.load(), expect_rv=current.rv)
                    break
                except StaleWrite as stale:
                    current = stale.current


def crd_status(obj: dict[str, Any]) -> None:
    """A CRD's status as the apiextensions controllers leave it: names accepted, established,
    the storage version recorded in ``storedVersions``."""
    spec = obj.get("spec") or {}
    stamp = now_rfc3339()
    old_conditions = {c.get("type"): c for c in (obj.get("status") or {}).get("conditions") or []}

    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        previous = old_conditions.get(kind)
        return {"type": kind, "status": "True",
                "lastTransitionTime": previous.get("lastTransitionTime", stamp) if previous else stamp,
                "reason": reason, "message": message}
    storage = [v["name"] for v in spec.get("versions") or [] if v.get("storage")]
    stored_versions = list((obj.get("status") or {}).get("storedVersions") or [])
    for v in storage:
        if v not in stored_versions:
            stored_versions.append(v)
    obj["status"] = {
        "conditions": [condition("NamesAccepted", "NoConflicts", "no conflicts found"),
                       condition("Established", "InitialNamesAccepted", "the initial names have been accepted")],
        "acceptedNames": spec.get("names") or {},
        "storedVersions": stored_versions,
    }


class StoredAs:
    """A served type whose objects are another type's, converted on the way in and out, as
    kube-apiserver's scheme converts between versions: events.k8s.io/v1 Events are core v1
    Events (renamed fields), read, written, patched and applied as such."""

    def __init__(self, group: str, version: str, resource: str,
                 to_stored: Callable[[dict[str, Any]], dict[str, Any]],
                 from_stored: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.group, self.version, self.resource = group, version, resource
        self.to_stored = to_stored
        self.from_stored = from_stored

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


class Strategies:
    """The registry of strategies, by storage key (group, resource), and of the served types
    stored as another (``stored_as``), by their own (group, resource)."""

    def __init__(self, registry: Registry, store: Store) -> None:
        self.plain = Strategy()
        workload, role = WorkloadStrategy(), RoleStrategy()
        self._by_key: dict[tuple[str, str], Strategy] = {
            ("", "pods"): PodStrategy(),
            ("", "namespaces"): NamespaceStrategy(),
            ("", "services"): ServiceStrategy(),
            ("", "secrets"): SecretStrategy(),
            ("", "events"): EventStrategy(),  # events.k8s.io events are stored as core events
            ("batch", "jobs"): JobStrategy(),
            ("apps", "deployments"): workload,
            ("apps", "statefulsets"): workload,
            ("apps", "replicasets"): workload,
            ("apps", "daemonsets"): workload,
            ("policy", "poddisruptionbudgets"): DisruptionBudgetStrategy(),
            ("autoscaling", "horizontalpodautoscalers"): AutoscalerStrategy(),
            CRDS: CrdStrategy(registry, store),
            ("rbac.authorization.k8s.io", "roles"): role,
            ("rbac.authorization.k8s.io", "clusterroles"): role,
            ("rbac.authorization.k8s.io", "rolebindings"): RoleBindingStrategy(frozenset({"Role", "ClusterRole"})),
            ("rbac.authorization.k8s.io", "clusterrolebindings"): RoleBindingStrategy(frozenset({"ClusterRole"})),
            ("admissionregistration.k8s.io", "validatingadmissionpolicies"):
                PolicyStrategy("ValidatingAdmissionPolicy", registry),
            ("admissionregistration.k8s.io", "validatingadmissionpolicybindings"):
                PolicyStrategy("ValidatingAdmissionPolicyBinding"),
        }

        self._stored_as: dict[tuple[str, str], StoredAs] = {
            ("events.k8s.io", "events"): StoredAs("", "v1", "events", events_v1_to_core, core_to_events_v1),
        }

    def of(self, rt: ResourceType) -> Strategy:
        return self._by_key.get(rt.storage_key, self.plain)

    def stored_as(self, rt: ResourceType) -> StoredAs | None:
        """The type ``rt``'s objects are stored as, with the conversions; None: its own."""
        return self._stored_as.get((rt.group, rt.resource))

    def share_allocators(self, index: int, count: int) -> None:
        """This process is API worker ``index`` of ``count`` (``process``)."""
        services = self._by_key[("", "services")]
        assert isinstance(services, ServiceStrategy)
        services.share(index, count)


def initial_status(strategies: Strategies, rt: ResourceType, obj: dict[str, Any]) -> None:
    """PrepareForCreate's status: what the kind starts with, never what the body says."""
    if not rt.has_status:
        return
    obj.pop("status", None)
    status = strategies.of(rt).initial_status()
    if status is not None:
        obj["status"] = status


def invalid(rt: ResourceType, name: str, causes: Causes) -> errors.ApiError:
    return errors.invalid(rt.qualified_kind, name, rt.group, rt.kind, causes)
