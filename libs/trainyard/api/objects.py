"""Parse and dump whole API objects; render validation errors as JSON paths.

``dump_object(parse_object(doc)) == doc`` for every valid document: unknown fields are kept
verbatim, absent fields stay absent, quantities and int-or-string values keep their type.
"""
from __future__ import annotations

from typing import Any, Iterable

import yaml
from pydantic import ValidationError

from trainyard.api.core import ConfigMap, Secret
from trainyard.api.jobset import JobSet
from trainyard.api.meta import GenericObject, KubeModel, KubeObject
from trainyard.api.scheduling import CoschedulingPodGroup, VolcanoPodGroup, VolcanoQueue
from trainyard.api.trainer import ClusterTrainingRuntime, TrainingRuntime, TrainJob

MODELS_BY_TYPE: dict[tuple[str, str], type[KubeObject]] = {
    (cls.API_VERSION, cls.KIND): cls  # type: ignore[misc]
    for cls in (
        TrainJob,
        TrainingRuntime,
        ClusterTrainingRuntime,
        JobSet,
        CoschedulingPodGroup,
        VolcanoPodGroup,
        VolcanoQueue,
        ConfigMap,
        Secret,
    )
}


class FieldError(ValueError):
    """Invalid input: one or more ``path: message`` lines, each naming the offending field."""

    def __init__(self, errors: list[str], source: str | None = None) -> None:
        self.errors = errors
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__("; ".join(prefix + line for line in errors))


def model_for(api_version: str, kind: str) -> type[KubeObject]:
    """The model class of an apiVersion+kind; :class:`GenericObject` for unknown kinds."""
    return MODELS_BY_TYPE.get((api_version, kind), GenericObject)


def json_path(loc: Iterable[str | int]) -> str:
    """``('spec', 'podTemplateOverrides', 0, 'targetJobs')`` -> ``spec.podTemplateOverrides[0].targetJobs``."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += f".{part}" if path else str(part)
    return path or "(document)"


# pydantic messages that name Python classes, reworded in JSON terms.
_MESSAGES_BY_TYPE = {
    "model_type": "Input should be an object",
    "model_attributes_type": "Input should be an object",
    "dict_type": "Input should be an object",
}


def format_validation_error(exc: ValidationError, prefix: str = "") -> list[str]:
    """One ``json.path: message`` line per pydantic error, with wire (camelCase) names."""
    lines = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        loc = error["loc"]
        path = json_path(loc)
        if prefix:
            path = f"{prefix}.{path}" if loc else prefix
        lines.append(f"{path}: {_MESSAGES_BY_TYPE.get(error['type'], error['msg'])}")
    return lines


def parse_object(doc: Any, *, strict: bool = False, source: str | None = None) -> KubeObject:
    """Parse one API object, dispatching on apiVersion and kind.

    With ``strict=True`` fields unknown to the object's schema are rejected too (they are
    otherwise preserved for a lossless round trip); objects of unknown kinds are not checked.
    """
    if not isinstance(doc, dict):
        raise FieldError([f"(document): expected a mapping, got {type(doc).__name__}"], source)
    missing = [key for key in ("apiVersion", "kind") if not isinstance(doc.get(key), str) or not doc[key]]
    if missing:
        raise FieldError([f"{key}: Field required" for key in missing], source)
    model = model_for(doc["apiVersion"], doc["kind"])
    try:
        obj = model.model_validate(doc, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise FieldError(format_validation_error(exc), source) from None
    if strict and model is not GenericObject:
        from trainyard.api.strict import unknown_fields

        unknown = unknown_fields(obj)
        if unknown:
            raise FieldError([f"{path}: Extra inputs are not permitted" for path in unknown], source)
    return obj  # type: ignore[return-value]


def dump_object(model: KubeModel) -> dict[str, Any]:
    """The wire form of a model (camelCase, only fields that were set, extras verbatim)."""
    return model.model_dump(by_alias=True, exclude_unset=True)


class KubernetesYamlLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A safe loader that reads timestamps as strings, as Kubernetes does (YAML -> JSON)."""

    yaml_implicit_resolvers = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }


def load_yaml_documents(text: str, filename: str = "<input>") -> list[dict[str, Any]]:
    """The non-empty documents of a YAML stream; a syntax error names the file and line."""
    try:
        docs = [doc for doc in yaml.load_all(text, Loader=KubernetesYamlLoader) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise FieldError([f"{where}: {problem}"], filename) from None
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise FieldError([f"document {index + 1}: expected a mapping, got {type(doc).__name__}"], filename)
    return docs


def parse_yaml(text: str, filename: str = "<input>", *, strict: bool = False) -> list[KubeObject]:
    """Parse every object of a YAML stream (errors name the file and the document)."""
    objects = []
    for index, doc in enumerate(load_yaml_documents(text, filename)):
        source = filename if index == 0 else f"{filename} (document {index + 1})"
        objects.append(parse_object(doc, strict=strict, source=source))
    return objects
