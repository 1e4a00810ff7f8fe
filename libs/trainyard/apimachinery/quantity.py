"""Kubernetes resource quantities: exact parsing, arithmetic and canonical rendering.

Values are kept as exact fractions so that sums like 250m + 2 x 500m stay exact. Rendering
follows Kubernetes' canonical form: binary-SI quantities (``Ki``, ``Mi``, ...) render with
the largest binary suffix that keeps an integer, decimal ones with an exponent that is a
multiple of three (``1250m``, ``102``, ``2k``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")

BINARY_SI = "BinarySI"
DECIMAL_SI = "DecimalSI"
DECIMAL_EXPONENT = "DecimalExponent"


class QuantityError(ValueError):
    """A text that is not a Kubernetes quantity."""


@dataclass(frozen=True)
class Quantity:
    value: Fraction
    format: str = DECIMAL_SI

    def __add__(self, other: "Quantity") -> "Quantity":
        # Like Go's Quantity.Add: a zero receiver takes the other side's format.
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value + other.value, fmt)

    def times(self, factor: int) -> "Quantity":
        return Quantity(self.value * factor, self.format)

    def ceil(self) -> int:
        return -((-self.value.numerator) // self.value.denominator)

    def __str__(self) -> str:
        return render_quantity(self)


def parse_quantity(raw: Any) -> Quantity:
    """Parse a quantity written as a YAML int/float or a Kubernetes quantity string."""
    if isinstance(raw, bool):
        raise QuantityError(f"quantities must match the regular expression; got {raw!r}")
    if isinstance(raw, int):
        return Quantity(Fraction(raw), DECIMAL_SI)
    if isinstance(raw, float):
        return Quantity(Fraction(str(raw)), DECIMAL_SI)
    if not isinstance(raw, str):
        raise QuantityError(f"quantities must be a string or a number; got {raw!r}")
    match = _QUANTITY.match(raw.strip())
    if not match:
        raise QuantityError(f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'; got {raw!r}")
    number, suffix = match.group(1), match.group(2) or ""
    base = Fraction(number)
    if suffix in _BINARY_SUFFIXES:
        return Quantity(base * _BINARY_SUFFIXES[suffix], BINARY_SI)
    if suffix in _DECIMAL_SUFFIXES:
        return Quantity(base * Fraction(10) ** _DECIMAL_SUFFIXES[suffix], DECIMAL_SI)
    return Quantity(base * Fraction(10) ** int(suffix[1:]), DECIMAL_EXPONENT)


def render_quantity(quantity: Quantity) -> str:
    value = quantity.value
    if value == 0:
        return "0"
    if quantity.format == BINARY_SI and value.denominator == 1 and abs(value) >= 1024:
        number = value.numerator
        suffix = ""
        for name, size in _BINARY_SUFFIXES.items():
            if number % size == 0:
                suffix = name
        if suffix:
            return f"{number // _BINARY_SUFFIXES[suffix]}{suffix}"
        return str(number)
    return _render_decimal(value, exponent_style=quantity.format == DECIMAL_EXPONENT)


def _render_decimal(value: Fraction, exponent_style: bool) -> str:
    # Find the smallest exponent (multiple of 3, >= -9) that makes the mantissa an integer;
    # then grow it while the mantissa stays integral (1000 -> 1k). Kubernetes rounds values
    # finer than nano up to the next nano.
    exponent = -9
    mantissa = value * Fraction(10) ** 9
    if mantissa.denominator != 1:
        mantissa = Fraction(-((-mantissa.numerator) // mantissa.denominator))
    number = int(mantissa)
    while exponent < 18 and number % 1000 == 0 and number != 0:
        number //= 1000
        exponent += 3
    if exponent_style:
        return f"{number}e{exponent}" if exponent else str(number)
    suffix = {v: k for k, v in _DECIMAL_SUFFIXES.items()}[exponent]
    return f"{number}{suffix}"


def millicores(raw: Any) -> int:
    """A CPU quantity in whole millicores, rounded up as the scheduler counts it."""
    return parse_quantity(raw).times(1000).ceil()


def whole_units(raw: Any) -> int:
    """A byte or device-count quantity rounded up to a whole number."""
    return parse_quantity(raw).ceil()
