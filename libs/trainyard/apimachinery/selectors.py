"""Label and field selectors, as `labelSelector=` / `fieldSelector=` and `metav1.LabelSelector`.

Label selector grammar (comma = AND, spaces around tokens allowed):
`k=v`, `k==v`, `k!=v` (absent or different), `k in (a,b)`, `k notin (a)` (absent or not listed),
`k` (present), `!k` (absent), `k>3`, `k<3` (present and integer comparison).
Parse errors raise `SelectorError` with upstream's `unable to parse requirement: ...` wording.

Field selectors: `key=value`, `key==value`, `key!=value`, comma = AND, `\\` escapes `,`, `=`, `!`
and `\\` inside values. Which keys a resource supports is the caller's choice (`supported_fields`);
`metadata.name` and `metadata.namespace` always work; others give `field label not supported: k`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Collection, Iterable, Mapping

from trainyard.apimachinery.dns_names import is_dns1123_subdomain
from trainyard.apimachinery.errors import SelectorError

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_NAME_RE = re.compile(f"^{_NAME}$")
_SPECIAL_CHARACTERS = "=!(),<>"
_WORD_OPERATORS = {"in": "in", "notin": "notin"}

# Operators of a parsed requirement.
EQUALS, NOT_EQUALS, IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GREATER_THAN, LESS_THAN = (
    "=", "!=", "in", "notin", "exists", "!", "gt", "lt",
)


@dataclass(frozen=True)
class Requirement:
    """One label requirement: `key`, an operator and its values."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator in (EQUALS, IN):
            return present and value in self.values
        if self.operator in (NOT_EQUALS, NOT_IN):
            return not present or value not in self.values
        if self.operator == EXISTS:
            return present
        if self.operator == DOES_NOT_EXIST:
            return not present
        return present and _integer_compare(str(value), self.operator, self.values[0])

    def __str__(self) -> str:
        if self.operator == EXISTS:
            return self.key
        if self.operator == DOES_NOT_EXIST:
            return f"!{self.key}"
        if self.operator in (IN, NOT_IN):
            return f"{self.key} {self.operator} ({','.join(sorted(self.values))})"
        symbol = {EQUALS: "=", NOT_EQUALS: "!=", GREATER_THAN: ">", LESS_THAN: "<"}[self.operator]
        return f"{self.key}{symbol}{self.values[0]}"


