"""Errors raised by the pure machinery; each message is one line that names the failing place.

The API server maps them to Status responses: `PatchError` -> 422 Invalid (JSON patch) or
400 BadRequest (malformed strategic/merge patch), `UnsupportedPatchType` -> 415,
`SelectorError` -> 400, `ApplyConflict` -> 409 (see `server_side_apply`).
"""
from __future__ import annotations


class MachineryError(ValueError):
    """Base class: bad input to a machinery function (never a bug in the caller's process)."""


class PatchError(MachineryError):
    """A patch that cannot be applied; the message names the field or operation."""


class UnsupportedPatchType(MachineryError):
    """Strategic merge patch asked for a type without strategic metadata (a custom resource)."""


class SelectorError(MachineryError):
    """A label or field selector that does not parse, or names an unsupported field."""


class ProtobufDecodeError(MachineryError):
    """A protobuf request body that is not a valid Kubernetes protobuf object."""
