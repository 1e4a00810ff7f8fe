"""Kubernetes resource quantities ("500m", "2", "1Gi", "1e3") as exact decimals.

Written here because the data plane needs only parsing and rounding, and trainyard's
apimachinery package has no quantity module yet.
"""
from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a quantity: ``parse_quantity("500m") == Decimal("0.5")``."""
    if isinstance(value, bool):
        raise QuantityError(f"quantities must be numbers or strings, not {value!r}")
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _QUANTITY.match(str(value).strip())
    if not match:
        raise QuantityError(f"quantities must match the regular expression "
                            f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as err:
        raise QuantityError(f"invalid quantity {value!r}") from err
    return number * _SUFFIXES[match.group(2) or ""]


def millicores(value: str | int | float) -> int:
    """A CPU quantity in whole millicores, rounded up as the scheduler does."""
    return math.ceil(parse_quantity(value) * 1000)


def whole_units(value: str | int | float) -> int:
    """A byte or device count quantity rounded up to a whole number."""
    return math.ceil(parse_quantity(value))
