"""The runtime snapshot (Kubeflow Trainer v2.3.0, KEP-2599): a TrainJob plans from the runtime
as it was when the TrainJob was first planned, kept in ConfigMap ``<trainjob>-runtime-snapshot``
(key ``runtime``, the runtime as YAML, controlled by the TrainJob), so editing or deleting the
runtime leaves existing TrainJobs alone.

Pure: the snapshot is read from the observed objects and written as part of the plan (the
applier applies it like any other owned object). The error texts are upstream's
(``pkg/runtime/core/snapshot.go`` and the two runtimes' ``NewObjects`` at v2.3.0).
"""
from __future__ import annotations

from trainyard.api import constants as c

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from .documents import dig, items, mapping
from .errors import PlanningError
from .observed import ObservedState, ReadError

SNAPSHOT_SUFFIX = "-runtime-snapshot"
SNAPSHOT_KEY = "runtime"
_ANY = "<any>"
# Left out of the stored runtime: bookkeeping of the API server that says nothing about the
# runtime and would make the plan of a TrainJob whose snapshot is not written yet change with it.
_DROPPED_METADATA = ("managedFields", "resourceVersion", "finalizers", "deletionTimestamp",
                     "deletionGracePeriodSeconds")


# libyaml when present: the snapshot is read on every plan of a TrainJob (1.1 ms per plan in pure
# Python for a torch runtime, most of a plan's cost).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@lru_cache(maxsize=1024)
def parsed_snapshot(text: str) -> Any:
    """The stored runtime, parsed once per distinct text (many TrainJobs share a runtime, and one
    TrainJob is planned many times). Planning never modifies its inputs, so the result is shared."""
    return yaml.load(text, Loader=_LOADER)


def snapshot_name(trainjob_name: str) -> str:
    return trainjob_name + SNAPSHOT_SUFFIX


@dataclass(frozen=True)
class RuntimeSnapshot:
    document: dict[str, Any]  # the runtime as stored
    text: str  # the stored YAML, written back unchanged


def _error_prefix(runtime_kind: str) -> str:
    # Upstream's two runtimes wrap the same errors differently.
    if runtime_kind == c.TRAINING_RUNTIME_KIND:
        return "unable to get runtime snapshot: "
    return "getting runtime snapshot: "


def read_snapshot(trainjob: dict[str, Any], observed: ObservedState) -> RuntimeSnapshot | None:
    """The TrainJob's snapshot, None when there is none; PlanningError with upstream's text when
    the ConfigMap is there but is no snapshot of this TrainJob's runtime."""
    meta = mapping(trainjob.get("metadata"))
    ref = mapping(dig(trainjob, "spec", "runtimeRef"))
    prefix = _error_prefix(str(ref.get("kind") or ""))
    try:
        config_map = observed.get("v1", "ConfigMap", str(meta.get("namespace") or ""),
                                  snapshot_name(str(meta.get("name") or "")))
    except ReadError as err:
        raise PlanningError(f"{prefix}{err}") from None
    if config_map is None:
        return None
    controller = next((r for r in items(dig(config_map, "metadata", "ownerReferences"))
                       if isinstance(r, dict) and r.get("controller") is True), None)
    if controller is None or controller.get("uid") != meta.get("uid"):
        raise PlanningError(f"{prefix}invalid runtime snapshot: a snapshot configmap exists but is owned by "
                            "another object")
    text = mapping(config_map.get("data")).get(SNAPSHOT_KEY)
    if not isinstance(text, str):
        raise PlanningError(f'{prefix}invalid runtime snapshot: snapshot ConfigMap missing "{SNAPSHOT_KEY}" data key')
    try:
        document = parsed_snapshot(text)
    except yaml.YAMLError as err:
        raise PlanningError(f"{prefix}invalid runtime snapshot: unable to unmarshal the snapshot: "
                            f"{' '.join(str(err).split())}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise PlanningError(f"{prefix}invalid runtime snapshot: unable to unmarshal the snapshot: "
                            f"expected a runtime object, got {type(document).__name__}")
    _check_reference(trainjob, document, prefix)
    return RuntimeSnapshot(document, text)


def _check_reference(trainjob: dict[str, Any], document: dict[str, Any], prefix: str) -> None:
    ref = mapping(dig(trainjob, "spec", "runtimeRef"))
    api_version = str(document.get("apiVersion") or "")
    group = api_version.rpartition("/")[0]
    kind = str(document.get("kind") or "")
    name = str(dig(document, "metadata", "name") or "")
    want_kind, want_group = ref.get("kind"), ref.get("apiGroup")
    if (want_kind is not None and kind != want_kind) or (want_group is not None and group != want_group) \
            or name != ref.get("name"):
        raise PlanningError(
            f"{prefix}invalid runtime snapshot: the snapshot refers to the wrong runtime: expecting a runtime "
            f'with name, api group and kind of "{ref.get("name") or ""}", "{_ANY if want_group is None else want_group}", '
            f'"{_ANY if want_kind is None else want_kind}" but found runtime with name, api group and kind of '
            f'"{name}", "{group}", "{kind}"')


def snapshot_text(runtime: dict[str, Any], kind: str) -> str:
    """The runtime as the snapshot stores it: YAML with sorted keys (as Go's YAML marshalling),
    its apiVersion and kind always present (they are checked when the snapshot is read)."""
    meta = mapping(runtime.get("metadata"))
    uid, version = meta.get("uid"), meta.get("resourceVersion")
    if isinstance(uid, str) and isinstance(version, str) and uid and version:
        # A stored object's uid and resourceVersion name its content: every TrainJob created
        # from one runtime version shares the text (serialising is most of a first plan's cost).
        key = (kind, uid, version)
        text = _TEXTS.get(key)
        if text is None:
            text = _TEXTS[key] = _serialise(runtime, kind)
            while len(_TEXTS) > 256:
                _TEXTS.pop(next(iter(_TEXTS)))
        return text
    return _serialise(runtime, kind)


_TEXTS: dict[tuple[str, str, str], str] = {}


def _serialise(runtime: dict[str, Any], kind: str) -> str:
    document = {key: value for key, value in runtime.items() if key != "status"}
    document.setdefault("apiVersion", c.TRAINER_API_VERSION)
    document.setdefault("kind", kind)
    metadata = {k: v for k, v in mapping(document.get("metadata")).items() if k not in _DROPPED_METADATA}
    document["metadata"] = metadata
    return yaml.dump(document, Dumper=_DUMPER, sort_keys=True, default_flow_style=False, allow_unicode=True)


def snapshot_config_map(trainjob: dict[str, Any], text: str, owner_reference: dict[str, Any]) -> dict[str, Any]:
    meta = mapping(trainjob.get("metadata"))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": snapshot_name(str(meta.get("name") or "")), "namespace": str(meta.get("namespace") or ""),
                     "ownerReferences": [owner_reference]},
        "data": {SNAPSHOT_KEY: text},
    }
