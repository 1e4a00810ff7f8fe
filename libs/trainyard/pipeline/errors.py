"""Field errors as Kubernetes reports them, and the planning error.

A field error renders exactly like Kubernetes' ``field.Error``:
``<path>: <type>: <value>: <detail>`` where the value part is left out for the types that
never carry one (``Required value``, ``Forbidden``, ``Too long``, ``Internal error``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

_OMITTED = object()


class ErrorType(str, Enum):
    """The error types of Kubernetes' field package, with their rendered names."""

    NOT_FOUND = "Not found"
    REQUIRED = "Required value"
    DUPLICATE = "Duplicate value"
    INVALID = "Invalid value"
    NOT_SUPPORTED = "Unsupported value"
    FORBIDDEN = "Forbidden"
    TOO_LONG = "Too long"
    TOO_MANY = "Too many"
    INTERNAL = "Internal error"
    TYPE_INVALID = "Type mismatch"


_TYPES_WITHOUT_VALUE = {ErrorType.REQUIRED, ErrorType.FORBIDDEN, ErrorType.TOO_LONG, ErrorType.INTERNAL}


def render_value(value: Any) -> str:
    """Render a bad value the way Go's field errors do for scalars.

    Strings are double-quoted, numbers and booleans plain, absent values ``null``.
    Structured values (lists, maps) are rendered as compact JSON: upstream prints Go
    struct dumps there, which the spec declares non-contractual.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), sort_keys=False, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class FieldError:
    """One Kubernetes-style field error: type, JSON field path, bad value and detail."""

    type: ErrorType
    field: str
    value: Any = _OMITTED
    detail: str = ""

    def body(self) -> str:
        if self.type in _TYPES_WITHOUT_VALUE or self.value is _OMITTED:
            text = self.type.value
        else:
            text = f"{self.type.value}: {render_value(self.value)}"
        if self.detail:
            text += f": {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}" if self.field else self.body()

    def to_dict(self) -> dict[str, Any]:
        """The Kubernetes ``StatusCause``-like form (for JSON output)."""
        cause: dict[str, Any] = {"type": _REASON_OF_TYPE[self.type], "field": self.field,
                                 "message": self.body()}
        return cause


# Kubernetes' CauseType names (metav1.CauseType) for each field error type.
_REASON_OF_TYPE = {
    ErrorType.NOT_FOUND: "FieldValueNotFound",
    ErrorType.REQUIRED: "FieldValueRequired",
    ErrorType.DUPLICATE: "FieldValueDuplicate",
    ErrorType.INVALID: "FieldValueInvalid",
    ErrorType.NOT_SUPPORTED: "FieldValueNotSupported",
    ErrorType.FORBIDDEN: "FieldValueForbidden",
    ErrorType.TOO_LONG: "FieldValueTooLong",
    ErrorType.TOO_MANY: "FieldValueTooMany",
    ErrorType.INTERNAL: "InternalError",
    ErrorType.TYPE_INVALID: "FieldValueTypeInvalid",
}


_TYPE_OF_REASON = {reason: error_type for error_type, reason in _REASON_OF_TYPE.items()}


def from_cause(field: str, reason: str, message: str) -> FieldError:
    """The field error of an API server cause (``reason`` and its rendered ``message``), so that
    ``str()`` gives back ``<field>: <message>`` byte for byte."""
    error_type = _TYPE_OF_REASON.get(reason, ErrorType.INVALID)
    if not message.startswith(error_type.value):
        # A type error is rendered as "Invalid value: ..." by the API server.
        error_type = next((t for t in ErrorType if message.startswith(t.value)), ErrorType.INVALID)
    detail = message[len(error_type.value):].removeprefix(": ") if message.startswith(error_type.value) else message
    return FieldError(error_type, field, detail=detail)


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError(ErrorType.INVALID, field, value, detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError(ErrorType.FORBIDDEN, field, detail=detail)


def required(field: str, detail: str = "") -> FieldError:
    return FieldError(ErrorType.REQUIRED, field, detail=detail)


def internal(field: str, detail: str) -> FieldError:
    return FieldError(ErrorType.INTERNAL, field, detail=detail)


def aggregate_message(texts: list[str]) -> str:
    """Join error texts like Kubernetes' ``utilerrors.NewAggregate``.

    Exact duplicates are dropped; one text is returned as is; several become
    ``[a, b]`` in the order they were produced.
    """
    distinct: list[str] = []
    for text in texts:
        if text not in distinct:
            distinct.append(text)
    if len(distinct) == 1:
        return distinct[0]
    return "[" + ", ".join(distinct) + "]"


class PlanningError(Exception):
    """Planning could not produce objects (the controller's reconcile error).

    ``reason`` is set when upstream turns the error into a TrainJob condition
    (``TrainingRuntimeNotSupported``); otherwise the error only becomes an event.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
