"""ValidatingAdmissionPolicy type checking (``status.typeChecking``), as far as cel-python allows.

kube-apiserver type-checks a policy's expressions after it is written, against the kinds its
``spec.matchConstraints`` match, and reports what it finds in ``status.typeChecking``
(``expressionWarnings``: ``fieldRef`` and ``warning``); the policy is enforced the same either
way. The rules, from the "Validating Admission Policy" documentation ("Type checking"):

- the expressions checked are ``spec.validations[i].expression`` and
  ``spec.validations[i].messageExpression``;
- the types are the kinds ``matchConstraints.resourceRules`` name without wildcards (a rule
  with ``*`` in apiGroups, apiVersions or resources is not checked), built-in kinds only (no
  custom resources, nor a paramKind that is one), at most 10 of them in ascending group,
  version and resource order;
- one warning per expression, a line per kind it fails against:
  ``apps/v1, Kind=Deployment: ERROR: <input>:1:7: undefined field 'replicas'`` then the source
  line and a caret under the column (``" | object.replicas > 1"``, ``" | ......^"``);
- an empty ``typeChecking`` means the check ran and found nothing.

cel-go has a full type checker; cel-python has none, so this walks cel-python's parse tree and
finds what cel-go would call an ``undefined field``: a field selected (``a.b``, ``has(a.b)``)
on ``object``, ``oldObject``, ``params`` (a built-in paramKind) or ``namespaceObject``, or on a
value reached from them by fields, indexes and the ``all``/``exists``/``exists_one``/``map``/
``filter`` macros' variables, where the kind's OpenAPI schema declares properties and not that
one. Not found (cel-go would report them): type confusion (``'a' + 1``, comparing an int with a
string), wrong function overloads, fields of ``request``, ``variables`` and ``authorizer``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

MAX_TYPES = 10
_TYPED_ROOTS = ("object", "oldObject")
_MACROS_WITH_VARIABLE = ("all", "exists", "exists_one", "map", "filter")

Schema = dict[str, Any]


@dataclass(frozen=True)
class CheckedKind:
    """One kind an expression is checked against: ``gvk`` as Go prints it
    (``apps/v1, Kind=Deployment``, ``/v1, Kind=ConfigMap``) and its OpenAPI schema."""

    gvk: str
    schema: Schema


def gvk_string(group: str, version: str, kind: str) -> str:
    """``schema.GroupVersionKind.String()``: group, ``/``, version, ``, Kind=``, kind."""
    return f"{group}/{version}, Kind={kind}"


def matched_resources(match_constraints: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """(group, version, resource) of the main resources the policy's ``resourceRules`` name
    without wildcards, sorted, at most ``MAX_TYPES``."""
    found: set[tuple[str, str, str]] = set()
    for rule in (match_constraints or {}).get("resourceRules") or []:
        if not isinstance(rule, dict):
            continue
        groups, versions, resources = (list(rule.get(k) or []) for k in ("apiGroups", "apiVersions", "resources"))
        if "*" in groups or "*" in versions or any("*" in str(r) for r in resources):
            continue
        for group in groups:
            for version in versions:
                for resource in resources:
                    found.add((str(group), str(version), str(resource).split("/", 1)[0]))
    return sorted(found)[:MAX_TYPES]


class _Checker:
    """Walks one parse tree against one kind's schemas, collecting undefined-field errors."""

    def __init__(self, text: str, roots: Mapping[str, Schema], resolve: Callable[[Schema], Schema]) -> None:
        self.text = text
        self.roots = roots
        self.resolve = resolve
        self.errors: list[tuple[int, str]] = []  # (offset, message)

    def walk(self, node: Any, scope: Mapping[str, Schema | None]) -> Schema | None:
        """The schema of ``node``'s value (None: not known, as cel-go's ``dyn``)."""
        kind = getattr(node, "data", None)
        if kind is None:
            return None
        children = node.children
        if kind == "ident":
            name = str(children[0])
            if name in scope:
                return scope[name]
            return self.roots.get(name)
        if kind == "member_dot":
            base = self.walk(children[0], scope)
            return self._field(base, children[1])
        if kind == "member_index":
            base = self.walk(children[0], scope)
            for child in children[1:]:
                self.walk(child, scope)
            return self._element(base)
        if kind == "member_dot_arg":
            return self._call(children, scope)
        result = None
        for child in children:
            value = self.walk(child, scope)
            if len(children) == 1:
                result = value  # a wrapper node (expr, member, primary...) has its child's type
        return result

    def _call(self, children: list[Any], scope: Mapping[str, Schema | None]) -> Schema | None:
        target, method = children[0], str(children[1])
        args = children[2].children if len(children) > 2 and getattr(children[2], "data", None) == "exprlist" else []
        base = self.walk(target, scope)
        if method in _MACROS_WITH_VARIABLE and len(args) >= 2:
            variable = _identifier(args[0])
            if variable is not None:
                inner = dict(scope)
                inner[variable] = self._element(base) if self._is_list(base) else self._key(base)
                for arg in args[1:]:
                    self.walk(arg, inner)
                return None
        for arg in args:
            self.walk(arg, scope)
        return None

    def _is_list(self, schema: Schema | None) -> bool:
        return schema is not None and isinstance(self.resolve(schema).get("items"), dict)

    def _key(self, schema: Schema | None) -> Schema | None:
        resolved = self.resolve(schema) if schema is not None else None
        return {"type": "string"} if resolved is not None and "additionalProperties" in resolved else None

    def _element(self, schema: Schema | None) -> Schema | None:
        if schema is None:
            return None
        resolved = self.resolve(schema)
        if isinstance(resolved.get("items"), dict):
            return resolved["items"]
        if isinstance(resolved.get("additionalProperties"), dict):
            return resolved["additionalProperties"]
        return None

    def _field(self, base: Schema | None, token: Any) -> Schema | None:
        if base is None:
            return None
        resolved = self.resolve(base)
        name = str(token)
        if resolved.get("x-kubernetes-preserve-unknown-fields"):
            return None
        properties = resolved.get("properties")
        if isinstance(properties, dict):
            if name in properties:
                return properties[name]
            self.errors.append((self._dot_before(token), f"undefined field '{name}'"))
            return None
        if isinstance(resolved.get("additionalProperties"), dict):
            return resolved["additionalProperties"]  # a map read with a field selection
        return None

    def _dot_before(self, token: Any) -> int:
        """cel-go places a selection's error at its ``.``."""
        start = int(getattr(token, "start_pos", 0) or 0)
        dot = self.text.rfind(".", 0, start)
        return dot if dot >= 0 else start


