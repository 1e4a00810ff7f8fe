"""The server's bridge to ``trainyard.apimachinery``: patches, selectors, managedFields, protobuf.

The pure algorithms live in the library; this module maps their errors onto ``Status`` answers
and picks the schema (built-in definition or CRD structural schema) for a resource type.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable

import yaml

from trainyard.apimachinery import (json_patch, merge_patch, openapi_definitions, protobuf, selectors,
                                    strategic_merge, yaml_json)
from trainyard.apimachinery import server_side_apply as ssa
from trainyard.apimachinery.errors import PatchError, SelectorError, UnsupportedPatchType
from trainyard.apimachinery.structural import normalise_numbers

from .. import errors
from .options import WriteOptions
from .builtin_fields import prune_unknown, validate_definition
from .clock import now_rfc3339
from ..errors import ApiError
from .fieldvalidation import report_unknown
from .kinds import ResourceType
from ...storage.store import StoredObject

CR_PATCH_TYPES = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
BUILTIN_PATCH_TYPES = CR_PATCH_TYPES + ["application/strategic-merge-patch+json"]


def _machinery_error(err: Exception) -> ApiError:
    if isinstance(err, UnsupportedPatchType):
        return errors.unsupported_media_type(CR_PATCH_TYPES)
    if isinstance(err, SelectorError):
        return errors.bad_request(str(err))
    if isinstance(err, PatchError):
        return errors.bad_request(str(err))
    return errors.bad_request(str(err))


# ---------------------------------------------------------------- selectors

def label_matcher(selector: str) -> Callable[[dict[str, str]], bool]:
    if not selector or not selector.strip():
        return lambda labels: True
    try:
        parsed = selectors.parse_label_selector(selector)
    except ValueError as err:
        raise _machinery_error(err) from err
    return parsed.matches


def field_matcher(rt: ResourceType, selector: str) -> Callable[[str, str, StoredObject], bool] | None:
    if not selector or not selector.strip():
        return None
    group, resource = rt.storage_key
    try:
        parsed = selectors.parse_field_selector(selector, selectors.supported_fields_for(group, resource))
    except ValueError as err:
        raise _machinery_error(err) from err
    if parsed.empty:
        return None
    metadata_only = all(r.field in ("metadata.name", "metadata.namespace") for r in parsed.requirements)

    def matches(namespace: str, name: str, stored: StoredObject) -> bool:
        if metadata_only:
            return parsed.matches({"metadata": {"name": name, "namespace": namespace}})
        return parsed.matches(stored.load())
    return matches


# ---------------------------------------------------------------- patches

def _number(text: str) -> int | float:
    """JSON numbers as the API server decodes them: whole numbers (``2.0``) become integers."""
    value = float(text)
    if math.isinf(value):  # Go refuses it too; stored, it would be answered as invalid JSON
        raise ValueError(f"cannot unmarshal number {text[:40]} into a float64: out of range")
    return int(value) if value.is_integer() and abs(value) < 2**63 else value


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value ({name} is not JSON)")


_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_unicode(value: Any) -> Any:
    """Lone surrogates (``"\\ud800"`` in a JSON or YAML body) become U+FFFD, as Go's decoders
    do: such a string cannot be encoded as UTF-8, so it could be neither stored nor answered."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {valid_unicode(k): valid_unicode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [valid_unicode(v) for v in value]
    return value


def loads(body: bytes | str) -> Any:
    value = json.loads(body, parse_float=_number, parse_constant=_no_constant)
    if (b"\\u" if isinstance(body, bytes) else "\\u") in body:  # only an escape makes a lone surrogate
        value = valid_unicode(value)
    return value


def _decode_json(body: bytes, what: str) -> Any:
    try:
        return loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise errors.bad_request(f"error decoding {what}: {err}") from err


def apply_patch(rt: ResourceType, patch_type: str, old: dict[str, Any], body: bytes) -> dict[str, Any]:
    if patch_type == "merge":
        patch = _decode_json(body, "merge patch")
        if not isinstance(patch, dict):
            raise errors.bad_request("a merge patch must be a JSON object")
        return merge_patch.json_merge_patch(old, patch)
    if patch_type == "json":
        ops = _decode_json(body, "json patch")
        if not isinstance(ops, list):
            raise errors.bad_request("json: cannot unmarshal object into Go value of type []handlers.jsonPatchOp"
                                     if isinstance(ops, dict) else "a JSON patch must be a JSON array of operations")
        try:
            return json_patch.apply_json_patch(old, ops)
        except json_patch.JsonPatchError as err:
            raise errors.ApiError(422, "Invalid", str(err)) from err
    if patch_type == "strategic":
        if not rt.builtin or not rt.definition:
            raise errors.unsupported_media_type(CR_PATCH_TYPES)
        patch = _decode_json(body, "strategic merge patch")
        if not isinstance(patch, dict):
            raise errors.bad_request("a strategic merge patch must be a JSON object")
        try:
            return strategic_merge.strategic_merge_patch(old, patch, rt.definition)
        except ValueError as err:
            raise _machinery_error(err) from err
    raise errors.unsupported_media_type(BUILTIN_PATCH_TYPES if rt.builtin else CR_PATCH_TYPES)


