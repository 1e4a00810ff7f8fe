"""The REST semantics of every served resource: create, get, list, update, patch, delete.

Pure request semantics over the store (no HTTP here): metadata rules, status-subresource rules,
generation, optimistic concurrency, no-op writes, finalizers, garbage collection, namespace
deletion, CRD installation. Patch formats, selectors, managedFields and Server-Side Apply come
from ``trainyard.apimachinery`` through ``machinery``.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import logging
import secrets as pysecrets
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Callable

from trainyard.apimachinery.admission_policy import set_defaults as set_policy_defaults

from . import errors, machinery, naming
from .apiserver.admission import Admission
from .events import core_to_events_v1, events_v1_to_core, is_events_v1
from .errors import ApiError, field_cause
from .apiserver.options import WriteOptions
from .builtin_fields import update_causes
from .registry import Registry, ResourceType
from .schema import SchemaProcessor
from .storage import Store, StoredObject, dumps

log = logging.getLogger("trainyard.devcluster.api")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "kubeflow-system")
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
# metadata the client cannot set through create/update bodies
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                "resourceVersion", "selfLink", "managedFields")


_NOW_TEXT: tuple[int, str] = (-1, "")  # (epoch second, its RFC 3339 text): formatting costs per write


def now_rfc3339() -> str:
    global _NOW_TEXT
    second = int(time.time())
    if _NOW_TEXT[0] != second:
        _NOW_TEXT = (second, datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    return _NOW_TEXT[1]


def _rfc3339_in(seconds: int) -> str:
    if not seconds:
        return now_rfc3339()
    return datetime.fromtimestamp(int(time.time()) + seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_grace_period(pod: dict[str, Any], options: dict[str, Any]) -> int:
    """The grace period a pod deletion gets (kube-apiserver's pod ``CheckGracefulDelete``): the
    request's ``gracePeriodSeconds``, else the pod's ``terminationGracePeriodSeconds``; 0 for a
    pod no node runs (unbound) or one that has finished, at least 1 when negative."""
    requested = options.get("gracePeriodSeconds")
    if requested is None:
        requested = (pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 0
    try:
        period = int(requested)
    except (TypeError, ValueError):
        raise errors.bad_request(f"DeleteOptions.gracePeriodSeconds: must be an integer, got {json.dumps(requested)[:100]}")
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    return 1 if period < 0 else period


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    return meta


def _without_volatile(obj: dict[str, Any]) -> dict[str, Any]:
    """The object minus resourceVersion and managedFields times: what a no-op write leaves equal."""
    clone = dict(obj)
    meta = dict(clone.get("metadata") or {})
    meta.pop("resourceVersion", None)
    if "managedFields" in meta:
        meta["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in meta["managedFields"]]
    clone["metadata"] = meta
    return clone


def _outside_metadata(obj: dict[str, Any], with_status: bool) -> dict[str, Any]:
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if with_status else set())
    return {k: v for k, v in obj.items() if k not in skip}


class Api:
    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.schemas = SchemaProcessor()
        # mutating and validating admission (apiserver/admission.py), set once the server starts
        self.admission: Admission | None = None
        # RBAC escalation checks on writes of Roles and bindings (authz.py), before admission
        self.rbac_guard: Callable[[ResourceType, dict[str, Any], WriteOptions], None] | None = None
        self._service_ip = 10
        self._sweeping: set[str] = set()
        self._apply_memo: dict[tuple, tuple[int, bytes]] = {}  # (object, manager) -> (rv, body digest)

    # ------------------------------------------------------------------ bootstrap

    async def bootstrap(self) -> None:
        """Install stored CRDs into the registry and make sure the default namespaces exist."""
        crd_key = ("apiextensions.k8s.io", "customresourcedefinitions")
        for _, stored in self.store.list(crd_key):
            self.registry.install_crd(stored.load())
        ns_type = self.registry.lookup("", "v1", "namespaces")
        assert ns_type is not None
        for name in DEFAULT_NAMESPACES:
            if self.store.get(ns_type.storage_key, "", name) is None:
                await self.create(ns_type, None, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                                  WriteOptions(manager="devcluster"))
        for _, stored in self.store.list(ns_type.storage_key):  # data directories from before
            meta = stored.load()["metadata"]
            if not meta.get("deletionTimestamp"):
                await self.ensure_default_service_account(meta["name"])

    # ------------------------------------------------------------------ reads

    def _stored(self, rt: ResourceType, namespace: str | None, name: str) -> StoredObject:
        stored = self.store.get(rt.storage_key, namespace or "", name)
        if stored is None:
            raise errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
        return stored

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        return self._view(rt, self._stored(rt, namespace, name).load())

    def get_raw(self, rt: ResourceType, namespace: str | None, name: str) -> bytes:
        stored = self._stored(rt, namespace, name)
        if self._needs_view(rt):
            return dumps(self._view(rt, stored.load()))
        return stored.raw

    def _needs_view(self, rt: ResourceType) -> bool:
        return (not rt.builtin and len(rt.served_versions) > 1) or is_events_v1(rt)

    def _view(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The stored object as the requested version (CR versions share one schema: no conversion)."""
        if is_events_v1(rt):
            return core_to_events_v1(obj) if obj.get("apiVersion") == "v1" else obj
        if obj.get("apiVersion") != rt.api_version:
            obj["apiVersion"] = rt.api_version
        return obj

    def list(self, rt: ResourceType, namespace: str | None, label_selector: str = "", field_selector: str = ""
             ) -> tuple[int, list[StoredObject]]:
        matches_labels = machinery.label_matcher(label_selector)
        matches_fields = machinery.field_matcher(rt, field_selector)
        items = []
        for (ns, name), stored in self.store.list(rt.storage_key, namespace if rt.namespaced else None):
            if not matches_labels(stored.labels):
                continue
            if matches_fields is not None and not matches_fields(ns, name, stored):
                continue
            items.append(stored)
        return self.store.rv, items

    def namespace_exists(self, name: str) -> StoredObject | None:
        return self.store.get(("", "namespaces"), "", name)

    # ------------------------------------------------------------------ create

    def _core_events(self) -> ResourceType:
        core = self.registry.lookup("", "v1", "events")
        assert core is not None
        return core

    async def create(self, rt: ResourceType, namespace: str | None, body: Any, opts: WriteOptions,
                     managed_fields: list[dict[str, Any]] | None = None, pruned: bool = False) -> dict[str, Any]:
        """``pruned``: a custom resource's body holds no field its schema does not know (an apply
        configuration pruned by ``_prune_config``), so schema processing does not prune it again."""
        if is_events_v1(rt):
            self._check_body(rt, body)
            created = await self.create(self._core_events(), namespace, events_v1_to_core(body), opts, managed_fields)
            return core_to_events_v1(created)
        obj = self._check_body(rt, body)
        meta = _meta(obj)
        self._place_namespace(rt, namespace, meta)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise self._invalid(rt, "", [field_cause("metadata.name", "FieldValueRequired",
                                                          "Required value: name or generateName is required")])
            meta["name"] = prefix + "".join(pysecrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        name = meta["name"]
        if not isinstance(name, str):
            raise errors.bad_request("metadata.name must be a string")
        if rt.namespaced:
            ns_obj = self.namespace_exists(meta["namespace"])
            if ns_obj is None:
                raise errors.not_found("namespaces", meta["namespace"], "", "namespaces")
            # (a namespace whose stored JSON has no such key is not being deleted: no decoding per create)
            if b'"deletionTimestamp"' in ns_obj.raw and json.loads(ns_obj.raw)["metadata"].get("deletionTimestamp"):
                raise errors.ApiError(403, "Forbidden",
                                      f'{rt.qualified_resource} "{name}" is forbidden: unable to create new content in '
                                      f'namespace {meta["namespace"]} because it is being terminated',
                                      {"name": name, "kind": rt.resource})
        if self.store.get(rt.storage_key, meta.get("namespace", ""), name) is not None:
            raise errors.already_exists(rt.qualified_resource, name, rt.group, rt.resource)
        for key in _SERVER_META:
            meta.pop(key, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        self._initial_status(rt, obj)
        self._kind_defaults_on_create(rt, obj)
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        obj = await self._finish_write(rt, "CREATE", obj, None, opts, managed_fields_done=managed_fields is not None,
                                       pruned=pruned)
        if rt.group == "" and rt.kind == "Namespace" and not opts.dry_run:
            await self.ensure_default_service_account(name)
        return obj

    async def ensure_default_service_account(self, namespace: str) -> None:
        """The ServiceAccount controller's part: every namespace has a ``default`` ServiceAccount
        (pods run as it unless they name another, and their projected tokens are its tokens)."""
        accounts = self.registry.lookup("", "v1", "serviceaccounts")
        if accounts is None or self.store.get(accounts.storage_key, namespace, "default") is not None:
            return
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": namespace}}
        try:
            await self.create(accounts, namespace, body, WriteOptions(manager="devcluster"))
        except errors.ApiError as err:
            if err.code != 409:  # created meanwhile by someone else: fine
                raise

    def _check_body(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise errors.bad_request(f"the body of a {rt.kind} must be a JSON object")
        obj = body  # callers pass freshly decoded bodies they no longer use
        if rt.builtin:
            # built-in decoding defaults the group/version/kind from the endpoint, as upstream
            obj.setdefault("apiVersion", rt.api_version)
            obj.setdefault("kind", rt.kind)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        for field_name, value in (("apiVersion", api_version), ("kind", kind)):
            if value is not None and not isinstance(value, str):
                raise errors.bad_request(f"{field_name}: must be a string, got {json.dumps(value)[:100]}")
        if not kind:
            raise errors.bad_request("Object 'Kind' is missing in the request body")
        if not api_version:
            raise errors.bad_request("Object 'apiVersion' is missing in the request body")
        if kind != rt.kind or (api_version != rt.api_version and api_version not in self._accepted_versions(rt)):
            raise errors.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.api_version})" if kind == rt.kind else
                f"the kind in the data ({kind}) does not match the expected kind ({rt.kind}) for {rt.qualified_resource}")
        obj["apiVersion"] = rt.api_version
        if not isinstance(obj.get("metadata", {}), dict):
            raise errors.bad_request("metadata must be a JSON object")
        for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
            value = (obj.get("metadata") or {}).get(key)
            if value is not None and not isinstance(value, str):
                raise errors.bad_request(f"metadata.{key}: must be a string, got {json.dumps(value)[:100]}")
        obj.setdefault("metadata", {})
        return obj

    def _accepted_versions(self, rt: ResourceType) -> set[str]:
        return {f"{rt.group}/{v}" if rt.group else v for v in rt.served_versions}

    def _place_namespace(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> None:
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace or body_ns or "default"
        else:
            meta.pop("namespace", None)

    def _initial_status(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        if not rt.has_status:
            return
        obj.pop("status", None)
        key = rt.storage_key
        if key == ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
        elif key == ("", "namespaces"):
            obj["status"] = {"phase": "Active"}
        elif key == ("", "services"):
            obj["status"] = {"loadBalancer": {}}
        elif key == ("batch", "jobs"):
            obj["status"] = {}

    def _kind_defaults_on_create(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        key = rt.storage_key
        meta = obj["metadata"]
        if key == ("", "namespaces"):
            meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        elif key == ("", "services"):
            spec = obj.setdefault("spec", {})
            if spec.get("type", "ClusterIP") == "ClusterIP" and not spec.get("clusterIP"):
                self._service_ip += 1
                ip = f"10.96.{self._service_ip // 250}.{self._service_ip % 250 + 1}"
                spec["clusterIP"] = ip
                spec["clusterIPs"] = [ip]
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
        elif key == ("", "pods"):
            spec = obj.setdefault("spec", {})
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("dnsPolicy", "ClusterFirst")

    # ------------------------------------------------------------------ update / patch

    async def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, opts: WriteOptions
                     ) -> dict[str, Any]:
        if is_events_v1(rt):
            self._check_body(rt, body)
            return core_to_events_v1(await self.update(self._core_events(), namespace, name, events_v1_to_core(body), opts))
        obj = self._check_body(rt, body)
        old = self._stored(rt, namespace, name).load()
        meta = _meta(obj)
        self._check_identity(rt, namespace, name, meta)
        rv = meta.get("resourceVersion")
        if not rv:
            if not rt.builtin:
                raise self._invalid(rt, name, [field_cause(
                    "metadata.resourceVersion", "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update")])
        elif rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        return await self._update_from(rt, old, obj, opts)

    async def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: bytes,
                    opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        stored = self.store.get(rt.storage_key, namespace or "", name)
        if is_events_v1(rt):
            return await self._patch_events_v1(rt, namespace, name, patch_type, body, opts)
        if patch_type == "apply":
            return await self._apply(rt, namespace, name, stored, body, opts)
        if stored is None:
            raise errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
        old = stored.load()
        patched = machinery.apply_patch(rt, patch_type, old, body)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch result is not a JSON object")
        patched.setdefault("metadata", {})
        if not isinstance(patched["metadata"], dict):
            raise errors.bad_request("metadata must be a JSON object")
        self._check_identity(rt, namespace, name, patched["metadata"], patched_kind=patched.get("kind"))
        if patched.get("kind") != rt.kind:
            raise errors.bad_request(f"the kind in the data ({patched.get('kind')}) does not match the expected kind ({rt.kind})")
        rv = patched["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        patched["apiVersion"] = rt.api_version
        return 200, await self._update_from(rt, old, patched, opts)

    async def _patch_events_v1(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str,
                               body: bytes, opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        """Patch an events.k8s.io/v1 view: patch the converted object, store it as a core Event."""
        core = self._core_events()
        if patch_type == "apply":
            config = events_v1_to_core(machinery.parse_apply_body(body))
            code, obj = await self._apply(core, namespace, name, self.store.get(core.storage_key, namespace or "", name),
                                          dumps(config), opts)
            return code, core_to_events_v1(obj)
        view = core_to_events_v1(self._stored(rt, namespace, name).load())
        patched = machinery.apply_patch(rt, patch_type, view, body)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch result is not a JSON object")
        old = self._stored(core, namespace, name).load()
        new = self._check_body(core, events_v1_to_core(patched))
        self._check_identity(core, namespace, name, new["metadata"])
        rv = new["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        return 200, core_to_events_v1(await self._update_from(core, old, new, opts))

    async def _apply(self, rt: ResourceType, namespace: str | None, name: str, stored: StoredObject | None,
                     body: bytes, opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        if not opts.manager_given:
            # the contract's observed answer: 400 with the PatchOptions validation text
            raise errors.bad_request('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                     "is required for apply patch")
        config = machinery.parse_apply_body(body)
        config = self._check_body(rt, config)
        meta = config["metadata"]
        if not meta.get("name"):
            raise errors.bad_request("metadata.name is required in an apply configuration")
        self._check_identity(rt, namespace, name, meta)
        if stored is None and opts.subresource:
            raise errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
        config = self._prune_config(rt, config, opts)
        if stored is None:
            self._place_namespace(rt, namespace, config["metadata"])
            result = machinery.server_side_apply(rt, None, config, opts)
            obj = result.object
            managed = obj["metadata"].pop("managedFields", [])
            # the configuration was pruned above, and applying it to nothing adds no field
            created = await self.create(rt, namespace, obj, opts, managed_fields=managed, pruned=True)
            return 201, created
        old = stored.load()
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        # Apply is idempotent: the same manager re-applying the same bytes to the object it left
        # behind (same resourceVersion) changes nothing. Level-triggered appliers do this a lot.
        memo_key = (rt.storage_key, namespace or "", name, opts.manager, opts.subresource or "", opts.force,
                    self.registry.generation)
        digest = hashlib.blake2b(body, digest_size=16).digest()
        if not opts.dry_run and self._apply_memo.get(memo_key) == (stored.rv, digest):
            return 200, old
        result = machinery.server_side_apply(rt, old, config, opts)
        if not result.changed:
            self._remember_apply(memo_key, stored.rv, digest, opts)
            return 200, old
        applied = await self._update_from(rt, old, result.object, opts, managed_fields_done=True)
        self._remember_apply(memo_key, int(applied["metadata"]["resourceVersion"]), digest, opts)
        return 200, applied

    def _remember_apply(self, key: tuple, rv: int, digest: bytes, opts: WriteOptions) -> None:
        if opts.dry_run:
            return
        if len(self._apply_memo) >= 100_000:
            self._apply_memo.clear()
        self._apply_memo[key] = (rv, digest)

    def _prune_config(self, rt: ResourceType, config: dict[str, Any], opts: WriteOptions) -> dict[str, Any]:
        """An apply configuration without unknown fields (reported per fieldValidation), not defaulted."""
        if rt.builtin:
            return machinery.check_builtin_fields(rt, config, opts)
        return self.schemas.process_config(rt, config, opts)

    def _check_identity(self, rt: ResourceType, namespace: str | None, name: str, meta: dict[str, Any],
                        patched_kind: str | None = None) -> None:
        body_name = meta.get("name")
        if body_name and body_name != name:
            raise errors.bad_request(f"the name of the object ({body_name}) does not match the name on the URL ({name})")
        meta["name"] = name
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)

    async def _update_from(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], opts: WriteOptions,
                           managed_fields_done: bool = False) -> dict[str, Any]:
        meta, old_meta = new["metadata"], old["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        if not managed_fields_done:
            if "managedFields" in old_meta:
                meta["managedFields"] = old_meta["managedFields"]
            else:
                meta.pop("managedFields", None)
        if rt.has_status:
            if opts.subresource == "status":
                status = new.get("status")
                new = copy.deepcopy(old)
                new["metadata"]["managedFields"] = meta.get("managedFields", old_meta.get("managedFields"))
                if new["metadata"]["managedFields"] is None:
                    new["metadata"].pop("managedFields")
                if status is None:
                    new.pop("status", None)
                else:
                    new["status"] = status
                meta = new["metadata"]
            elif "status" in old:
                new["status"] = old["status"]
            else:
                new.pop("status", None)
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added - {FOREGROUND, ORPHAN}:
                raise self._invalid(rt, meta["name"], [field_cause(
                    "metadata.finalizers", "FieldValueForbidden",
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers "
                    + json.dumps(sorted(added)))])
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._crd_status(new)
        if rt.resource in ("rolebindings", "clusterrolebindings") and rt.group == "rbac.authorization.k8s.io" \
                and new.get("roleRef") != old.get("roleRef"):
            ref = new.get("roleRef") if isinstance(new.get("roleRef"), dict) else {}
            shown = ", ".join(f'{k}:{json.dumps(str(ref.get(j, "")))}' for k, j in
                              (("APIGroup", "apiGroup"), ("Kind", "kind"), ("Name", "name")))
            raise self._invalid(rt, meta["name"], [field_cause(  # kube-apiserver's ValidateRoleBindingUpdate
                "roleRef", "FieldValueInvalid", f"Invalid value: rbac.RoleRef{{{shown}}}: cannot change roleRef")])
        result = await self._finish_write(rt, "UPDATE", new, old, opts, managed_fields_done=managed_fields_done)
        return result

    # ------------------------------------------------------------------ common write path

    async def _finish_write(self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
                            opts: WriteOptions, managed_fields_done: bool = False, pruned: bool = False
                            ) -> dict[str, Any]:
        """The chain after a create's or update's preparation, in kube-apiserver's order:
        decode (prune, default) -> mutating admission -> the kind's strategy (decode again after
        a mutation, prepare, validate) -> validating admission -> store."""
        obj = self._decode(rt, obj, opts, pruned=pruned)
        if self.admission is not None:
            mutated = await self.admission.mutate(operation, rt, obj, old, opts)
            if mutated is not None:
                # defaults apply again to what a webhook answered, and fields the kind does not
                # know are dropped silently (the webhook's patch is decoded like a request body)
                obj = self._decode(rt, mutated, opts, report_unknown=False)
                self._prepare_again(rt, obj, old, opts)
        self._validate(rt, operation, obj, old, opts)
        if self.rbac_guard is not None and rt.group == "rbac.authorization.k8s.io":
            self.rbac_guard(rt, obj, opts)
        if self.admission is not None:
            await self.admission.validate(operation, rt, obj, old, opts)
        meta = obj["metadata"]
        name = meta["name"]
        if old is not None:
            changed = _outside_metadata(obj, rt.has_status) != _outside_metadata(old, rt.has_status)
            obj["metadata"]["generation"] = int(old["metadata"].get("generation") or 0) + (1 if changed else 0)
        if not managed_fields_done:
            obj = machinery.record_update(rt, old, obj, opts)
        if old is not None and _without_volatile(obj) == _without_volatile(old):
            return old  # no-op: same resourceVersion, no event
        if old is not None and meta.get("deletionTimestamp") and not meta.get("finalizers") \
                and not meta.get("deletionGracePeriodSeconds"):
            # The last finalizer is gone; a pod still in its grace period waits for its kubelet.
            return await self._remove(rt, obj, opts)
        if opts.dry_run:
            return obj
        ns = meta.get("namespace", "") if rt.namespaced else ""
        self.store.put(rt.storage_key, ns, name, obj)
        await self._after_put(rt, obj, old)
        await self.store.durable(self.store.rv)
        return obj

    def _decode(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions, pruned: bool = False,
                report_unknown: bool = True) -> dict[str, Any]:
        """What decoding a body does before admission: unknown fields pruned (reported per
        fieldValidation), defaults applied, a Secret's stringData merged into data."""
        if not rt.builtin:
            return self.schemas.decode(rt, obj, opts, pruned=pruned, report_unknown=report_unknown)
        key = rt.storage_key
        if key == ("", "secrets") and "stringData" in obj:
            string_data = obj.pop("stringData") or {}
            data = obj.setdefault("data", {}) or {}
            for k, v in string_data.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            obj["data"] = data
        if report_unknown:
            obj = machinery.check_builtin_fields(rt, obj, opts)
        else:
            obj = machinery.check_builtin_fields(rt, obj, WriteOptions(field_validation="Ignore"))
        if key[0] == "admissionregistration.k8s.io" and key[1].startswith("validatingadmissionpolic"):
            set_policy_defaults(rt.kind, obj)
        return obj

    def _prepare_again(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                       opts: WriteOptions) -> None:
        """PrepareForCreate/PrepareForUpdate run after mutating admission in kube-apiserver, so
        what a webhook set where the request may not write is reset: the status of a create, the
        status of a main-resource update, everything but the status of a status update."""
        if old is None:
            if rt.has_status and "status" in obj:
                self._initial_status(rt, obj)
            return
        if not rt.has_status:
            return
        if opts.subresource == "status":
            for key in [k for k in obj if k not in ("apiVersion", "kind", "metadata", "status")]:
                del obj[key]
            obj.update({k: copy.deepcopy(v) for k, v in old.items()
                        if k not in ("apiVersion", "kind", "metadata", "status")})
        elif "status" in old:
            obj["status"] = old["status"]
        else:
            obj.pop("status", None)

    def _validate(self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
                  opts: WriteOptions) -> None:
        """The kind's strategy validation: object metadata (name on create, labels,
        annotations), then the schema and CEL rules of a custom resource or the built-in
        kind's checks, and the fields an update may not change."""
        meta = obj["metadata"]
        name = meta["name"]
        cause_list = naming.name_errors(rt.group, rt.resource, name) if operation == "CREATE" else []
        cause_list += naming.label_errors(meta.get("labels"))
        cause_list += naming.annotation_errors(meta.get("annotations"))
        if cause_list:
            raise self._invalid(rt, name, cause_list)
        if not rt.builtin:
            self.schemas.validate(rt, obj, old, opts)
            return
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self._validate_crd(obj)
        if rt.validated:
            causes = machinery.validate_builtin(rt, obj)
            if causes:
                raise self._invalid(rt, name, causes)
        if old is not None and opts.subresource != "status":
            changes = update_causes(rt.storage_key, obj, old)
            if changes:
                raise self._invalid(rt, name, changes)

    async def _after_put(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            self.registry.install_crd(obj)

    def _invalid(self, rt: ResourceType, name: str, causes: list[dict[str, str]]) -> ApiError:
        return errors.invalid(rt.qualified_kind, name, rt.group, rt.kind, causes)

    # ------------------------------------------------------------------ CRDs

    def _validate_crd(self, obj: dict[str, Any]) -> None:
        rt = self.registry.by_group_resource("apiextensions.k8s.io", "customresourcedefinitions")
        assert rt is not None
        spec = obj.get("spec")
        name = obj["metadata"]["name"]
        causes = []
        if not isinstance(spec, dict):
            raise self._invalid(rt, name, [field_cause("spec", "FieldValueRequired", "Required value")])
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
        if not versions:
            causes.append(field_cause("spec.versions", "FieldValueInvalid", "Invalid value: must have exactly one version marked as storage version"))
        elif sum(1 for v in versions if v.get("storage")) != 1:
            causes.append(field_cause("spec.versions", "FieldValueInvalid",
                                      "Invalid value: must have exactly one version marked as storage version"))
        if spec.get("scope") not in ("Namespaced", "Cluster"):
            causes.append(field_cause("spec.scope", "FieldValueNotSupported",
                                      f'Unsupported value: {json.dumps(spec.get("scope"))}: supported values: "Cluster", "Namespaced"'))
        if causes:
            raise self._invalid(rt, name, causes)
        self._crd_status(obj)

    def _crd_status(self, obj: dict[str, Any]) -> None:
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

    # ------------------------------------------------------------------ delete

    async def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any],
                     opts: WriteOptions) -> tuple[dict[str, Any], bool]:
        """Returns (body, is_object): a Status for a removed object, else the object."""
        stored = self._stored(rt, namespace, name)
        obj = stored.load()
        meta = obj["metadata"]
        pre = options.get("preconditions") or {}
        if not isinstance(pre, dict):
            raise errors.bad_request(f"DeleteOptions.preconditions: must be an object, got {json.dumps(pre)[:100]}")
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource,
                                  f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {meta.get('uid')}")
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise errors.conflict(
                rt.qualified_resource, name, rt.group, rt.resource,
                f"the ResourceVersion in the precondition ({pre['resourceVersion']}) does not match the "
                f"ResourceVersion in record ({meta.get('resourceVersion')}). The object might have been modified")
        policy = options.get("propagationPolicy")
        if policy is None and options.get("orphanDependents") is not None:
            policy = "Orphan" if options["orphanDependents"] else "Background"
        if policy is None:
            policy = "Orphan" if rt.storage_key == ("batch", "jobs") else "Background"
        if policy not in ("Background", "Foreground", "Orphan"):
            raise errors.ApiError(422, "Invalid", f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: '
                                  f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                                  {"group": "meta.k8s.io", "kind": "DeleteOptions"})
        grace = _pod_grace_period(obj, options) if rt.storage_key == ("", "pods") else None
        if meta.get("deletionTimestamp"):
            return await self._shorten_grace(rt, obj, grace, options, opts)
        if self.admission is not None:
            # DELETE goes through both admission stages, with the stored object as oldObject
            await self.admission.mutate("DELETE", rt, None, obj, opts)
            await self.admission.validate("DELETE", rt, None, obj, opts)
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and FOREGROUND not in finalizers and self.store.dependents(meta["uid"]):
            finalizers.append(FOREGROUND)
        is_namespace = rt.storage_key == ("", "namespaces")
        if finalizers or is_namespace or grace:
            marked = copy.deepcopy(obj)
            mmeta = marked["metadata"]
            # A running pod is deleted gracefully: it stays, marked, until its kubelet has
            # stopped the containers and deletes it with a grace period of 0.
            mmeta["deletionTimestamp"] = _rfc3339_in(grace or 0)
            mmeta["deletionGracePeriodSeconds"] = grace or 0
            mmeta["generation"] = int(mmeta.get("generation") or 0) + 1
            if finalizers:
                mmeta["finalizers"] = finalizers
            if is_namespace:
                marked.setdefault("status", {})["phase"] = "Terminating"
            if opts.dry_run:
                return marked, True
            self.store.put(rt.storage_key, namespace or "", name, marked)
            if policy == "Orphan":
                await self._orphan_dependents(marked)
            if FOREGROUND in finalizers:
                await self._delete_dependents(marked, "Foreground")
                marked = await self._maybe_finish_foreground(rt, namespace or "", name) or marked
            if is_namespace:
                await self._sweep_namespace(name)
                current = self.store.get(rt.storage_key, "", name)
                marked = current.load() if current else marked
            await self.store.durable(self.store.rv)
            return marked, True
        if opts.dry_run:
            return obj, rt.return_deleted_object
        if policy == "Orphan":
            await self._orphan_dependents(obj)
        removed = await self._remove(rt, obj, opts)
        await self.store.durable(self.store.rv)
        if rt.return_deleted_object:
            return removed, True
        details: dict[str, Any] = {"name": name}
        if rt.group:
            details["group"] = rt.group
        details["kind"] = rt.resource
        details["uid"] = meta.get("uid")
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}, False

    async def _shorten_grace(self, rt: ResourceType, obj: dict[str, Any], grace: int | None,
                             options: dict[str, Any], opts: WriteOptions) -> tuple[dict[str, Any], bool]:
        """A second DELETE of an object already being deleted: only a pod's pending grace period
        can change, and only to a shorter one (kube-apiserver's ``BeforeDelete``); at 0 and
        without finalizers the pod goes."""
        meta = obj["metadata"]
        current = meta.get("deletionGracePeriodSeconds")
        if grace is None or not current or options.get("gracePeriodSeconds") is None or grace >= current:
            return obj, True
        marked = copy.deepcopy(obj)
        mmeta = marked["metadata"]
        mmeta["deletionTimestamp"] = _rfc3339_in(grace)
        mmeta["deletionGracePeriodSeconds"] = grace
        if opts.dry_run:
            return marked, True
        if grace == 0 and not mmeta.get("finalizers"):
            removed = await self._remove(rt, marked, opts)
            await self.store.durable(self.store.rv)
            return removed, True
        self.store.put(rt.storage_key, mmeta.get("namespace", ""), mmeta["name"], marked)
        await self.store.durable(self.store.rv)
        return marked, True

    async def delete_collection(self, rt: ResourceType, namespace: str | None, label_selector: str,
                                field_selector: str, options: dict[str, Any], opts: WriteOptions) -> None:
        _, items = self.list(rt, namespace, label_selector, field_selector)
        for stored in items:
            meta = stored.load()["metadata"]
            try:
                await self.delete(rt, meta.get("namespace"), meta["name"], options, opts)
            except ApiError as err:
                if err.code != 404:
                    raise

    async def _remove(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions) -> dict[str, Any]:
        """Remove the object for good, then collect its dependents (background)."""
        meta = obj["metadata"]
        ns = meta.get("namespace", "") if rt.namespaced else ""
        if self.store.get(rt.storage_key, ns, meta["name"]) is None:
            return obj
        self.store.delete(rt.storage_key, ns, meta["name"], obj)
        if rt.storage_key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            await self._remove_crd_objects(obj)
        await self._delete_dependents(obj, "Background")
        await self._owners_changed(obj)
        if ns:
            ns_obj = self.namespace_exists(ns)
            if ns_obj is not None and ns_obj.load()["metadata"].get("deletionTimestamp"):
                await self._sweep_namespace(ns)
        return obj

    async def _remove_crd_objects(self, crd: dict[str, Any]) -> None:
        types = self.registry.remove_crd(crd["metadata"]["name"])
        if not types:
            return
        rt = types[0]
        for (ns, name), stored in self.store.list(rt.storage_key):
            self.store.delete(rt.storage_key, ns, name, stored.load())

    def _find_owner(self, ref: dict[str, Any], namespace: str) -> tuple[ResourceType, dict[str, Any]] | None:
        api_version, kind = ref.get("apiVersion", ""), ref.get("kind", "")
        rt = self.registry.by_kind(api_version, kind)
        if rt is None:
            return None
        stored = self.store.get(rt.storage_key, namespace if rt.namespaced else "", ref.get("name", ""))
        if stored is None:
            return None
        obj = stored.load()
        if obj["metadata"].get("uid") != ref.get("uid"):
            return None
        return rt, obj

    def _type_for_key(self, key: tuple[str, str]) -> ResourceType | None:
        return self.registry.by_group_resource(*key)

    async def _delete_dependents(self, owner: dict[str, Any], policy: str) -> None:
        uid = owner["metadata"].get("uid")
        if not uid:
            return
        for key, ns, name in self.store.dependents(uid):
            rt = self._type_for_key(key)
            stored = self.store.get(key, ns, name)
            if rt is None or stored is None:
                continue
            dep = stored.load()
            refs = dep["metadata"].get("ownerReferences") or []
            others = [r for r in refs if r.get("uid") != uid]
            if policy == "Background" and any(self._find_owner(r, ns) for r in others):
                dep["metadata"]["ownerReferences"] = others
                await self._finish_write(rt, "UPDATE", dep, stored.load(), WriteOptions(manager="generic-garbage-collector"))
                continue
            try:
                await self.delete(rt, ns or None, name, {"propagationPolicy": policy},
                                  WriteOptions(manager="generic-garbage-collector"))
            except ApiError as err:
                if err.code != 404:
                    log.warning("garbage collection of %s %s/%s failed: %s", rt.resource, ns, name, err.message)

    async def _orphan_dependents(self, owner: dict[str, Any]) -> None:
        uid = owner["metadata"].get("uid")
        for key, ns, name in self.store.dependents(uid):
            rt = self._type_for_key(key)
            stored = self.store.get(key, ns, name)
            if rt is None or stored is None:
                continue
            dep = stored.load()
            dep["metadata"]["ownerReferences"] = [r for r in dep["metadata"].get("ownerReferences") or []
                                                  if r.get("uid") != uid]
            if not dep["metadata"]["ownerReferences"]:
                del dep["metadata"]["ownerReferences"]
            await self._finish_write(rt, "UPDATE", dep, stored.load(), WriteOptions(manager="generic-garbage-collector"))

    async def _owners_changed(self, removed: dict[str, Any]) -> None:
        """A removed dependent may let an owner in foreground deletion finish."""
        ns = removed["metadata"].get("namespace", "")
        for ref in removed["metadata"].get("ownerReferences") or []:
            found = self._find_owner(ref, ns)
            if found is None:
                continue
            rt, owner = found
            if FOREGROUND in (owner["metadata"].get("finalizers") or []):
                await self._maybe_finish_foreground(rt, owner["metadata"].get("namespace", ""), owner["metadata"]["name"])

    async def _maybe_finish_foreground(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        stored = self.store.get(rt.storage_key, namespace, name)
        if stored is None:
            return None
        owner = stored.load()
        if self.store.dependents(owner["metadata"]["uid"]):
            return owner
        updated = copy.deepcopy(owner)
        updated["metadata"]["finalizers"] = [f for f in owner["metadata"].get("finalizers") or [] if f != FOREGROUND]
        if not updated["metadata"]["finalizers"]:
            del updated["metadata"]["finalizers"]
        return await self._finish_write(rt, "UPDATE", updated, owner, WriteOptions(manager="generic-garbage-collector"),
                                        managed_fields_done=True)

    async def _sweep_namespace(self, namespace: str) -> None:
        """Delete everything in a terminating namespace; remove it once it is empty."""
        if namespace in self._sweeping:
            return
        self._sweeping.add(namespace)
        try:
            await self._sweep_namespace_once(namespace)
        finally:
            self._sweeping.discard(namespace)

    async def _sweep_namespace_once(self, namespace: str) -> None:
        ns_type = self.registry.lookup("", "v1", "namespaces")
        assert ns_type is not None
        for rt in list(self.registry.all()):
            if not rt.namespaced or is_events_v1(rt):
                continue
            for (ns, name), stored in self.store.list(rt.storage_key, namespace):
                if stored.load()["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    await self.delete(rt, ns, name, {"propagationPolicy": "Background"},
                                      WriteOptions(manager="namespace-controller"))
                except ApiError:
                    pass
        remaining = any(self.store.list(rt.storage_key, namespace) for rt in self.registry.all() if rt.namespaced)
        ns_stored = self.store.get(ns_type.storage_key, "", namespace)
        if not remaining and ns_stored is not None:
            ns_obj = ns_stored.load()
            if not [f for f in ns_obj["metadata"].get("finalizers") or []]:
                self.store.delete(ns_type.storage_key, "", namespace, ns_obj)