def _identifier(node: Any) -> str | None:
    """The identifier a macro's first argument names (``c`` in ``all(c, ...)``)."""
    while getattr(node, "data", None) is not None:
        if node.data == "ident":
            return str(node.children[0])
        if len(node.children) != 1:
            return None
        node = node.children[0]
    return None


def _display(text: str, offset: int, message: str) -> str:
    """cel-go's ``ERROR: <input>:L:C: message`` with the source line and a caret."""
    line_start = text.rfind("\n", 0, offset) + 1
    line_end = text.find("\n", offset)
    line = text[line_start:line_end if line_end >= 0 else len(text)]
    line_no = text.count("\n", 0, offset) + 1
    column = offset - line_start
    return f"ERROR: <input>:{line_no}:{column + 1}: {message}\n | {line}\n | {'.' * column}^"


def _parse(expression: str) -> Any:
    from trainyard.apimachinery.cel import cel_environment  # the tree cel-python itself evaluates
    return cel_environment().compile(expression)


def check_expression(expression: str, kinds: list[CheckedKind], extra_roots: Mapping[str, Schema],
                     resolve: Callable[[Schema], Schema]) -> str:
    """The warning text for one expression (empty: nothing found, or it does not parse: a
    parse error is reported when the policy is evaluated)."""
    try:
        tree = _parse(expression)
    except Exception:  # noqa: BLE001 - any parse failure: evaluation reports it through failurePolicy
        return ""
    lines = []
    for kind in kinds:
        roots = {root: kind.schema for root in _TYPED_ROOTS}
        roots.update(extra_roots)
        checker = _Checker(expression, roots, resolve)
        checker.walk(tree, {})
        if checker.errors:
            shown = "\n".join(_display(expression, offset, message) for offset, message in sorted(checker.errors))
            lines.append(f"{kind.gvk}: {shown}")
    return "\n".join(lines)


def type_checking(spec: Mapping[str, Any], kinds: list[CheckedKind], resolve: Callable[[Schema], Schema],
                  params_schema: Schema | None = None, namespace_schema: Schema | None = None) -> dict[str, Any]:
    """``status.typeChecking`` of a policy spec against ``kinds`` (``{}`` when nothing is found)."""
    extra: dict[str, Schema] = {}
    if params_schema is not None:
        extra["params"] = params_schema
    if namespace_schema is not None:
        extra["namespaceObject"] = namespace_schema
    warnings = []
    for i, validation in enumerate(spec.get("validations") or []):
        if not isinstance(validation, dict):
            continue
        for key in ("expression", "messageExpression"):
            text = validation.get(key)
            if not isinstance(text, str) or not text:
                continue
            warning = check_expression(text, kinds, extra, resolve) if kinds else ""
            if warning:
                warnings.append({"fieldRef": f"spec.validations[{i}].{key}", "warning": warning})
    return {"expressionWarnings": warnings} if warnings else {}


def definitions_resolver(definitions: Mapping[str, Any]) -> Callable[[Schema], Schema]:
    """A resolver of ``$ref`` (``#/$defs/<name>`` or ``#/definitions/<name>``) over ``definitions``;
    ``oneOf``/``allOf`` wrappers of one branch are looked through."""
    def resolve(schema: Schema) -> Schema:
        seen = 0
        while isinstance(schema, dict) and seen < 64:
            seen += 1
            if "$ref" in schema:
                schema = definitions.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
                continue
            branches = schema.get("allOf")
            if isinstance(branches, list) and len(branches) == 1 and "properties" not in schema:
                schema = branches[0]
                continue
            break
        return schema if isinstance(schema, dict) else {}
    return resolve