def parse_apply_body(body: bytes) -> dict[str, Any]:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise errors.bad_request(f"error decoding apply configuration: {err}") from err
    try:
        config = loads(text)
    except ValueError:
        config = load_yaml(text)
    if not isinstance(config, dict):
        raise errors.bad_request("an apply configuration must be an object")
    return config


def load_yaml(text: str) -> Any:
    """One YAML document as JSON values (``trainyard.apimachinery.yaml_json``: timestamps stay
    strings, alias bombs and tags without a JSON value are refused); a clear 400 otherwise."""
    try:
        value = yaml_json.load(text)
    except yaml.YAMLError as err:
        raise errors.bad_request(f"error decoding YAML: {str(err).splitlines()[0]}") from err
    except yaml_json.YamlJsonError as err:
        raise errors.bad_request(f"error decoding YAML: {err}") from err
    value = normalise_numbers(value)
    return valid_unicode(_json_form(value))


def _yaml_key(key: Any) -> str:
    if isinstance(key, bool):
        return "true" if key else "false"
    return "null" if key is None else str(key)


def _json_form(value: Any) -> Any:
    """The YAML value as JSON holds it: keys are strings (``1:``, ``true:``, ``null:`` as
    sigs.k8s.io/yaml writes them); ``.inf`` and ``.nan`` have no JSON form and are refused."""
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        raise errors.bad_request(f"error decoding YAML: unsupported value: {value} has no JSON form")
    if isinstance(value, dict):
        return {k if isinstance(k, str) else _yaml_key(k): _json_form(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_form(item) for item in value]
    return value


# ---------------------------------------------------------------- managedFields and apply

_SCHEMA_NODES: dict[int, tuple[Any, Any]] = {}  # id(CRD schema) -> (schema kept alive, SchemaNode)
_UNTYPED_CR = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def _schema_for(rt: ResourceType) -> Any:
    if rt.builtin and rt.definition and openapi_definitions.has_definition(rt.definition):
        return openapi_definitions.builtin_schema(rt.definition)
    schema = rt.schema or _UNTYPED_CR
    cached = _SCHEMA_NODES.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_SCHEMA_NODES) > 256:
            _SCHEMA_NODES.clear()
        cached = (schema, openapi_definitions.structural_schema(schema))
        _SCHEMA_NODES[id(schema)] = cached
    return cached[1]


def record_update(rt: ResourceType, old: dict[str, Any] | None, new: dict[str, Any], opts: WriteOptions) -> dict[str, Any]:
    """``new`` with managedFields updated for a non-apply write by ``opts.manager``."""
    try:
        return ssa.record_update(old, new, manager=opts.manager or "unknown", schema=_schema_for(rt),
                                 now=now_rfc3339(), subresource=opts.subresource or "")
    except ValueError as err:
        raise _machinery_error(err) from err


def server_side_apply(rt: ResourceType, live: dict[str, Any] | None, config: dict[str, Any], opts: WriteOptions) -> Any:
    """Run Server-Side Apply; returns the library's ``ApplyResult`` (409 Status on conflicts)."""
    try:
        return ssa.apply(live, config, manager=opts.manager, schema=_schema_for(rt), now=now_rfc3339(),
                         force=opts.force, subresource=opts.subresource or "", status_is_subresource=rt.has_status)
    except ssa.ApplyConflict as err:
        raise errors.ApiError(409, "Conflict", str(err), {"causes": err.causes()}) from err
    except ValueError as err:
        raise _machinery_error(err) from err


def check_builtin_fields(rt: ResourceType, obj: dict[str, Any], opts: WriteOptions) -> dict[str, Any]:
    """Drop fields a built-in kind does not declare, reporting them per ``fieldValidation``."""
    if not rt.definition or not openapi_definitions.has_definition(rt.definition):
        return obj
    unknown: list[str] = []
    pruned = prune_unknown(obj, openapi_definitions.definition(rt.definition), openapi_definitions.load_definitions(), "", unknown)
    report_unknown(unknown, opts)
    return pruned


def validate_builtin(rt: ResourceType, obj: dict[str, Any]) -> list[dict[str, str]]:
    """Why ``obj`` is invalid for a stored-only built-in kind (types, required fields, enums from
    its Kubernetes definition; the kind's cross-field checks are its strategy's
    ``validate_fields``); empty when valid."""
    causes: list[dict[str, str]] = []
    body = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    validate_definition(body, openapi_definitions.definition(rt.definition), openapi_definitions.load_definitions(), "", causes)
    return causes


# ---------------------------------------------------------------- protobuf

def decode_protobuf(body: bytes) -> dict[str, Any]:
    try:
        return protobuf.decode_kubernetes_protobuf(body)
    except ValueError as err:
        raise errors.bad_request(f"error decoding protobuf body: {err}") from err
