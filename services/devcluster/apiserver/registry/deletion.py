"""The deletion stage: DELETE with preconditions, propagation policies and finalizers.

kube-apiserver's generic registry ``Delete``: preconditions (uid, resourceVersion), the
propagation policy (the kind's default: Background, Orphan for Jobs), both admission stages with
the stored object as ``oldObject``, then either marking the object (deletionTimestamp, the
foregroundDeletion finalizer, a namespace's Terminating phase) or removing it; the garbage
collector and the namespace controller (``controllers``) take the dependents and the contents.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Awaitable, Callable

from .. import errors
from .clock import rfc3339_in
from .kinds import ResourceType
from ...storage.store import StaleWrite, Store, StoredObject
from .chain import WriteChain, stale_object
from .controllers import FOREGROUND, GarbageCollector, NamespaceController
from .guaranteed import guaranteed_update
from .options import WriteOptions


def stored_or_404(store: Store, rt: ResourceType, namespace: str | None, name: str) -> StoredObject:
    stored = store.get(rt.storage_key, namespace or "", name)
    if stored is None:
        raise errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
    return stored


class Deletion:
    def __init__(self, store: Store, chain: WriteChain, gc: GarbageCollector, namespaces: NamespaceController) -> None:
        self.store = store
        self.chain = chain
        self.strategies = chain.strategies
        self.gc = gc
        self.namespaces = namespaces
        # the controllers a kind's deletion is left to (Strategy.deletion_controller), by name
        self.controllers: dict[str, Callable[[str], Awaitable[None]]] = {"namespace": namespaces.sweep}

    async def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any],
                     opts: WriteOptions) -> tuple[dict[str, Any], bool]:
        """Returns (body, is_object): a Status for a removed object, else the object. A delete
        that loses its commit to another write runs again on the new object (its preconditions,
        when given, then answer 409)."""
        return await guaranteed_update((rt.storage_key, namespace or "", name),
                                       lambda: self._delete_once(rt, namespace, name, options, opts))

    async def _delete_once(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any],
                           opts: WriteOptions) -> tuple[dict[str, Any], bool]:
        stored = stored_or_404(self.store, rt, namespace, name)
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
            policy = self.strategies.of(rt).default_propagation
        if policy not in ("Background", "Foreground", "Orphan"):
            raise errors.ApiError(422, "Invalid", f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: '
                                  f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"',
                                  {"group": "meta.k8s.io", "kind": "DeleteOptions"})
        grace = self.strategies.of(rt).grace_period(obj, options)
        if meta.get("deletionTimestamp"):
            return await self._shorten_grace(rt, obj, grace, options, opts)
        if self.chain.admission is not None:
            # DELETE goes through both admission stages, with the stored object as oldObject
            await self.chain.admission.mutate("DELETE", rt, None, obj, opts)
            await self.chain.admission.validate("DELETE", rt, None, obj, opts)
        finalizers = list(meta.get("finalizers") or [])
        if policy == "Foreground" and FOREGROUND not in finalizers and self.store.dependents(meta["uid"]):
            finalizers.append(FOREGROUND)
        strategy = self.strategies.of(rt)
        controller = self.controllers.get(strategy.deletion_controller or "")
        if finalizers or controller is not None or grace:
            marked = copy.deepcopy(obj)
            mmeta = marked["metadata"]
            # A running pod is deleted gracefully: it stays, marked, until its kubelet has
            # stopped the containers and deletes it with a grace period of 0.
            mmeta["deletionTimestamp"] = rfc3339_in(grace or 0)
            mmeta["deletionGracePeriodSeconds"] = grace or 0
            mmeta["generation"] = int(mmeta.get("generation") or 0) + 1
            if finalizers:
                mmeta["finalizers"] = finalizers
            strategy.mark_deleting(marked)
            if opts.dry_run:
                return marked, True
            try:  # compare-and-swap: a write made while this delete was in admission wins
                await self.store.write(rt.storage_key, namespace or "", name, marked, expect_rv=stored.rv)
            except StaleWrite as stale:
                raise stale_object(rt, namespace or "", name, creating=False, gone=stale.current is None) from stale
            if policy == "Orphan":
                await self.gc.orphan_dependents(marked)
            if FOREGROUND in finalizers:
                await self.gc.delete_dependents(marked, "Foreground")
                marked = await self.gc.maybe_finish_foreground(rt, namespace or "", name) or marked
            if controller is not None:
                await controller(name)
                current = self.store.get(rt.storage_key, "", name)
                marked = current.load() if current else marked
            await self.store.durable(self.store.rv)
            return marked, True
        if opts.dry_run:
            return obj, rt.return_deleted_object
        if policy == "Orphan":
            await self.gc.orphan_dependents(obj)
        removed = await self.remove(rt, obj, opts, stored.rv)
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
        mmeta["deletionTimestamp"] = rfc3339_in(grace)
        mmeta["deletionGracePeriodSeconds"] = grace
        if opts.dry_run:
            return marked, True
        expected = int(meta.get("resourceVersion") or 0)
        if grace == 0 and not mmeta.get("finalizers"):
            removed = await self.remove(rt, marked, opts, expected)
            await self.store.durable(self.store.rv)
            return removed, True
        ns = mmeta.get("namespace", "")
        try:
            await self.store.write(rt.storage_key, ns, mmeta["name"], marked, expect_rv=expected)
        except StaleWrite as stale:
            raise stale_object(rt, ns, mmeta["name"], creating=False, gone=stale.current is None) from stale
        await self.store.durable(self.store.rv)
        return marked, True

    async def remove(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions, expect_rv: int
                     ) -> dict[str, Any]:
        """Remove the object for good, then collect its dependents (background). ``expect_rv``:
        the resourceVersion the removal was decided on; a write since then wins (``StaleObject``)."""
        meta = obj["metadata"]
        ns = meta.get("namespace", "") if rt.namespaced else ""
        try:
            await self.store.remove(rt.storage_key, ns, meta["name"], obj, expect_rv=expect_rv)
        except StaleWrite as stale:
            if stale.current is None:
                return obj  # removed meanwhile by another writer: the outcome this one wanted
            raise stale_object(rt, ns, meta["name"], creating=False, gone=False) from stale
        await self.strategies.of(rt).after_removal(obj)
        await self.gc.delete_dependents(obj, "Background")
        await self.gc.owners_changed(obj)
        if ns:
            ns_obj = self.store.get(("", "namespaces"), "", ns)
            if ns_obj is not None and ns_obj.load()["metadata"].get("deletionTimestamp"):
                await self.namespaces.sweep(ns)
        return obj
