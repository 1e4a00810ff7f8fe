"""Server-side defaulting, as the API server applies upstream's CRD ``default:`` values.

Only fields that are absent (or ``null``) get a default, and only inside objects that are
present: an absent ``mlPolicy.mpi`` stays absent. The defaults are the ``server_default``
values declared on the model fields (the same values the generated CRDs carry), which are
exactly upstream's CRD defaults (spec §1.3 and the embedded JobSet defaults of §1.2.6).
Built-in Kubernetes types are never defaulted here.
"""
from __future__ import annotations

import copy
from typing import Any, TypeVar

from trainyard.api.meta import SERVER_DEFAULT, KubeModel

M = TypeVar("M", bound=KubeModel)


def apply_defaults(model: M) -> M:
    """A defaulted deep copy of ``model``; the input is left untouched."""
    defaulted = model.model_copy(deep=True)
    _default_in_place(defaulted)
    return defaulted


def server_defaults(model_class: type[KubeModel]) -> dict[str, Any]:
    """``{attribute name: default}`` of the fields of one model class that have one."""
    found = {}
    for name, info in model_class.model_fields.items():
        extra = info.json_schema_extra
        if isinstance(extra, dict) and SERVER_DEFAULT in extra:
            found[name] = extra[SERVER_DEFAULT]
    return found


def _default_in_place(value: Any) -> None:
    if isinstance(value, KubeModel):
        for name, default in server_defaults(type(value)).items():
            if getattr(value, name) is None:
                setattr(value, name, copy.deepcopy(default))
        for name in type(value).model_fields:
            _default_in_place(getattr(value, name))
    elif isinstance(value, list):
        for item in value:
            _default_in_place(item)
