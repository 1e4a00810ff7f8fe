"""The Kubernetes CEL libraries, as cel-python functions: what policies may call beyond standard CEL.

Kubernetes gives every CEL expression (CRD rules, ValidatingAdmissionPolicy) extension libraries
on top of the CEL standard: the strings extension (``charAt``, ``indexOf``, ``lastIndexOf``,
``lowerAscii``, ``upperAscii``, ``replace``, ``split``, ``substring``, ``trim``, ``join``),
the list library (``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``, ``lastIndexOf``), the
regex library (``find``, ``findAll``), the quantity library (``quantity``, ``isQuantity``,
``sign``, ``isInteger``, ``asInteger``, ``asApproximateFloat``, ``add``, ``sub``,
``compareTo``, ``isGreaterThan``, ``isLessThan``), the URL library (``url``, ``isURL``,
``getScheme``, ``getHost``, ``getHostname``, ``getPort``, ``getEscapedPath``, ``getQuery``) and
the IP/CIDR library (``ip``, ``isIP``, ``family``, ``isUnspecified``, ``isLoopback``,
``isLinkLocalMulticast``, ``isLinkLocalUnicast``, ``isGlobalUnicast``, ``cidr``, ``isCIDR``,
``containsIP``, ``containsCIDR``, ``ip()`` of a CIDR, ``masked``, ``prefixLength``).

cel-python calls a receiver-style function ``x.f(a)`` as ``f(x, a)``, so one Python function
per name serves both shapes; names shared by two libraries (``indexOf`` on strings and lists)
dispatch on the receiver's type. A function answers a ``CELEvalError`` for a value it cannot
handle, which CEL propagates like any evaluation error. ``FUNCTIONS`` is what ``cel.py``
hands to every program it builds: this module is used only through the one evaluator.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable
from urllib.parse import urlsplit

from celpy import celtypes
from celpy.evaluation import CELEvalError

from trainyard.apimachinery.quantity import Quantity, QuantityError, parse_quantity, render_quantity


def _error(message: str) -> CELEvalError:
    return CELEvalError(message)


# --- strings ------------------------------------------------------------------------------

def _char_at(text: Any, index: Any) -> Any:
    if not isinstance(text, str) or not isinstance(index, int):
        return _error("no such overload: charAt")
    if index < 0 or index > len(text):
        return _error(f"index out of range: {index}")
    return celtypes.StringType(text[index:index + 1])


def _index_of(receiver: Any, item: Any, start: Any = None) -> Any:
    if isinstance(receiver, str):
        if not isinstance(item, str):
            return _error("no such overload: indexOf")
        offset = int(start or 0)
        if offset < 0 or offset > len(receiver):
            return _error(f"index out of range: {offset}")
        return celtypes.IntType(receiver.find(item, offset))
    if isinstance(receiver, list):
        for position, value in enumerate(receiver):
            if _same(value, item):
                return celtypes.IntType(position)
        return celtypes.IntType(-1)
    return _error("no such overload: indexOf")


def _last_index_of(receiver: Any, item: Any, end: Any = None) -> Any:
    if isinstance(receiver, str):
        if not isinstance(item, str):
            return _error("no such overload: lastIndexOf")
        if end is None:
            return celtypes.IntType(receiver.rfind(item))
        return celtypes.IntType(receiver.rfind(item, 0, int(end) + len(item)))
    if isinstance(receiver, list):
        for position in range(len(receiver) - 1, -1, -1):
            if _same(receiver[position], item):
                return celtypes.IntType(position)
        return celtypes.IntType(-1)
    return _error("no such overload: lastIndexOf")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except TypeError:
        return False


def _string_fn(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(text: Any, *args: Any) -> Any:
        if not isinstance(text, str):
            return _error(f"no such overload: {name}")
        try:
            return fn(text, *args)
        except (TypeError, ValueError, IndexError) as err:
            return _error(f"{name}: {err}")
    return call


def _replace(text: str, old: str, new: str, limit: Any = None) -> Any:
    count = -1 if limit is None else int(limit)
    return celtypes.StringType(text.replace(old, new, count))


def _split(text: str, separator: str, limit: Any = None) -> Any:
    if limit is not None and int(limit) == 0:
        return celtypes.ListType([])
    if separator == "":
        parts = list(text)
        if limit is not None and int(limit) > 0 and len(parts) > int(limit):
            parts = parts[:int(limit) - 1] + ["".join(parts[int(limit) - 1:])]
    else:
        parts = text.split(separator, -1 if limit is None or int(limit) < 0 else int(limit) - 1)
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _substring(text: str, start: Any, end: Any = None) -> Any:
    stop = len(text) if end is None else int(end)
    if int(start) < 0 or stop > len(text) or int(start) > stop:
        return _error(f"index out of range: {start if int(start) < 0 or int(start) > stop else stop}")
    return celtypes.StringType(text[int(start):stop])


def _join(items: Any, separator: Any = "") -> Any:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return _error("no such overload: join")
    return celtypes.StringType(str(separator).join(items))


# --- lists --------------------------------------------------------------------------------

def _comparable(items: Any, name: str) -> Any:
    if not isinstance(items, list):
        return _error(f"no such overload: {name}")
    return None


def _is_sorted(items: Any) -> Any:
    problem = _comparable(items, "isSorted")
    if problem is not None:
        return problem
    try:
        return celtypes.BoolType(all(not (items[i + 1] < items[i]) for i in range(len(items) - 1)))
    except TypeError:
        return _error("no such overload: isSorted")


def _sum(items: Any) -> Any:
    problem = _comparable(items, "sum")
    if problem is not None:
        return problem
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    try:
        for value in items[1:]:
            total = total + value
    except TypeError:
        return _error("no such overload: sum")
    return total


def _extreme(name: str, pick: Callable[..., Any]) -> Callable[[Any], Any]:
    def call(items: Any) -> Any:
        problem = _comparable(items, name)
        if problem is not None:
            return problem
        if not items:
            return _error(f"{name} called on empty list")
        try:
            return pick(items)
        except TypeError:
            return _error(f"no such overload: {name}")
    return call


# --- regex --------------------------------------------------------------------------------

def _find(text: Any, pattern: Any) -> Any:
    if not isinstance(text, str) or not isinstance(pattern, str):
        return _error("no such overload: find")
    try:
        match = re.search(pattern, text)
    except re.error as err:
        return _error(f"invalid regular expression {pattern!r}: {err}")
    return celtypes.StringType(match.group(0) if match else "")


def _find_all(text: Any, pattern: Any, limit: Any = None) -> Any:
    if not isinstance(text, str) or not isinstance(pattern, str):
        return _error("no such overload: findAll")
    try:
        found = [m.group(0) for m in re.finditer(pattern, text)]
    except re.error as err:
        return _error(f"invalid regular expression {pattern!r}: {err}")
    if limit is not None and int(limit) >= 0:
        found = found[:int(limit)]
    return celtypes.ListType([celtypes.StringType(f) for f in found])


# --- quantity -----------------------------------------------------------------------------

class QuantityValue:
    """A Kubernetes quantity inside CEL (``quantity('1Gi')``); compared with its methods."""

    def __init__(self, quantity: Quantity) -> None:
        self.quantity = quantity

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, QuantityValue) and self.quantity.value == other.quantity.value

    def __hash__(self) -> int:
        return hash(self.quantity.value)

    def __repr__(self) -> str:
        return f"quantity({render_quantity(self.quantity)!r})"

    def __str__(self) -> str:
        return render_quantity(self.quantity)


def _parse(text: str) -> Quantity:
    if text != text.strip():  # Kubernetes' parser takes no surrounding spaces
        raise QuantityError(f"quantities must match the regular expression; got {text!r}")
    return parse_quantity(text)


def _from_string(name: str, parse: Callable[[str], Any], wrap: Callable[[Any], Any],
                 message: Callable[[str, ValueError], str]) -> Callable[[Any], Any]:
    """A CEL conversion from a string (``quantity()``, ``ip()``, ``cidr()``): "no such overload"
    for another type, the conversion's own error for text that does not parse."""
    def call(text: Any) -> Any:
        if not isinstance(text, str):
            return _error(f"no such overload: {name}")
        try:
            return wrap(parse(str(text)))
        except ValueError as err:
            return _error(message(str(text), err))
    return call


