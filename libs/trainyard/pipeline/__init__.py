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

from .errors import ErrorType, FieldError, PlanningError, aggregate_message
from .observed import ObservedState
from .planning import Plan, canonical_json, plan, plan_hash, render_yaml
from .status import compute_trainjob_status
from .validation import ValidationResult, validate_runtime, validate_trainjob

__all__ = [
    "ErrorType", "FieldError", "ObservedState", "Plan", "PlanningError", "ValidationResult",
    "aggregate_message", "canonical_json", "compute_trainjob_status", "plan", "plan_hash",
    "render_yaml", "validate_runtime", "validate_trainjob",
]
