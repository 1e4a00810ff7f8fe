"""The REST semantics of every served resource: create, get, list, update, patch, delete.

Pure request semantics over the store (no HTTP here): metadata rules, status-subresource rules,
generation, optimistic concurrency, no-op writes, finalizers, garbage collection, namespace
deletion, CRD installation. Patch formats, selectors, managedFields and Server-Side Apply come
from ``trainyard.apimachinery`` through ``machinery``.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import secrets as pysecrets
from typing import Any

from .. import errors
from . import machinery
from .chain import AdmissionStage, WriteChain
from .controllers import FOREGROUND, ORPHAN, Change, GarbageCollector, NamespaceController
from .bodies import check_body, check_identity, place_namespace
from .deletion import Deletion, stored_or_404
from .guaranteed import guaranteed_update
from .options import WriteOptions
from .strategies import Strategies, StoredAs, initial_status, invalid
from .clock import now_rfc3339
from ..errors import ApiError, field_cause
from .kinds import Registry, ResourceType
from ...storage.store import Store, StoredObject, dumps
from .uids import new_uid

log = logging.getLogger("trainyard.devcluster.api")

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease", "kubeflow-system")
# metadata the client cannot set through create/update bodies
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation",
                "resourceVersion", "selfLink", "managedFields")


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    return meta


class Api:
    def __init__(self, store: Store, registry: Registry, admission: AdmissionStage | None = None) -> None:
        self.store = store
        self.registry = registry
        self.strategies = Strategies(registry, store)
        # the stages after decoding: admission, strategy, commit (apiserver/registry/chain.py)
        self.chain = WriteChain(store, registry, self.strategies, admission)
        self.schemas = self.chain.schemas
        # the server's own controllers, writing back through this generic store
        self.gc = GarbageCollector(store, registry)
        self.namespaces = NamespaceController(store, registry)
        self.gc.writer = self.namespaces.writer = self
        self.deletion = Deletion(store, self.chain, self.gc, self.namespaces)
        self.chain.remove = self.deletion.remove
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
            namespace = stored.load()
            if not namespace["metadata"].get("deletionTimestamp"):
                await self.create_follow_ups(ns_type, namespace)

    # ------------------------------------------------------------------ reads

    def stored(self, rt: ResourceType, namespace: str | None, name: str) -> StoredObject:
        return stored_or_404(self.store, rt, namespace, name)

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        return self.view(rt, self.stored(rt, namespace, name).load())

    def get_raw(self, rt: ResourceType, namespace: str | None, name: str) -> bytes:
        stored = self.stored(rt, namespace, name)
        if self.needs_view(rt):
            return dumps(self.view(rt, stored.load()))
        return stored.raw

    def needs_view(self, rt: ResourceType) -> bool:
        return (not rt.builtin and len(rt.served_versions) > 1) or self.strategies.stored_as(rt) is not None

    def view(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """The stored object as the requested version (CR versions share one schema: no conversion)."""
        stored_as = self.strategies.stored_as(rt)
        if stored_as is not None:
            return stored_as.from_stored(obj) if obj.get("apiVersion") == stored_as.api_version else obj
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

    def _stored_type(self, stored_as: StoredAs) -> ResourceType:
        """The type the objects of a type stored as another are written through."""
        found = self.registry.lookup(stored_as.group, stored_as.version, stored_as.resource)
        assert found is not None, "a type is stored as a served type"
        return found

    async def create(self, rt: ResourceType, namespace: str | None, body: Any, opts: WriteOptions,
                     managed_fields: list[dict[str, Any]] | None = None, pruned: bool = False) -> dict[str, Any]:
        """``pruned``: a custom resource's body holds no field its schema does not know (an apply
        configuration pruned by ``_prune_config``), so schema processing does not prune it again."""
        stored_as = self.strategies.stored_as(rt)
        if stored_as is not None:
            check_body(rt, body)
            created = await self.create(self._stored_type(stored_as), namespace, stored_as.to_stored(body), opts,
                                        managed_fields)
            return stored_as.from_stored(created)
        obj = check_body(rt, body)
        meta = _meta(obj)
        place_namespace(rt, namespace, meta)
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
        meta["uid"] = new_uid()
        meta["creationTimestamp"] = now_rfc3339()
        meta["generation"] = 1
        initial_status(self.strategies, rt, obj)
        self.strategies.of(rt).defaults_on_create(obj)
        if managed_fields is not None:
            meta["managedFields"] = managed_fields
        obj = await self._finish_write(rt, "CREATE", obj, None, opts, managed_fields_done=managed_fields is not None,
                                       pruned=pruned)
        if not opts.dry_run:
            await self.create_follow_ups(rt, obj)
        return obj

    async def create_follow_ups(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        """What the server's controllers create once ``obj`` exists (the kind's strategy says:
        a namespace's ``default`` ServiceAccount), unless it exists already."""
        for body in self.strategies.of(rt).follow_ups(obj):
            meta = body["metadata"]
            kind = self.registry.by_kind(body["apiVersion"], body["kind"])
            if kind is None or self.store.get(kind.storage_key, meta.get("namespace", ""), meta["name"]) is not None:
                continue
            try:
                await self.create(kind, meta.get("namespace"), body, WriteOptions(manager="devcluster"))
            except errors.ApiError as err:
                if err.code != 409:  # created meanwhile by someone else: fine
                    raise

    # ------------------------------------------------------------------ update / patch

    async def update(self, rt: ResourceType, namespace: str | None, name: str, body: Any, opts: WriteOptions
                     ) -> dict[str, Any]:
        """PUT. With a resourceVersion in the body, a write committed since answers 409; without
        one (a built-in kind allows that), the update is made again on the new object."""
        meta = body.get("metadata") if isinstance(body, dict) else None
        if isinstance(meta, dict) and meta.get("resourceVersion"):
            return await self._update_once(rt, namespace, name, body, opts)
        return await guaranteed_update((rt.storage_key, namespace or "", name),
                                       lambda: self._update_once(rt, namespace, name, copy.deepcopy(body), opts), opts)

    async def _update_once(self, rt: ResourceType, namespace: str | None, name: str, body: Any, opts: WriteOptions
                           ) -> dict[str, Any]:
        stored_as = self.strategies.stored_as(rt)
        if stored_as is not None:
            check_body(rt, body)
            return stored_as.from_stored(await self._update_once(self._stored_type(stored_as), namespace, name,
                                                                 stored_as.to_stored(body), opts))
        obj = check_body(rt, body)
        old = self.stored(rt, namespace, name).load()
        meta = _meta(obj)
        check_identity(rt, namespace, name, meta)
        rv = meta.get("resourceVersion")
        if not rv:
            if not rt.builtin:
                raise self._invalid(rt, name, [field_cause(
                    "metadata.resourceVersion", "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update")])
        elif rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        return await self.update_from(rt, old, obj, opts)

    async def patch(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: bytes,
                    opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        """PATCH and server-side apply: computed on the stored object and, when another write
        commits first, computed again on the new one (a resourceVersion in the patch then answers
        409), as kube-apiserver's GuaranteedUpdate."""
        return await guaranteed_update((rt.storage_key, namespace or "", name),
                                       lambda: self._patch_once(rt, namespace, name, patch_type, body, opts), opts)

    async def _patch_once(self, rt: ResourceType, namespace: str | None, name: str, patch_type: str, body: bytes,
                          opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        stored = self.store.get(rt.storage_key, namespace or "", name)
        stored_as = self.strategies.stored_as(rt)
        if stored_as is not None:
            return await self._patch_stored_as(rt, stored_as, namespace, name, patch_type, body, opts)
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
        check_identity(rt, namespace, name, patched["metadata"], patched_kind=patched.get("kind"))
        if patched.get("kind") != rt.kind:
            raise errors.bad_request(f"the kind in the data ({patched.get('kind')}) does not match the expected kind ({rt.kind})")
        rv = patched["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        patched["apiVersion"] = rt.api_version
        return 200, await self.update_from(rt, old, patched, opts)

    async def _patch_stored_as(self, rt: ResourceType, stored_as: StoredAs, namespace: str | None, name: str,
                               patch_type: str, body: bytes, opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        """Patch a type stored as another (an events.k8s.io/v1 Event): patch the converted
        object, store it as the other type (a core Event)."""
        core = self._stored_type(stored_as)
        if patch_type == "apply":
            config = stored_as.to_stored(machinery.parse_apply_body(body))
            code, obj = await self._apply(core, namespace, name, self.store.get(core.storage_key, namespace or "", name),
                                          dumps(config), opts)
            return code, stored_as.from_stored(obj)
        view = stored_as.from_stored(self.stored(rt, namespace, name).load())
        patched = machinery.apply_patch(rt, patch_type, view, body)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch result is not a JSON object")
        old = self.stored(core, namespace, name).load()
        new = check_body(core, stored_as.to_stored(patched))
        check_identity(core, namespace, name, new["metadata"])
        rv = new["metadata"].get("resourceVersion")
        if rv and rv != old["metadata"].get("resourceVersion"):
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
        return 200, stored_as.from_stored(await self.update_from(core, old, new, opts))

    async def _apply(self, rt: ResourceType, namespace: str | None, name: str, stored: StoredObject | None,
                     body: bytes, opts: WriteOptions) -> tuple[int, dict[str, Any]]:
        if not opts.manager_given:
            # the contract's observed answer: 400 with the PatchOptions validation text
            raise errors.bad_request('PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: '
                                     "is required for apply patch")
        config = machinery.parse_apply_body(body)
        config = check_body(rt, config)
        meta = config["metadata"]
        if not meta.get("name"):
            raise errors.bad_request("metadata.name is required in an apply configuration")
        check_identity(rt, namespace, name, meta)
        if stored is None and opts.subresource:
            raise errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
        config = self._prune_config(rt, config, opts)
        if stored is None:
            place_namespace(rt, namespace, config["metadata"])
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
        applied = await self.update_from(rt, old, result.object, opts, managed_fields_done=True)
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

    async def update_from(self, rt: ResourceType, old: dict[str, Any], new: dict[str, Any], opts: WriteOptions,
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
        self.strategies.of(rt).prepare_for_update(new, old)
        result = await self._finish_write(rt, "UPDATE", new, old, opts, managed_fields_done=managed_fields_done)
        return result

    async def update_with(self, rt: ResourceType, namespace: str, name: str, change: Change, opts: WriteOptions,
                          managed_fields_done: bool = False) -> dict[str, Any] | None:
        """The controllers' writes: ``change`` of a copy of the stored object through the chain,
        made again on the new object when another write commits first. None: the object is
        gone; the stored object when ``change`` makes no write."""
        async def attempt() -> dict[str, Any] | None:
            stored = self.store.get(rt.storage_key, namespace, name)
            if stored is None:
                return None
            new = change(stored.load())
            if new is None:
                return stored.load()
            return await self._finish_write(rt, "UPDATE", new, stored.load(), opts,
                                            managed_fields_done=managed_fields_done)
        return await guaranteed_update((rt.storage_key, namespace, name), attempt, opts)

    async def _finish_write(self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
                            opts: WriteOptions, managed_fields_done: bool = False, pruned: bool = False
                            ) -> dict[str, Any]:
        return await self.chain.run(rt, operation, obj, old, opts, managed_fields_done=managed_fields_done,
                                    pruned=pruned)

    def _invalid(self, rt: ResourceType, name: str, causes: list[dict[str, str]]) -> ApiError:
        return invalid(rt, name, causes)

    # ------------------------------------------------------------------ delete

    async def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any],
                     opts: WriteOptions) -> tuple[dict[str, Any], bool]:
        """Returns (body, is_object): a Status for a removed object, else the object."""
        return await self.deletion.delete(rt, namespace, name, options, opts)

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
