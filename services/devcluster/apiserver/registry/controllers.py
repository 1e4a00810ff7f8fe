"""The server's own controllers over the store: garbage collection and the namespace controller.

kube-controller-manager's garbage collector and namespace controller, run inline after the
write that gives them work (an owner removed or marked for foreground deletion, a namespace
terminating). They read the store and write through the generic store's ``ObjectWriter``
interface, as the managers ``generic-garbage-collector`` and ``namespace-controller`` (which
admission exempts, as kube-apiserver's admission never sees another process's controllers'
internal bookkeeping here).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol

from ..errors import ApiError
from .kinds import Registry, ResourceType
from ...storage.store import StaleWrite, Store
from .options import WriteOptions

log = logging.getLogger("trainyard.devcluster.controllers")

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
GC_MANAGER = "generic-garbage-collector"
NAMESPACE_MANAGER = "namespace-controller"


# A controller's change of an object: the new object from a copy of the stored one, or None
# for no write. It runs again on the new object when another writer commits first.
Change = Callable[[dict[str, Any]], dict[str, Any] | None]


def _without_owner(uid: str) -> Change:
    def change(dep: dict[str, Any]) -> dict[str, Any] | None:
        refs = dep["metadata"].get("ownerReferences") or []
        kept = [r for r in refs if r.get("uid") != uid]
        if len(kept) == len(refs):
            return None
        if kept:
            dep["metadata"]["ownerReferences"] = kept
        else:
            del dep["metadata"]["ownerReferences"]
        return dep
    return change


class ObjectWriter(Protocol):
    """The writes controllers make: the generic store's delete and its guaranteed update
    through the chain (``change`` recomputed on the new object after a lost commit)."""

    async def delete(self, rt: ResourceType, namespace: str | None, name: str, options: dict[str, Any],
                     opts: WriteOptions) -> tuple[dict[str, Any], bool]: ...

    async def update_with(self, rt: ResourceType, namespace: str, name: str, change: Change, opts: WriteOptions,
                          managed_fields_done: bool = False) -> dict[str, Any] | None: ...


class GarbageCollector:
    """ownerReferences: Background and Foreground deletion of dependents, Orphan."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.writer: ObjectWriter | None = None

    def _writer(self) -> ObjectWriter:
        assert self.writer is not None, "the garbage collector writes through the generic store"
        return self.writer

    def find_owner(self, ref: dict[str, Any], namespace: str) -> tuple[ResourceType, dict[str, Any]] | None:
        rt = self.registry.by_kind(ref.get("apiVersion", ""), ref.get("kind", ""))
        if rt is None:
            return None
        stored = self.store.get(rt.storage_key, namespace if rt.namespaced else "", ref.get("name", ""))
        if stored is None:
            return None
        obj = stored.load()
        if obj["metadata"].get("uid") != ref.get("uid"):
            return None
        return rt, obj

    async def delete_dependents(self, owner: dict[str, Any], policy: str) -> None:
        """Delete the owner's dependents with ``policy``; a dependent with another live owner
        only loses its reference to this one (Background)."""
        uid = owner["metadata"].get("uid")
        if not uid:
            return
        for key, ns, name in self.store.dependents(uid):
            rt = self.registry.by_group_resource(*key)
            stored = self.store.get(key, ns, name)
            if rt is None or stored is None:
                continue
            dep = stored.load()
            refs = dep["metadata"].get("ownerReferences") or []
            others = [r for r in refs if r.get("uid") != uid]
            if policy == "Background" and any(self.find_owner(r, ns) for r in others):
                await self._writer().update_with(rt, ns, name, _without_owner(uid), WriteOptions(manager=GC_MANAGER))
                continue
            try:
                await self._writer().delete(rt, ns or None, name, {"propagationPolicy": policy},
                                            WriteOptions(manager=GC_MANAGER))
            except ApiError as err:
                if err.code != 404:
                    log.warning("garbage collection of %s %s/%s failed: %s", rt.resource, ns, name, err.message)

    async def orphan_dependents(self, owner: dict[str, Any]) -> None:
        uid = owner["metadata"].get("uid")
        for key, ns, name in self.store.dependents(uid):
            rt = self.registry.by_group_resource(*key)
            stored = self.store.get(key, ns, name)
            if rt is None or stored is None:
                continue
            await self._writer().update_with(rt, ns, name, _without_owner(uid), WriteOptions(manager=GC_MANAGER))

    async def owners_changed(self, removed: dict[str, Any]) -> None:
        """A removed dependent may let an owner in foreground deletion finish."""
        ns = removed["metadata"].get("namespace", "")
        for ref in removed["metadata"].get("ownerReferences") or []:
            found = self.find_owner(ref, ns)
            if found is None:
                continue
            rt, owner = found
            if FOREGROUND in (owner["metadata"].get("finalizers") or []):
                await self.maybe_finish_foreground(rt, owner["metadata"].get("namespace", ""),
                                                   owner["metadata"]["name"])

    async def maybe_finish_foreground(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        """Drop the foregroundDeletion finalizer of an owner whose dependents are all gone."""
        def finish(owner: dict[str, Any]) -> dict[str, Any] | None:
            finalizers = owner["metadata"].get("finalizers") or []
            if FOREGROUND not in finalizers or self.store.dependents(owner["metadata"]["uid"]):
                return None
            kept = [f for f in finalizers if f != FOREGROUND]
            if kept:
                owner["metadata"]["finalizers"] = kept
            else:
                del owner["metadata"]["finalizers"]
            return owner
        return await self._writer().update_with(rt, namespace, name, finish, WriteOptions(manager=GC_MANAGER),
                                                managed_fields_done=True)


class NamespaceController:
    """A terminating namespace: delete everything in it; remove it once it is empty and has no
    finalizers left."""

    def __init__(self, store: Store, registry: Registry) -> None:
        self.store = store
        self.registry = registry
        self.writer: ObjectWriter | None = None
        self._sweeping: set[str] = set()

    async def sweep(self, namespace: str) -> None:
        if namespace in self._sweeping:  # a deletion inside the sweep comes back here
            return
        self._sweeping.add(namespace)
        try:
            await self._sweep_once(namespace)
        finally:
            self._sweeping.discard(namespace)

    async def _sweep_once(self, namespace: str) -> None:
        assert self.writer is not None, "the namespace controller writes through the generic store"
        ns_type = self.registry.lookup("", "v1", "namespaces")
        assert ns_type is not None
        for rt in list(self.registry.all()):
            if not rt.namespaced or rt.storage_key != (rt.group, rt.resource):  # another type's objects
                continue
            for (ns, name), stored in self.store.list(rt.storage_key, namespace):
                if stored.load()["metadata"].get("deletionTimestamp"):
                    continue
                try:
                    await self.writer.delete(rt, ns, name, {"propagationPolicy": "Background"},
                                             WriteOptions(manager=NAMESPACE_MANAGER))
                except ApiError:
                    pass
        while True:  # until removed, or something keeps it
            remaining = any(self.store.list(rt.storage_key, namespace) for rt in self.registry.all() if rt.namespaced)
            ns_stored = self.store.get(ns_type.storage_key, "", namespace)
            if remaining or ns_stored is None:
                return
            ns_obj = ns_stored.load()
            if ns_obj["metadata"].get("finalizers"):
                return
            try:
                await self.store.remove(ns_type.storage_key, "", namespace, ns_obj, expect_rv=ns_stored.rv)
                return
            except StaleWrite:
                continue  # written meanwhile by another API worker: look again
