"""Runtime resolution (spec §2): registry key, lookup, not-found texts, deprecation."""
from __future__ import annotations

from trainyard.api import constants as c

from dataclasses import dataclass
from typing import Any

from .documents import dig, mapping
from .errors import FieldError, PlanningError, invalid
from .observed import ObservedState, ReadError, not_found_text

SUPPORTED_KEYS = {
    f"{c.TRAINING_RUNTIME_KIND}.{c.TRAINER_API_GROUP}": c.TRAINING_RUNTIME_KIND,
    f"{c.CLUSTER_TRAINING_RUNTIME_KIND}.{c.TRAINER_API_GROUP}": c.CLUSTER_TRAINING_RUNTIME_KIND,
}


@dataclass(frozen=True)
class ResolvedRuntime:
    kind: str  # TrainingRuntime or ClusterTrainingRuntime
    document: dict[str, Any]  # defaulted runtime document

    @property
    def name(self) -> str:
        return str(dig(self.document, "metadata", "name") or "")

    @property
    def spec(self) -> dict[str, Any]:
        return mapping(self.document.get("spec"))


def registry_key(trainjob: dict[str, Any]) -> str:
    """``<kind>.<apiGroup>``, or just ``<kind>`` when apiGroup is empty (GroupKind form)."""
    ref = mapping(dig(trainjob, "spec", "runtimeRef"))
    kind = ref.get("kind") or ""
    group = ref.get("apiGroup") or ""
    return f"{kind}.{group}" if group else str(kind)


def unsupported_runtime_message(trainjob: dict[str, Any]) -> str | None:
    key = registry_key(trainjob)
    return None if key in SUPPORTED_KEYS else f"unsupported runtime: {key}"


class RuntimeLookupError(Exception):
    """The referenced runtime could not be read; carries the API error text."""

    def __init__(self, kind: str, api_error: str) -> None:
        super().__init__(api_error)
        self.kind = kind
        self.api_error = api_error

    def planning_error(self) -> PlanningError:
        if self.kind == c.TRAINING_RUNTIME_KIND:
            return PlanningError(f"{c.ERR_TRAINING_RUNTIME_NOT_FOUND}{self.api_error}")
        return PlanningError(f"{c.ERR_CLUSTER_TRAINING_RUNTIME_NOT_FOUND}{self.api_error}")

    def field_error(self, runtime_ref: Any) -> FieldError:
        if self.kind == c.TRAINING_RUNTIME_KIND:
            return invalid("spec.runtimeRef", runtime_ref, f"{self.api_error}: {c.ERR_TRAINING_RUNTIME_MUST_EXIST}")
        # Upstream quirk kept verbatim: capital R in the field path.
        return invalid("spec.RuntimeRef", runtime_ref, f"{self.api_error}: {c.ERR_CLUSTER_TRAINING_RUNTIME_MUST_EXIST}")


def lookup_runtime(trainjob: dict[str, Any], observed: ObservedState) -> dict[str, Any]:
    """The runtime document the TrainJob references (supported key assumed).

    TrainingRuntime: in the TrainJob's namespace; ClusterTrainingRuntime: cluster scope.
    """
    kind = SUPPORTED_KEYS[registry_key(trainjob)]
    name = str(dig(trainjob, "spec", "runtimeRef", "name") or "")
    namespace = str(dig(trainjob, "metadata", "namespace") or "") if kind == c.TRAINING_RUNTIME_KIND else ""
    try:
        runtime = observed.get(c.TRAINER_API_VERSION, kind, namespace, name)
    except ReadError as err:
        raise RuntimeLookupError(kind, str(err)) from None
    if runtime is None:
        raise RuntimeLookupError(kind, not_found_text(c.TRAINER_API_VERSION, kind, name))
    return runtime


def is_deprecated(runtime: dict[str, Any]) -> bool:
    return mapping(dig(runtime, "metadata", "labels")).get(c.LABEL_SUPPORT) == c.SUPPORT_DEPRECATED


def referenced_deprecation_warning(runtime_name: str) -> str:
    return c.deprecated_runtime_warning(runtime_name, referenced=True)


def created_deprecation_warning(runtime_name: str) -> str:
    return c.deprecated_runtime_warning(runtime_name, referenced=False)


# --- The resource-in-use finalizer (spec §2.4), as pure decisions --------------------------

def referenced_runtime(trainjob: dict[str, Any]) -> tuple[str, str, str] | None:
    """(kind, namespace, name) of the runtime a TrainJob holds in use, by upstream's index.

    Only an explicit ``apiGroup: trainer.kubeflow.org`` and an explicit supported kind count
    (absent values never match); the namespace is "" for a ClusterTrainingRuntime.
    """
    ref = mapping(dig(trainjob, "spec", "runtimeRef"))
    kind, name = ref.get("kind"), ref.get("name")
    if ref.get("apiGroup") != c.TRAINER_API_GROUP or not isinstance(name, str) or not name:
        return None
    if kind == c.TRAINING_RUNTIME_KIND:
        return kind, str(dig(trainjob, "metadata", "namespace") or ""), name
    if kind == c.CLUSTER_TRAINING_RUNTIME_KIND:
        return kind, "", name
    return None


def finalizer_action(runtime: dict[str, Any], referenced: bool) -> str | None:
    """What the runtime controller does: "add", "remove" or None (nothing).

    Add the finalizer when a TrainJob references the runtime and it is missing (never to a
    runtime being deleted: the API server takes no new finalizer then); remove it only when the
    runtime is being deleted and nothing references it. A live runtime keeps its finalizer even
    when the last TrainJob is gone.
    """
    finalizers = dig(runtime, "metadata", "finalizers")
    has_finalizer = isinstance(finalizers, list) and c.FINALIZER_RESOURCE_IN_USE in finalizers
    deleting = bool(dig(runtime, "metadata", "deletionTimestamp"))
    if not has_finalizer and referenced and not deleting:
        return "add"
    if has_finalizer and deleting and not referenced:
        return "remove"
    return None
