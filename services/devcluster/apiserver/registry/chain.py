"""The write chain of kube-apiserver, after a request is decoded and prepared.

``WriteChain.run`` takes a create's or update's object through the stages in kube-apiserver's
order: decode (unknown fields pruned and reported per ``fieldValidation``, defaults) -> mutating
admission (``AdmissionStage.mutate``) -> the kind's strategy (decode again after a
mutation, PrepareForCreate/Update again, ObjectMeta/schema/CEL/kind validation,
``strategies``) -> RBAC escalation checks -> validating admission (``AdmissionStage.validate``:
policies, then webhooks) -> generation, managedFields, no-op detection -> store commit and the
kind's after-commit step. An update that leaves a deleting object without finalizers is a
removal (``remove``, the deletion stage).
"""
from __future__ import annotations

import copy
from typing import Any, Awaitable, Callable, Protocol

from .. import errors
from . import machinery, naming
from .kinds import Registry, ResourceType
from .schema import SchemaProcessor
from ...storage.store import StaleWrite, Store
from .options import WriteOptions
from .strategies import Strategies, initial_status, invalid

class AdmissionStage(Protocol):
    """Mutating and validating admission, as the chain calls them (``admission/stage.py``)."""

    async def mutate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                     old: dict[str, Any] | None, opts: WriteOptions) -> dict[str, Any] | None: ...

    async def validate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None, opts: WriteOptions) -> None: ...


RbacGuard = Callable[[str, ResourceType, dict[str, Any], WriteOptions], None]  # (strategy's check, ...)
# (kind, the object's last state, options, the resourceVersion the removal was decided on)
Remover = Callable[[ResourceType, dict[str, Any], WriteOptions, int], Awaitable[dict[str, Any]]]


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


def stale_object(rt: ResourceType, namespace: str, name: str, creating: bool, gone: bool) -> errors.StaleObject:
    """Another writer committed while this one was in admission: a create finds the object made
    (409 AlreadyExists), an update finds it changed (409) or gone (404); a writer without a
    client precondition recomputes instead (``guaranteed``)."""
    if creating:
        base = errors.already_exists(rt.qualified_resource, name, rt.group, rt.resource)
    elif gone:
        base = errors.not_found(rt.qualified_resource, name, rt.group, rt.resource)
    else:
        base = errors.conflict(rt.qualified_resource, name, rt.group, rt.resource)
    return errors.StaleObject(base, (rt.storage_key, namespace, name))


class WriteChain:
    def __init__(self, store: Store, registry: Registry, strategies: Strategies,
                 admission: AdmissionStage | None = None) -> None:
        self.store = store
        self.registry = registry
        self.strategies = strategies
        self.schemas = SchemaProcessor()
        self.admission = admission  # None: no admission (the store's own tests and tools)
        # RBAC escalation checks on writes of Roles and bindings (filters/authorization.py): the
        # authorizer reads RBAC objects through the store, so it is handed over once it exists
        self.rbac_guard: RbacGuard | None = None
        # the deletion stage's removal, for an update that ends a deletion
        self.remove: Remover | None = None

    async def run(self, rt: ResourceType, operation: str, obj: dict[str, Any], old: dict[str, Any] | None,
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
        check = self.strategies.of(rt).escalation_check
        if self.rbac_guard is not None and check is not None:
            self.rbac_guard(check, rt, obj, opts)
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
            assert self.remove is not None, "the chain removes through the deletion stage"
            return await self.remove(rt, obj, opts, int(old["metadata"].get("resourceVersion") or 0))
        if opts.dry_run:
            return obj
        ns = meta.get("namespace", "") if rt.namespaced else ""
        expected = int(old["metadata"].get("resourceVersion") or 0) if old is not None else 0
        try:
            await self.store.write(rt.storage_key, ns, name, obj, expect_rv=expected)
        except StaleWrite as stale:
            raise stale_object(rt, ns, name, creating=old is None, gone=stale.current is None) from stale
        self.strategies.of(rt).after_commit(obj)
        await self.store.durable(self.store.rv)
        return obj

    def _decode(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions, pruned: bool = False,
                report_unknown: bool = True) -> dict[str, Any]:
        """What decoding a body does before admission: unknown fields pruned (reported per
        fieldValidation), defaults applied, a Secret's stringData merged into data."""
        if not rt.builtin:
            return self.schemas.decode(rt, obj, opts, pruned=pruned, report_unknown=report_unknown)
        obj = machinery.check_builtin_fields(rt, obj, opts if report_unknown else WriteOptions(field_validation="Ignore"))
        self.strategies.of(rt).decode(obj)
        return obj

    def _prepare_again(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                       opts: WriteOptions) -> None:
        """PrepareForCreate/PrepareForUpdate run after mutating admission in kube-apiserver, so
        what a webhook set where the request may not write is reset: the status of a create, the
        status of a main-resource update, everything but the status of a status update."""
        if old is None:
            if rt.has_status and "status" in obj:
                initial_status(self.strategies, rt, obj)
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
        strategy = self.strategies.of(rt)
        cause_list = strategy.name_errors(name) if operation == "CREATE" else []
        cause_list += naming.label_errors(meta.get("labels"))
        cause_list += naming.annotation_errors(meta.get("annotations"))
        if cause_list:
            raise invalid(rt, name, cause_list)
        if not rt.builtin:
            self.schemas.validate(rt, obj, old, opts)
            return
        causes = strategy.validate(rt, obj, old)
        if not causes and rt.validated:
            causes = machinery.validate_builtin(rt, obj) or strategy.validate_fields(obj)
        if not causes and old is not None and opts.subresource != "status":
            causes = strategy.validate_update(obj, old)
        if causes:
            raise invalid(rt, name, causes)


