"""The cluster state planning reads: objects indexed by apiVersion, kind, namespace, name.

Upstream's builders GET objects (the JobSet, PodGroups, the MPI Secret, PriorityClasses,
runtimes). Here the caller passes what it has observed; an absent object reads as
NotFound. A caller that could not read some object (e.g. an API error) registers a read
error for it, which reproduces upstream's "GET failed" paths.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from .documents import as_document, object_key

Key = tuple[str, str, str, str]

# Kubernetes plural resource names for NotFound texts (`<plural>.<group> "<name>" not found`).
_RESOURCE_OF_KIND = {
    ("trainer.kubeflow.org", "TrainingRuntime"): "trainingruntimes.trainer.kubeflow.org",
    ("trainer.kubeflow.org", "ClusterTrainingRuntime"): "clustertrainingruntimes.trainer.kubeflow.org",
    ("jobset.x-k8s.io", "JobSet"): "jobsets.jobset.x-k8s.io",
    ("scheduling.x-k8s.io", "PodGroup"): "podgroups.scheduling.x-k8s.io",
    ("scheduling.volcano.sh", "PodGroup"): "podgroups.scheduling.volcano.sh",
    ("scheduling.k8s.io", "PriorityClass"): "priorityclasses.scheduling.k8s.io",
    ("", "Secret"): "secrets",
    ("", "ConfigMap"): "configmaps",
}


class ReadError(Exception):
    """Reading an object failed with something other than NotFound."""


def not_found_text(api_version: str, kind: str, name: str) -> str:
    group = api_version.rpartition("/")[0]
    resource = _RESOURCE_OF_KIND.get((group, kind), f"{kind.lower()}s" + (f".{group}" if group else ""))
    return f'{resource} "{name}" not found'


@dataclass
class ObservedState:
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    read_errors: dict[Key, str] = field(default_factory=dict)

    @classmethod
    def of(cls, objects: Iterable[Any] = (), read_errors: dict[Key, str] | None = None) -> "ObservedState":
        state = cls(read_errors=dict(read_errors or {}))
        for obj in objects:
            state.add(as_document(obj))
        return state

    def add(self, doc: dict[str, Any]) -> None:
        self.objects[object_key(doc)] = doc

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The observed object, None when NotFound; raises ReadError for a failed read."""
        key = (api_version, kind, namespace, name)
        if key in self.read_errors:
            raise ReadError(self.read_errors[key])
        return self.objects.get(key)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.objects.values())
