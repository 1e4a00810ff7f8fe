"""Custom-resource processing against the CRD's structural schema, on every write.

Prune unknown fields (reported per ``fieldValidation``), apply schema defaults, then validate:
the work is done by ``trainyard.apimachinery.structural`` and its one CEL evaluator (shared with
``trainyard validate``); this module turns the result into the API server's answers.
"""
from __future__ import annotations

from typing import Any

from trainyard.apimachinery.structural import apply_defaults, normalise_numbers, prune, validate

from .. import errors
from . import fieldvalidation
from .options import WriteOptions
from .kinds import ResourceType
from .scale_view import replicas_causes

__all__ = ["SchemaProcessor", "normalise_numbers"]


class SchemaProcessor:
    """Prune, default and validate custom resources; messages and fields as the real server."""

    def process(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, opts: WriteOptions,
                pruned: bool = False) -> dict[str, Any]:
        """Decode then validate (``decode`` and ``validate``, for callers outside the chain)."""
        processed = self.decode(rt, obj, opts, pruned=pruned)
        self.validate(rt, processed, old, opts)
        return processed

    def decode(self, rt: ResourceType, obj: dict[str, Any], opts: WriteOptions, pruned: bool = False,
               report_unknown: bool = True) -> dict[str, Any]:
        """What kube-apiserver's decoder does to a custom resource before admission: prune the
        fields the schema does not know (reported per ``fieldValidation`` when
        ``report_unknown``; after a mutating webhook they are dropped silently, as its
        schema coercion does), then apply schema defaults. ``pruned``: ``obj`` is known to hold
        only fields the schema knows; it is defaulted in place."""
        schema = rt.schema or {}
        if pruned:
            unknown: list[str] = []
        else:
            obj, unknown = prune(obj, schema)
        if report_unknown:
            fieldvalidation.report_unknown(unknown, opts)
        return apply_defaults(obj, schema)

    def validate(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                 opts: WriteOptions) -> None:
        """The custom resource strategy's validation: schema, CEL rules (with ``old`` for
        transition rules) and the scale subresource's replicas paths; 422 with every cause."""
        schema = rt.schema or {}
        causes = list(validate(obj, old, schema))
        if rt.scale:
            causes += replicas_causes(obj, rt.scale, status=opts.subresource == "status")
        if causes:
            raise errors.invalid(rt.qualified_kind, (obj.get("metadata") or {}).get("name", ""), rt.group, rt.kind,
                                 causes)

    def process_config(self, rt: ResourceType, config: dict[str, Any], opts: WriteOptions) -> dict[str, Any]:
        """An apply configuration: pruned and checked for unknown fields, but not defaulted."""
        pruned, unknown = prune(config, rt.schema or {})
        fieldvalidation.report_unknown(unknown, opts)
        return pruned
