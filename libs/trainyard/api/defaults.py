"""Server-side defaulting, as the API server applies upstream's CRD ``default:`` values.

Only fields that are absent (or ``null``) get a default, and only inside objects that are
present: an absent ``mlPolicy.mpi`` stays absent. The defaults are the ``server_default``
values declared on the model fields (the same values the generated CRDs carry), which are
upstream's CRD defaults for trainer, JobSet and PodGroup types (spec §1.3, and the embedded
JobSet defaults of §1.2.6 such as ``failurePolicy.restartStrategy: Recreate``). Built-in
Kubernetes types (pod templates, containers...) are never defaulted here.
"""
from __future__ import annotations

import copy
import functools
import types
import typing
from typing import Any, TypeVar, Union

from trainyard.api.meta import SERVER_DEFAULT, KubeModel

M = TypeVar("M", bound=KubeModel)


def apply_defaults(model: M) -> M:
    """A defaulted copy of ``model``; the input is left untouched."""
    data = model.model_dump(by_alias=True, exclude_unset=True)
    _default_dict(type(model), data)
    return type(model).model_validate(data, by_alias=True, by_name=False)


def server_defaults(model_class: type[KubeModel]) -> dict[str, Any]:
    """``{wire name: default}`` of the fields of one model class that have one."""
    return dict(_defaulting_plan(model_class)[0])


@functools.cache
def _defaulting_plan(
    model_class: type[KubeModel],
) -> tuple[tuple[tuple[str, Any], ...], tuple[tuple[str, type[KubeModel], bool], ...]]:
    """(wire names with a default, child models to descend into as (name, class, is_list))."""
    defaults = []
    children = []
    for name, info in model_class.model_fields.items():
        key = info.alias or name
        extra = info.json_schema_extra
        if isinstance(extra, dict) and SERVER_DEFAULT in extra:
            defaults.append((key, extra[SERVER_DEFAULT]))
        child = _child_model(info.annotation)
        if child is not None and child[0].k8s_definition is None:
            children.append((key, *child))
    return tuple(defaults), tuple(children)


def _child_model(annotation: Any) -> tuple[type[KubeModel], bool] | None:
    if typing.get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(members) != 1:
            return None
        annotation = members[0]
    is_list = typing.get_origin(annotation) is list
    if is_list:
        (annotation,) = typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, KubeModel):
        return annotation, is_list
    return None


def _default_dict(model_class: type[KubeModel], data: Any) -> None:
    if not isinstance(data, dict):
        return
    defaults, children = _defaulting_plan(model_class)
    for key, default in defaults:
        if data.get(key) is None:
            data[key] = copy.deepcopy(default)
    for key, child_class, is_list in children:
        value = data.get(key)
        if is_list and isinstance(value, list):
            for item in value:
                _default_dict(child_class, item)
        elif not is_list:
            _default_dict(child_class, value)
