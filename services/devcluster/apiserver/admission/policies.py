"""ValidatingAdmissionPolicy enforcement: the stored policies and bindings, run on every write.

The server calls ``ValidatingPolicies.admit`` after mutating admission and the schema checks
(the object is the one about to be stored), for CREATE, UPDATE and DELETE of built-in kinds and
custom resources, their ``status`` and ``scale`` subresources included. The rules are
``trainyard.apimachinery.admission_policy``; this module only gathers what they read from the
store (policies, bindings, namespaces, parameter objects) and turns a denial into the
``Status`` kube-apiserver answers (``<resource> "<name>" is forbidden: ValidatingAdmissionPolicy
'p' with binding 'b' denied request: ...`` with the validation's reason and code, the same text
as a cause), warnings into ``Warning`` headers and audit annotations into the request's audit
event (``WriteOptions.audit_annotations``, written by ``audit.py``).
"""
from __future__ import annotations

from typing import Any

from trainyard.apimachinery.admission_policy import Attributes, evaluate

from .. import errors
from ..registry.options import WriteOptions
from ..errors import ApiError
from ..registry.kinds import Registry, ResourceType
from ..registry.scale_view import ScaleError, scale_of
from ...storage.store import Store

POLICIES = ("admissionregistration.k8s.io", "validatingadmissionpolicies")
BINDINGS = ("admissionregistration.k8s.io", "validatingadmissionpolicybindings")
# request.userInfo of a write that names no user (the server's own writes): the admin.
DEFAULT_USER = {"username": "devcluster-admin", "groups": ["system:masters", "system:authenticated"]}


class _StoreParams:
    """Namespaces and parameter objects, read from the store (``ParamSource``)."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry

    def namespace(self, name: str) -> dict[str, Any] | None:
        stored = self.store.get(("", "namespaces"), "", name)
        return stored.load() if stored is not None else None

    def _type(self, api_version: str, kind: str) -> ResourceType | None:
        return self.registry.by_kind(api_version, kind)

    def param_kind_scope(self, api_version: str, kind: str) -> bool | None:
        rt = self._type(api_version, kind)
        return None if rt is None else rt.namespaced

    def get_param(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        rt = self._type(api_version, kind)
        stored = self.store.get(rt.storage_key, namespace if rt.namespaced else "", name) if rt else None
        return stored.load() if stored is not None else None

    def list_params(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        rt = self._type(api_version, kind)
        if rt is None:
            return []
        return [stored.load() for _, stored in self.store.list(rt.storage_key, namespace if rt.namespaced else None)]


class ValidatingPolicies:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.source = _StoreParams(store, registry)
        self._decoded: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}  # (kind, name) -> (rv, object)

    def _load(self, key: tuple[str, str]) -> list[dict[str, Any]]:
        """The stored policies or bindings, decoded once per resourceVersion (evaluation never
        changes them)."""
        found = []
        for (_, name), stored in self.store.list(key):
            cached = self._decoded.get((key[1], name))
            if cached is None or cached[0] != stored.rv:
                cached = self._decoded[(key[1], name)] = (stored.rv, stored.load())
            found.append(cached[1])
        if len(self._decoded) > 4096:
            self._decoded.clear()
        return found

    @staticmethod
    def _scale(rt: ResourceType, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        """A custom resource seen through its scale subresource: its autoscaling/v1 Scale."""
        if obj is None or obj.get("kind") == "Scale":
            return obj
        try:
            return scale_of(obj, rt.scale or {})[0]
        except ScaleError as err:
            raise errors.bad_request(str(err)) from err

    def admit(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None, old: dict[str, Any] | None,
              opts: WriteOptions) -> None:
        """Raise the policy denial as an ``ApiError``; add policy warnings to ``opts.warnings``."""
        policies = self._load(POLICIES)
        if not policies:
            return
        bindings = self._load(BINDINGS)
        if not bindings:
            return
        subresource = opts.subresource or ""
        kind, kind_group, kind_version = rt.kind, None, None
        if subresource == "scale" and rt.scale is not None:
            obj, old = self._scale(rt, obj), self._scale(rt, old)
            kind, kind_group, kind_version = "Scale", "autoscaling", "v1"
        meta = (obj or old or {}).get("metadata") or {}
        attrs = Attributes(
            operation=operation, group=rt.group, version=rt.version, resource=rt.resource, kind=kind,
            namespaced=rt.namespaced, name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or "") if rt.namespaced else "", subresource=subresource,
            object=obj, old_object=old, user_info=_user_info(opts),
            dry_run=bool(opts.dry_run), uid=str(meta.get("uid") or ""), kind_group=kind_group,
            kind_version=kind_version, served_versions=tuple(rt.served_versions),
            options=_options(operation, opts),
        )
        outcome = evaluate(policies, bindings, attrs, self.source)
        opts.warnings.extend(outcome.warnings)
        for key, value in outcome.audit_annotations.items():
            opts.audit_annotations.setdefault(key, value)
        if outcome.denial is not None:
            denial = outcome.denial
            details: dict[str, Any] = {"name": attrs.name}
            if rt.group:
                details["group"] = rt.group
            details["kind"] = rt.resource
            details["causes"] = [{"message": denial.message}]
            raise ApiError(denial.code, denial.reason,
                           f'{rt.qualified_resource} "{attrs.name}" is forbidden: {denial.message}', details)


def _user_info(opts: WriteOptions) -> dict[str, Any]:
    """``request.userInfo``: the requesting (or impersonated) user the server put on the write
    options (``opts.user``), else the kubeconfig's admin user."""
    return opts.user.as_json() if opts.user is not None else DEFAULT_USER


def _options(operation: str, opts: WriteOptions) -> dict[str, Any]:
    kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}.get(operation, "")
    options: dict[str, Any] = {"apiVersion": "meta.k8s.io/v1", "kind": kind}
    if operation != "DELETE" and opts.manager:
        options["fieldManager"] = opts.manager
    if opts.dry_run:
        options["dryRun"] = ["All"]
    return options
