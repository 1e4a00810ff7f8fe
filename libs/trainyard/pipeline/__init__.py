"""The plugin pipeline as pure functions (no I/O): what upstream's controller and webhooks compute.

Public API (see docs/pipeline.md):

- ``plan(trainjob, runtime=None, observed=()) -> Plan`` — desired objects in apply order, plan hash;
  raises ``PlanningError`` with upstream's error text.
- ``validate_trainjob(new, old=None, runtime=None, observed=()) -> ValidationResult``
- ``validate_runtime(new, old=None) -> ValidationResult``
- ``compute_trainjob_status(trainjob, jobset, now) -> dict``
- ``FieldError`` / ``ErrorType`` / ``aggregate_message`` — Kubernetes-style field errors.
- ``ObservedState`` — the cluster objects planning reads.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

# Where each public name lives. They load on first use (PEP 562): a process that only needs a
# small part of the pipeline (the bus envelopes need ``trainjobs``) does not import planning,
# validation and every API model at start.
_PUBLIC = {
    "ErrorType": "errors", "FieldError": "errors", "PlanningError": "errors", "aggregate_message": "errors",
    "ObservedState": "observed",
    "Plan": "planning", "canonical_json": "planning", "plan": "planning", "plan_hash": "planning",
    "render_yaml": "planning",
    "compute_trainjob_status": "status",
    "ValidationResult": "validation", "validate_runtime": "validation", "validate_trainjob": "validation",
}

__all__ = sorted(_PUBLIC)

if TYPE_CHECKING:
    from .errors import ErrorType, FieldError, PlanningError, aggregate_message
    from .observed import ObservedState
    from .planning import Plan, canonical_json, plan, plan_hash, render_yaml
    from .status import compute_trainjob_status
    from .validation import ValidationResult, validate_runtime, validate_trainjob


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
