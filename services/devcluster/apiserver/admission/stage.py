"""Mutating and validating admission, the two admission stages of kube-apiserver's chain.

A write goes: mutating admission (``mutate``: mutating webhooks, with ``reinvocationPolicy``)
-> the kind's strategy (defaulting again after a mutation, prepare-for-create/update,
validation incl. schema and CEL) -> validating admission (``validate``: ValidatingAdmissionPolicy
first, then validating webhooks) -> store. The order is kube-apiserver's: its admission plugin
order puts MutatingAdmissionWebhook before ValidatingAdmissionPolicy before
ValidatingAdmissionWebhook, mutating plugins run before the registry's ``BeforeCreate`` /
``BeforeUpdate`` (strategy) and validating plugins after it (``createValidation`` /
``updateValidation`` in the generic registry's store). So policies and validating webhooks see
the object a mutating webhook changed, and a policy's denial means no validating webhook is
called.

Exempt, as upstream: the admission configuration kinds themselves (webhook configurations,
policies, bindings: no lock-out) and the server's own controllers' writes (garbage collector,
namespace controller), which kube-apiserver's controllers make through their own clients.
"""
from __future__ import annotations

from typing import Any

from .. import errors
from .policies import ValidatingPolicies
from ..registry.kinds import ResourceType
from ..registry.scale_view import scale_views, with_replicas
from .webhooks import Webhooks
from ..registry.options import WriteOptions

ADMISSION_GROUP = "admissionregistration.k8s.io"
# the server's own controllers (garbage collector, namespace controller) are not admitted
INTERNAL_MANAGERS = frozenset({"generic-garbage-collector", "namespace-controller", "devcluster"})


class Admission:
    """Both admission stages over the stored webhook configurations and policies."""

    def __init__(self, webhooks: Webhooks, policies: ValidatingPolicies) -> None:
        self.webhooks = webhooks
        self.policies = policies

    @staticmethod
    def exempt(rt: ResourceType, opts: WriteOptions) -> bool:
        return rt.group == ADMISSION_GROUP or opts.manager in INTERNAL_MANAGERS

    async def mutate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                     old: dict[str, Any] | None, opts: WriteOptions) -> dict[str, Any] | None:
        """Mutating admission; the changed object, or None when nothing changed it."""
        if self.exempt(rt, opts) or not self.webhooks.has_mutating():
            return None
        if opts.subresource == "scale" and rt.scale is not None and obj is not None:
            # webhooks on <resource>/scale see and change the autoscaling/v1 Scale; a change of
            # its spec.replicas goes back to the object at the spec replicas path
            new_scale, old_scale = scale_views(rt, obj, old)
            admitted = await self.webhooks.mutate(operation, rt, new_scale, old_scale, opts)
            if admitted is None:
                return None
            replicas = (admitted.get("spec") or {}).get("replicas") or 0
            if isinstance(replicas, bool) or not isinstance(replicas, int):
                raise errors.internal("a mutating webhook set the Scale's spec.replicas to a non-integer")
            return with_replicas(obj, rt.scale, replicas)
        return await self.webhooks.mutate(operation, rt, obj, old, opts)

    async def validate(self, operation: str, rt: ResourceType, obj: dict[str, Any] | None,
                       old: dict[str, Any] | None, opts: WriteOptions) -> None:
        """Validating admission: policies, then (only if they admit) validating webhooks."""
        if self.exempt(rt, opts):
            return
        self.policies.admit(operation, rt, obj, old, opts)
        if opts.subresource == "scale" and rt.scale is not None and obj is not None:
            obj, old = scale_views(rt, obj, old)
        await self.webhooks.validate(operation, rt, obj, old, opts)