def _is_parsable(parse: Callable[[str], Any], name: str) -> Callable[[Any], Any]:
    """A CEL ``is<Type>()`` check: whether a string converts (another type has no overload)."""
    def call(text: Any) -> Any:
        if not isinstance(text, str):
            return _error(f"no such overload: {name}")
        try:
            parse(str(text))
        except ValueError:
            return celtypes.BoolType(False)
        return celtypes.BoolType(True)
    return call


_quantity_from_string = _from_string("quantity", _parse, QuantityValue,
                                     lambda text, err: f"quantities must match the regular expression: {err}")


def _quantity(value: Any) -> Any:
    return value if isinstance(value, QuantityValue) else _quantity_from_string(value)


_is_quantity = _is_parsable(_parse, "isQuantity")


def _as_quantity(value: Any, name: str) -> QuantityValue | CELEvalError:
    if isinstance(value, QuantityValue):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return QuantityValue(Quantity(Fraction(int(value))))
    return _error(f"no such overload: {name}")


def _quantity_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(receiver: Any, *args: Any) -> Any:
        if not isinstance(receiver, QuantityValue):
            return _error(f"no such overload: {name}")
        converted = []
        for arg in args:
            value = _as_quantity(arg, name)
            if isinstance(value, CELEvalError):
                return value
            converted.append(value.quantity.value)
        return fn(receiver.quantity, *converted)
    return call


