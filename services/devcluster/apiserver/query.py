"""Query parameters as kube-apiserver reads them."""
from __future__ import annotations

from . import errors

_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def parse_bool(value: str | None, name: str) -> bool:
    if value is None or value == "":
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise errors.bad_request(f'invalid boolean value {value!r} for query parameter "{name}"')
