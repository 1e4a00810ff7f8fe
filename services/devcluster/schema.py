"""Custom-resource processing against the CRD's structural schema, on every write.

Prune unknown fields (reported per ``fieldValidation``), apply schema defaults, then validate:
the work is done by ``trainyard.apimachinery.structural`` and its one CEL evaluator (shared with
``trainyard validate``); this module turns the result into the API server's answers.
"""
from __future__ import annotations

from typing import Any

from trainyard.apimachinery.structural import apply_defaults, normalise_numbers, prune, validate

from . import errors

__all__ = ["SchemaProcessor", "normalise_numbers"]


class SchemaProcessor:
    """Prune, default and validate custom resources; messages and fields as the real server."""

    def process(self, rt: Any, obj: dict[str, Any], old: dict[str, Any] | None, opts: Any,
                pruned: bool = False) -> dict[str, Any]:
        """``pruned``: ``obj`` is known to hold only fields the schema knows (pruning would keep
        it as it is); it is defaulted in place."""
        schema = rt.schema or {}
        if pruned:
            unknown: list[str] = []
        else:
            obj, unknown = prune(obj, schema)
        self._report_unknown(unknown, opts)
        processed = apply_defaults(obj, schema)
        causes = validate(processed, old, schema)
        if getattr(rt, "scale", None):
            from .scale import replicas_causes
            causes = list(causes) + replicas_causes(processed, rt.scale,
                                                    status=getattr(opts, "subresource", None) == "status")
        if causes:
            raise errors.invalid(rt.qualified_kind, (obj.get("metadata") or {}).get("name", ""), rt.group, rt.kind,
                                 list(causes))
        return processed

    def process_config(self, rt: Any, config: dict[str, Any], opts: Any) -> dict[str, Any]:
        """An apply configuration: pruned and checked for unknown fields, but not defaulted."""
        pruned, unknown = prune(config, rt.schema or {})
        self._report_unknown(unknown, opts)
        return pruned

    @staticmethod
    def _report_unknown(unknown: list[str], opts: Any) -> None:
        if not unknown:
            return
        mode = getattr(opts, "field_validation", "Strict") or "Strict"
        if mode == "Strict":
            if len(unknown) == 1:
                raise errors.bad_request(f'strict decoding error: unknown field "{unknown[0]}"')
            raise errors.bad_request("strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown))
        if mode == "Warn":
            opts.warnings.extend(f'unknown field "{u}"' for u in unknown)