def _compare(a: Fraction, b: Fraction) -> int:
    return (a > b) - (a < b)


def _as_integer(q: Quantity) -> Any:
    if q.value.denominator != 1 or not -(2**63) <= q.value.numerator < 2**63:
        return _error("cannot convert value to integer")
    return celtypes.IntType(q.value.numerator)


# --- URL ----------------------------------------------------------------------------------

class URLValue:
    """A parsed absolute URL (``url('https://host:8080/p?q=1')``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.parts = urlsplit(text)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, URLValue) and self.text == other.text

    def __hash__(self) -> int:
        return hash(self.text)


def _parse_url(text: str) -> URLValue | None:
    try:
        parsed = urlsplit(text)
        _ = parsed.port
    except ValueError:
        return None
    if not parsed.scheme and not text.startswith("/"):
        return None
    return URLValue(text)


def _url(text: Any) -> Any:
    if not isinstance(text, str):
        return _error("no such overload: url")
    parsed = _parse_url(str(text))
    return parsed if parsed is not None else _error(f"URL parse error during conversion from string: {text}")


def _url_method(name: str, fn: Callable[[URLValue], str]) -> Callable[[Any], Any]:
    def call(value: Any) -> Any:
        if not isinstance(value, URLValue):
            return _error(f"no such overload: {name}")
        return celtypes.StringType(fn(value))
    return call


def _host(value: URLValue) -> str:
    netloc = value.parts.netloc.rsplit("@", 1)[-1]
    return netloc


def _hostname(value: URLValue) -> str:
    host = _host(value)
    if host.startswith("["):
        return host[1:host.index("]")]
    return host.split(":", 1)[0]


def _port(value: URLValue) -> str:
    host = _host(value)
    if host.startswith("["):
        rest = host[host.index("]") + 1:]
        return rest[1:] if rest.startswith(":") else ""
    return host.split(":", 1)[1] if ":" in host else ""


def _query(value: Any) -> Any:
    if not isinstance(value, URLValue):
        return _error("no such overload: getQuery")
    from urllib.parse import parse_qs
    parsed = parse_qs(value.parts.query, keep_blank_values=True)
    return celtypes.MapType({celtypes.StringType(k): celtypes.ListType([celtypes.StringType(x) for x in v])
                             for k, v in parsed.items()})


# --- IP and CIDR ----------------------------------------------------------------------------

@dataclass(frozen=True)
class IPValue:
    """An IP address (``ip('10.0.0.1')``); Kubernetes refuses zones and IPv4-mapped IPv6."""

    address: Any

    def __str__(self) -> str:
        return str(self.address)


@dataclass(frozen=True)
class CIDRValue:
    """A subnet as written (``cidr('10.0.0.1/8')`` keeps its address; ``masked()`` clears it)."""

    interface: Any

    def __str__(self) -> str:
        return str(self.interface)


def _parse_ip(text: str) -> Any:
    import ipaddress
    if "%" in text:
        raise ValueError("IP address with zone value is not allowed")
    address = ipaddress.ip_address(text)
    if address.version == 6 and address.ipv4_mapped is not None:
        raise ValueError("IPv4-mapped IPv6 address is not allowed")
    return address


def _parse_cidr(text: str) -> Any:
    import ipaddress
    if "%" in text:
        raise ValueError("CIDR with zone value is not allowed")
    interface = ipaddress.ip_interface(text)
    if "/" not in text:
        raise ValueError("CIDR must have a prefix length")
    if interface.version == 6 and interface.ip.ipv4_mapped is not None:
        raise ValueError("IPv4-mapped IPv6 address is not allowed")
    return interface


_ip = _from_string("ip", _parse_ip, IPValue,
                   lambda text, err: f"IP Address {text!r} parse error during conversion from string: {err}")
_cidr = _from_string("cidr", _parse_cidr, CIDRValue,
                     lambda text, err: f"network address parse error during conversion from string: {err}")


def _ip_method(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call(value: Any) -> Any:
        if not isinstance(value, IPValue):
            return _error(f"no such overload: {name}")
        return fn(value.address)
    return call


def _contains_ip(subnet: Any, other: Any) -> Any:
    if not isinstance(subnet, CIDRValue):
        return _error("no such overload: containsIP")
    if isinstance(other, str):
        other = _ip(other)
    if not isinstance(other, IPValue):
        return other if isinstance(other, CELEvalError) else _error("no such overload: containsIP")
    return celtypes.BoolType(other.address.version == subnet.interface.version
                             and other.address in subnet.interface.network)


def _contains_cidr(subnet: Any, other: Any) -> Any:
    if not isinstance(subnet, CIDRValue):
        return _error("no such overload: containsCIDR")
    if isinstance(other, str):
        other = _cidr(other)
    if not isinstance(other, CIDRValue):
        return other if isinstance(other, CELEvalError) else _error("no such overload: containsCIDR")
    inner, outer = other.interface.network, subnet.interface.network
    return celtypes.BoolType(inner.version == outer.version and inner.subnet_of(outer))


def _cidr_method(name: str, fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def call(value: Any) -> Any:
        if not isinstance(value, CIDRValue):
            return _error(f"no such overload: {name}")
        return fn(value.interface)
    return call


def _link_local_multicast(address: Any) -> bool:
    import ipaddress
    return address in ipaddress.ip_network("224.0.0.0/24" if address.version == 4 else "ff02::/16")


def _masked(interface: Any) -> Any:
    import ipaddress
    return CIDRValue(ipaddress.ip_interface(str(interface.network)))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    # strings
    "charAt": _char_at,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "lowerAscii": _string_fn("lowerAscii", lambda t: celtypes.StringType(
        "".join(c.lower() if c.isascii() else c for c in t))),
    "upperAscii": _string_fn("upperAscii", lambda t: celtypes.StringType(
        "".join(c.upper() if c.isascii() else c for c in t))),
    "replace": _string_fn("replace", _replace),
    "split": _string_fn("split", _split),
    "substring": _string_fn("substring", _substring),
    "trim": _string_fn("trim", lambda t: celtypes.StringType(t.strip())),
    "join": _join,
    # lists
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _extreme("min", min),
    "max": _extreme("max", max),
    # regex
    "find": _find,
    "findAll": _find_all,
    # quantity
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "sign": _quantity_method("sign", lambda q: celtypes.IntType(_compare(q.value, Fraction(0)))),
    "isInteger": _quantity_method("isInteger", lambda q: celtypes.BoolType(
        q.value.denominator == 1 and -(2**63) <= q.value.numerator < 2**63)),
    "asInteger": _quantity_method("asInteger", _as_integer),
    "asApproximateFloat": _quantity_method("asApproximateFloat", lambda q: celtypes.DoubleType(float(q.value))),
    "add": _quantity_method("add", lambda q, v: QuantityValue(Quantity(q.value + v, q.format))),
    "sub": _quantity_method("sub", lambda q, v: QuantityValue(Quantity(q.value - v, q.format))),
    "compareTo": _quantity_method("compareTo", lambda q, v: celtypes.IntType(_compare(q.value, v))),
    "isGreaterThan": _quantity_method("isGreaterThan", lambda q, v: celtypes.BoolType(q.value > v)),
    "isLessThan": _quantity_method("isLessThan", lambda q, v: celtypes.BoolType(q.value < v)),
    # URL
    "url": _url,
    "isURL": lambda t: celtypes.BoolType(isinstance(t, str) and _parse_url(str(t)) is not None)
    if isinstance(t, str) else _error("no such overload: isURL"),
    "getScheme": _url_method("getScheme", lambda u: u.parts.scheme),
    "getHost": _url_method("getHost", _host),
    "getHostname": _url_method("getHostname", _hostname),
    "getPort": _url_method("getPort", _port),
    "getEscapedPath": _url_method("getEscapedPath", lambda u: u.parts.path),
    "getQuery": _query,
    # IP and CIDR
    "ip": lambda value: _cidr_method("ip", lambda i: IPValue(i.ip))(value) if isinstance(value, CIDRValue)
    else _ip(value),
    "isIP": _is_parsable(_parse_ip, "isIP"),
    "cidr": _cidr,
    "isCIDR": _is_parsable(_parse_cidr, "isCIDR"),
    "family": _ip_method("family", lambda a: celtypes.IntType(a.version)),
    "isUnspecified": _ip_method("isUnspecified", lambda a: celtypes.BoolType(a.is_unspecified)),
    "isLoopback": _ip_method("isLoopback", lambda a: celtypes.BoolType(a.is_loopback)),
    "isLinkLocalMulticast": _ip_method("isLinkLocalMulticast", lambda a: celtypes.BoolType(_link_local_multicast(a))),
    "isLinkLocalUnicast": _ip_method("isLinkLocalUnicast", lambda a: celtypes.BoolType(a.is_link_local and
                                                                                        not a.is_multicast)),
    "isGlobalUnicast": _ip_method("isGlobalUnicast", lambda a: celtypes.BoolType(
        not (a.is_unspecified or a.is_loopback or a.is_multicast or a.is_link_local)
        and not (a.version == 4 and str(a) == "255.255.255.255"))),
    "containsIP": _contains_ip,
    "containsCIDR": _contains_cidr,
    "masked": _cidr_method("masked", _masked),
    "prefixLength": _cidr_method("prefixLength", lambda i: celtypes.IntType(i.network.prefixlen)),
}