@dataclass(frozen=True)
class LabelSelector:
    """All requirements must hold. `nothing=True` is the selector that matches no object
    (what a nil `metav1.LabelSelector` means)."""

    requirements: tuple[Requirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self.nothing:
            return False
        current = labels or {}
        return all(requirement.matches(current) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements and not self.nothing

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


def _integer_compare(value: str, operator: str, bound: str) -> bool:
    try:
        number = int(value)
    except ValueError:
        return False
    return number > int(bound) if operator == GREATER_THAN else number < int(bound)


# -- label selector strings ------------------------------------------------------------------


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char.isspace():
            position += 1
        elif text.startswith(("==", "!="), position):
            tokens.append(text[position:position + 2])
            position += 2
        elif char in _SPECIAL_CHARACTERS:
            tokens.append(char)
            position += 1
        else:
            end = position
            while end < len(text) and not text[end].isspace() and text[end] not in _SPECIAL_CHARACTERS:
                end += 1
            tokens.append(text[position:end])
            position = end
    return tokens


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.position = 0

    def peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.position += 1
        return token

    def fail(self, found: str | None, expected: str) -> SelectorError:
        return SelectorError(f"unable to parse requirement: found '{found or ''}', expected: {expected}")

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        if self.peek() is None:
            return requirements
        while True:
            requirements.append(self.requirement())
            token = self.take()
            if token is None:
                return requirements
            if token != ",":
                raise self.fail(token, "',' or 'end of string'")

    def requirement(self) -> Requirement:
        token = self.take()
        if token == "!":
            key = self.identifier()
            return Requirement(_valid_key(key), DOES_NOT_EXIST)
        if token is None or _is_operator(token):
            raise self.fail(token, "identifier")
        key = _valid_key(token)
        following = self.peek()
        if following is None or following == ",":
            return Requirement(key, EXISTS)
        operator = self.take()
        if operator in ("=", "=="):
            return Requirement(key, EQUALS, (self.value(),))
        if operator == "!=":
            return Requirement(key, NOT_EQUALS, (self.value(),))
        if operator in (">", "<"):
            bound = self.take()
            if bound is None or not re.fullmatch(r"-?\d+", bound):
                raise SelectorError(f"unable to parse requirement: for 'gt', 'lt' operators, the value must be an integer: {bound or ''!r}")
            return Requirement(key, GREATER_THAN if operator == ">" else LESS_THAN, (bound,))
        if operator in _WORD_OPERATORS:
            return Requirement(key, _WORD_OPERATORS[operator], self.value_set())
        raise self.fail(operator, "'=', '!=', '==', 'in', notin'")

    def identifier(self) -> str:
        token = self.take()
        if token is None or _is_operator(token):
            raise self.fail(token, "identifier")
        return token

    def value(self) -> str:
        token = self.peek()
        if token is None or token == ",":
            return ""  # `k=` selects the empty value
        if _is_operator(token):
            raise self.fail(token, "identifier")
        self.take()
        return _valid_value(token)

    def value_set(self) -> tuple[str, ...]:
        token = self.take()
        if token != "(":
            raise self.fail(token, "'('")
        values: list[str] = []
        expecting_value = True
        while True:
            token = self.take()
            if token is None:
                raise self.fail(None, "')'")
            if token == ")":
                if expecting_value:  # `in ()` and `in (a,)` include the empty value, as upstream
                    values.append("")
                return tuple(values)
            if token == ",":
                if expecting_value:
                    values.append("")
                expecting_value = True
                continue
            if _is_operator(token) or not expecting_value:
                raise self.fail(token, "',' or ')'")
            values.append(_valid_value(token))
            expecting_value = False


def _is_operator(token: str) -> bool:
    return token in ("=", "==", "!=", "!", "(", ")", ",", ">", "<")


def _valid_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash and (not prefix or not is_dns1123_subdomain(prefix)):
        problems.append("prefix part must be a lowercase RFC 1123 subdomain")
    if not name or len(name) > 63 or not _NAME_RE.match(name):
        problems.append("name part must consist of alphanumeric characters, '-', '_' or '.', at most 63 "
                        "characters, and must start and end with an alphanumeric character")
    if problems:
        raise SelectorError(f"unable to parse requirement: key: Invalid value: {key!r}: {'; '.join(problems)}")
    return key


def _valid_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME_RE.match(value)):
        raise SelectorError(
            f"unable to parse requirement: values[0]: Invalid value: {value!r}: a valid label must be an empty "
            "string or consist of alphanumeric characters, '-', '_' or '.', at most 63 characters, and must "
            "start and end with an alphanumeric character")
    return value


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a `labelSelector` query value (already URL-decoded). Empty -> matches everything."""
    return LabelSelector(tuple(_LabelParser(text or "").parse()))


# -- metav1.LabelSelector --------------------------------------------------------------------

_EXPRESSION_OPERATORS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}


def label_selector_from_struct(selector: Mapping[str, Any] | None, field: str = "selector") -> LabelSelector:
    """A `metav1.LabelSelector` dict (`matchLabels`, `matchExpressions`) as a selector.

    None matches nothing; `{}` matches everything (upstream `LabelSelectorAsSelector`). Errors
    name the field, e.g. `selector.matchExpressions[0].values: ...`.
    """
    if selector is None:
        return LabelSelector(nothing=True)
    if not isinstance(selector, Mapping):
        raise SelectorError(f"{field}: must be an object with matchLabels/matchExpressions")
    requirements: list[Requirement] = []
    match_labels = selector.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise SelectorError(f"{field}.matchLabels: must be a map of strings")
    for key, value in sorted(match_labels.items()):
        requirements.append(Requirement(_valid_key(str(key)), EQUALS, (_valid_value(str(value)),)))
    for index, expression in enumerate(selector.get("matchExpressions") or []):
        requirements.append(_expression_requirement(expression, f"{field}.matchExpressions[{index}]"))
    return LabelSelector(tuple(requirements))


def _expression_requirement(expression: Any, where: str) -> Requirement:
    if not isinstance(expression, Mapping):
        raise SelectorError(f"{where}: must be an object with key, operator and values")
    operator = _EXPRESSION_OPERATORS.get(expression.get("operator"))
    if operator is None:
        raise SelectorError(f"{where}.operator: Unsupported value: {expression.get('operator')!r}: supported values: "
                            '"DoesNotExist", "Exists", "In", "NotIn"')
    values = tuple(str(value) for value in expression.get("values") or [])
    if operator in (IN, NOT_IN) and not values:
        raise SelectorError(f"{where}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'")
    if operator in (EXISTS, DOES_NOT_EXIST) and values:
        raise SelectorError(f"{where}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
    return Requirement(_valid_key(str(expression.get("key") or "")), operator, tuple(_valid_value(v) for v in values))


# -- field selectors -------------------------------------------------------------------------

ALWAYS_SUPPORTED_FIELDS = frozenset({"metadata.name", "metadata.namespace"})

# Extra field selector keys upstream serves per (group, resource); everything else has only the
# two metadata fields.
SUPPORTED_FIELDS: Mapping[tuple[str, str], frozenset[str]] = {
    ("", "events"): frozenset({
        "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
        "reason", "reportingComponent", "source", "type",
    }),
    ("", "pods"): frozenset({
        "spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
        "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName",
    }),
    ("", "secrets"): frozenset({"type"}),
    ("", "namespaces"): frozenset({"status.phase"}),
    ("batch", "jobs"): frozenset({"status.successful"}),
}

# Field selector keys whose value lives elsewhere in the object.
_FIELD_LOCATIONS = {"source": "source.component"}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    operator: str  # EQUALS or NOT_EQUALS
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = field_value(obj, self.field)
        return actual == self.value if self.operator == EQUALS else actual != self.value

    def __str__(self) -> str:
        escaped = re.sub(r"([\\,=!])", r"\\\1", self.value)
        return f"{self.field}{'=' if self.operator == EQUALS else '!='}{escaped}"


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(requirement.matches(obj) for requirement in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return ",".join(str(requirement) for requirement in self.requirements)


def field_value(obj: Mapping[str, Any], field: str) -> str:
    """The string form of a selectable field (`""` when absent; booleans as `true`/`false`)."""
    current: Any = obj
    for part in _FIELD_LOCATIONS.get(field, field).split("."):
        current = current.get(part) if isinstance(current, Mapping) else None
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def supported_fields_for(group: str, resource: str) -> frozenset[str]:
    return ALWAYS_SUPPORTED_FIELDS | SUPPORTED_FIELDS.get((group, resource), frozenset())


def parse_field_selector(text: str | None, supported_fields: Collection[str] | None = None) -> FieldSelector:
    """Parse a `fieldSelector` query value. `supported_fields` None = only the metadata fields."""
    allowed = ALWAYS_SUPPORTED_FIELDS | frozenset(supported_fields or ())
    requirements = []
    for term in _split_unescaped(text or "", ","):
        if not term.strip():
            continue
        requirements.append(_field_requirement(term, text or "", allowed))
    return FieldSelector(tuple(requirements))


def _field_requirement(term: str, whole: str, allowed: frozenset[str]) -> FieldRequirement:
    for symbol, operator in (("!=", NOT_EQUALS), ("==", EQUALS), ("=", EQUALS)):
        position = _find_unescaped(term, symbol)
        if position >= 0:
            field = term[:position].strip()
            value = _unescape(term[position + len(symbol):])
            break
    else:
        raise SelectorError(f"invalid selector: '{whole}'; can't understand '{term}'")
    if not field:
        raise SelectorError(f"invalid selector: '{whole}'; can't understand '{term}'")
    if field not in allowed:
        raise SelectorError(f"field label not supported: {field}")
    return FieldRequirement(field, operator, value)


def _split_unescaped(text: str, separator: str) -> Iterable[str]:
    part, escaped = [], False
    for char in text:
        if escaped:
            part.append("\\" + char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == separator:
            yield "".join(part)
            part = []
        else:
            part.append(char)
    if escaped:
        part.append("\\")
    yield "".join(part)


def _find_unescaped(text: str, symbol: str) -> int:
    position = 0
    while position < len(text):
        if text[position] == "\\":
            position += 2
            continue
        if text.startswith(symbol, position):
            # `=` inside `!=`/`==` belongs to the longer operator, tried first
            return position
        position += 1
    return -1


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)
