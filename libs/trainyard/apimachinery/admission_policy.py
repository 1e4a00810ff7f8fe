"""ValidatingAdmissionPolicy (``admissionregistration.k8s.io/v1``) evaluation, pure.

Given the stored policies and bindings, one admission request (``Attributes``) and a
``ParamSource`` that reads namespaces and parameter objects, ``evaluate`` answers an
``Outcome``: the denial to return (HTTP code, reason, message as kube-apiserver words it) or
none, and the warnings to send. Kubernetes' rules, from the API reference and the
"Validating Admission Policy" documentation:

- a policy applies when its ``matchConstraints`` match (``resourceRules`` with operations,
  groups, versions, resources incl. ``x/sub``, ``*``, ``*/sub``, ``*/*``, resourceNames and
  scope; ``namespaceSelector``; ``objectSelector`` on the new or the old object;
  ``excludeResourceRules``; ``matchPolicy`` Equivalent also matches the same resource requested
  at another served version) and, per binding naming it, the binding's ``matchResources`` (when
  set) match too - unset ``resourceRules`` there do not constrain, so a binding with only a
  ``namespaceSelector`` applies the policy in the namespaces it selects;
- parameters: ``paramKind`` with the binding's ``paramRef`` by ``name`` (in ``namespace``, or in
  the request's namespace for a namespaced kind when unset) or by ``selector`` (every match is
  evaluated); none found: ``parameterNotFoundAction`` Allow skips the binding, Deny (default)
  fails it;
- ``matchConditions`` must all be true (one false: the binding does not apply, even if another
  errs; an error otherwise goes through ``failurePolicy``);
- ``variables`` are evaluated lazily, on first read, once per evaluation;
- each of ``validations`` must be true; a false one is a failure with ``reason`` (default
  Invalid → 422; Forbidden 403, Unauthorized 401, RequestEntityTooLarge 413) and
  ``messageExpression`` / ``message`` / ``failed expression: <expr>``; an expression error is
  a failure unless ``failurePolicy`` is Ignore;
- a failure is acted on per the binding's ``validationActions``: Deny refuses the request,
  Warn adds a ``Validation failed for ...`` warning, Audit adds the failure to the request's
  ``validation.policy.admission.k8s.io/validation_failure`` audit annotation (a JSON list of
  ``{message, policy, binding, expressionIndex, validationActions}``);
- ``auditAnnotations`` are evaluated for every binding that applies (matchConditions true):
  a non-empty string is published as the audit annotation ``<policy>/<key>`` (values of
  several bindings: the distinct ones joined with ``", "``; over 10 KiB truncated), null or
  ``""`` publishes nothing; an error or another type refuses the request when
  ``failurePolicy`` is Fail (whatever the ``validationActions``), and is skipped when Ignore;
- configuration errors (parameters not found with Deny, an unknown paramKind) refuse the
  request unless ``failurePolicy`` is Ignore.

The CEL environment has ``object``, ``oldObject``, ``request``, ``params``,
``namespaceObject`` and ``variables`` (no ``authorizer``), with the Kubernetes libraries of
``cel_library``. Every expression goes through the one evaluator, ``trainyard.apimachinery.cel``;
a policy's expressions are compiled once per policy uid and generation.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from trainyard.apimachinery.cel import CelError, CompiledExpression, as_bool, cel_value, compile_expression, lazy_map
from trainyard.apimachinery.errors import SelectorError
from trainyard.apimachinery.selectors import label_selector_from_struct

REASON_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413, "Invalid": 422}
PARAMS_NOT_FOUND = "no params found for policy binding with `Deny` parameterNotFoundAction"


@dataclass
class Attributes:
    """One admission request, as the policy sees it."""

    operation: str  # CREATE, UPDATE, DELETE, CONNECT
    group: str
    version: str
    resource: str
    kind: str  # kind of ``object`` (``Scale`` for a scale request)
    namespaced: bool
    name: str = ""
    namespace: str = ""
    subresource: str = ""
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    user_info: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    options: dict[str, Any] | None = None
    uid: str = ""
    kind_group: str | None = None  # group/version of ``object`` when it differs (autoscaling/v1 Scale)
    kind_version: str | None = None
    served_versions: tuple[str, ...] = ()  # other versions the same resource is served at (matchPolicy)

    def request(self) -> dict[str, Any]:
        kind = {"group": self.group if self.kind_group is None else self.kind_group,
                "version": self.version if self.kind_version is None else self.kind_version, "kind": self.kind}
        resource = {"group": self.group, "version": self.version, "resource": self.resource}
        out: dict[str, Any] = {
            "uid": self.uid, "kind": kind, "resource": resource, "requestKind": kind,
            "requestResource": resource, "name": self.name, "operation": self.operation,
            "userInfo": self.user_info, "dryRun": self.dry_run,
            # kube-apiserver's request is typed: unset strings read as "", never as absent
            "subResource": self.subresource, "requestSubResource": self.subresource,
            "namespace": self.namespace if self.namespaced else "",
        }
        if self.options is not None:
            out["options"] = self.options
        return out


class ParamSource(Protocol):
    """What evaluation reads besides the request: namespaces and parameter objects."""

    def namespace(self, name: str) -> dict[str, Any] | None: ...

    def param_kind_scope(self, api_version: str, kind: str) -> bool | None:
        """True: namespaced; False: cluster-scoped; None: no such kind is served."""

    def get_param(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...

    def list_params(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]: ...


@dataclass
class Denial:
    code: int
    reason: str
    message: str  # ``ValidatingAdmissionPolicy 'p' with binding 'b' denied request: ...``
    policy: str
    binding: str


@dataclass
class Outcome:
    denial: Denial | None = None
    warnings: list[str] = field(default_factory=list)
    # the request's audit annotations (key -> value), as kube-apiserver adds them to its audit event
    audit_annotations: dict[str, str] = field(default_factory=dict)


VALIDATION_FAILURE_ANNOTATION = "validation.policy.admission.k8s.io/validation_failure"
MAX_AUDIT_VALUE = 10 * 1024  # "more than 10kb in length, it will be truncated to 10kb"


# --- matching -----------------------------------------------------------------------------

def _listed(values: list[str] | None, wanted: str) -> bool:
    return "*" in (values or []) or wanted in (values or [])


def _resource_listed(patterns: list[str] | None, resource: str, subresource: str) -> bool:
    full = f"{resource}/{subresource}" if subresource else resource
    for pattern in patterns or []:
        if pattern in ("*/*", full):
            return True
        if pattern == "*" and not subresource:
            return True
        if "/" in pattern and subresource:
            res, sub = pattern.split("/", 1)
            if (res == "*" and sub == subresource) or (res == resource and sub == "*"):
                return True
    return False


def request_matches_rule(rule: Mapping[str, Any], operation: str, group: str, version: str, resource: str,
                         subresource: str, namespaced: bool, name: str = "") -> bool:
    """One RuleWithOperations (of a webhook) or NamedRuleWithOperations (of a policy) against
    a request: operations, API groups and versions, resources (``x``, ``x/sub``, ``*`` for
    every main resource, ``*/sub``, ``x/*``, ``*/*``), scope and resourceNames."""
    if not _listed(rule.get("operations"), operation):
        return False
    if not _listed(rule.get("apiGroups"), group):
        return False
    if not _listed(rule.get("apiVersions"), version):
        return False
    if not _resource_listed(rule.get("resources"), resource, subresource):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and namespaced) or (scope == "Namespaced" and not namespaced):
        return False
    names = rule.get("resourceNames")
    return not names or name in names


def rule_matches(rule: Mapping[str, Any], attrs: Attributes, version: str | None = None) -> bool:
    """One NamedRuleWithOperations against the request (``version``: matchPolicy Equivalent)."""
    return request_matches_rule(rule, attrs.operation, attrs.group, version or attrs.version, attrs.resource,
                                attrs.subresource, attrs.namespaced, attrs.name)


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _selector_matches(selector: Mapping[str, Any] | None, labels: dict[str, str]) -> bool:
    if not selector:
        return True
    return label_selector_from_struct(selector).matches(labels)


def _rules_match(rules: list[Mapping[str, Any]], match_policy: str, attrs: Attributes) -> bool:
    """Any of ``rules`` matches the request, at its version or (``matchPolicy`` Equivalent) at
    another served version of the same resource."""
    if any(rule_matches(rule, attrs) for rule in rules):
        return True
    if match_policy == "Equivalent":
        return any(rule_matches(rule, attrs, version) for rule in rules
                   for version in attrs.served_versions if version != attrs.version)
    return False


def resources_match(match: Mapping[str, Any] | None, attrs: Attributes, source: ParamSource) -> bool:
    """``matchConstraints`` / a binding's ``matchResources`` against the request, in
    kube-apiserver's order: ``namespaceSelector`` (ignored for cluster-scoped kinds other than
    Namespace; a Namespace is matched by its own labels), ``objectSelector`` (the new or the old
    object), ``excludeResourceRules`` (they win), then ``resourceRules`` - where unset rules do
    not constrain: every resource the other fields select matches (a binding's matchResources
    with only a namespaceSelector; a policy's matchConstraints always has rules, its
    validation requires them).

    Raises ``SelectorError`` for a selector that does not parse (a configuration error)."""
    if not match:
        return False
    is_namespace = attrs.group == "" and attrs.resource == "namespaces"
    if attrs.namespaced or is_namespace:
        if is_namespace:
            ns_labels = _labels(attrs.object or attrs.old_object)
        else:
            ns_labels = _labels(source.namespace(attrs.namespace))
        if not _selector_matches(match.get("namespaceSelector"), ns_labels):
            return False
    selector = match.get("objectSelector")
    if selector and not (_selector_matches(selector, _labels(attrs.object))
                         or (attrs.old_object is not None and _selector_matches(selector, _labels(attrs.old_object)))):
        return False
    match_policy = match.get("matchPolicy") or "Equivalent"
    if _rules_match(match.get("excludeResourceRules") or [], match_policy, attrs):
        return False
    rules = match.get("resourceRules") or []
    return not rules or _rules_match(rules, match_policy, attrs)


# --- compilation (once per policy uid and generation) --------------------------------------

@dataclass(frozen=True)
class CompiledPolicy:
    match_conditions: tuple[tuple[str, CompiledExpression], ...]
    variables: tuple[tuple[str, CompiledExpression], ...]
    validations: tuple[tuple[dict[str, Any], CompiledExpression, CompiledExpression | None], ...]
    audit_annotations: tuple[tuple[str, CompiledExpression], ...] = ()


_COMPILED: dict[tuple[str, int], CompiledPolicy] = {}


def compiled(policy: Mapping[str, Any]) -> CompiledPolicy:
    meta = policy.get("metadata") or {}
    key = (str(meta.get("uid") or meta.get("name")), int(meta.get("generation") or 0))
    found = _COMPILED.get(key)
    if found is not None:
        return found
    spec = policy.get("spec") or {}
    result = CompiledPolicy(
        tuple((str(c.get("name", "")), compile_expression(str(c.get("expression", ""))))
              for c in spec.get("matchConditions") or []),
        tuple((str(v.get("name", "")), compile_expression(str(v.get("expression", ""))))
              for v in spec.get("variables") or []),
        tuple((v, compile_expression(str(v.get("expression", ""))),
               compile_expression(str(v["messageExpression"])) if v.get("messageExpression") else None)
              for v in spec.get("validations") or []),
        tuple((str(a.get("key", "")), compile_expression(str(a.get("valueExpression", ""))))
              for a in spec.get("auditAnnotations") or [] if isinstance(a, dict)),
    )
    if len(_COMPILED) >= 1024:
        _COMPILED.clear()
    _COMPILED[key] = result
    return result


# --- evaluation ---------------------------------------------------------------------------

@dataclass
class _Failure:
    message: str
    reason: str = "Invalid"
    config: bool = False  # a configuration error: refuses whatever the validationActions
    index: int = 0  # the failed validation's index (expressionIndex of the Audit annotation)


@dataclass
class _Result:
    """One (policy, binding, param) evaluation: its failures, and its audit annotation values
    (key -> value) when it applied."""

    failures: list[_Failure] = field(default_factory=list)
    annotations: list[tuple[str, str]] = field(default_factory=list)
    annotation_errors: list[_Failure] = field(default_factory=list)  # refuse under failurePolicy Fail


def _error_message(expression: str, err: CelError) -> str:
    text = str(err)
    if text.startswith("compilation failed"):
        return f"compilation error: {text}"
    return f"expression '{expression}' resulted in error: {text}"


class _Inputs:
    """The CEL values of one request, converted from JSON once however many policies,
    bindings and parameter objects read them (CEL never changes a value)."""

    def __init__(self, attrs: Attributes, namespace_object: dict[str, Any] | None) -> None:
        self.attrs = attrs
        self.namespace_object = namespace_object
        self._base: dict[str, Any] | None = None
        self._params: dict[int, tuple[Any, Any]] = {}

    def activation(self, params: dict[str, Any] | None, policy: CompiledPolicy) -> dict[str, Any]:
        if self._base is None:
            self._base = {"object": cel_value(self.attrs.object), "oldObject": cel_value(self.attrs.old_object),
                          "request": cel_value(self.attrs.request()),
                          "namespaceObject": cel_value(self.namespace_object)}
        converted = self._params.get(id(params))
        if converted is None:
            converted = self._params[id(params)] = (params, cel_value(params))  # keeps params alive: ids stay unique
        activation = dict(self._base)
        activation["params"] = converted[1]
        expressions = dict(policy.variables)

        def resolve(name: str) -> Any:
            return expressions[name].evaluate(activation)

        activation["variables"] = lazy_map(resolve, [name for name, _ in policy.variables])
        return activation


def _message(validation: Mapping[str, Any], message_expression: CompiledExpression | None,
             activation: dict[str, Any]) -> str:
    if message_expression is not None:
        try:
            value = message_expression.evaluate(activation)
        except CelError:
            value = None
        if isinstance(value, str) and value.strip() and "\n" not in value:
            return value.strip()
    if str(validation.get("message") or "").strip():
        return str(validation["message"]).strip()
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def _validate(policy: CompiledPolicy, inputs: _Inputs, params: dict[str, Any] | None,
              fail_open: bool) -> _Result:
    """The failures and audit annotations of one (policy, binding, param): no failures when it
    passes or does not apply."""
    activation = inputs.activation(params, policy)
    errors: list[str] = []
    for _, condition in policy.match_conditions:
        try:
            verdict = as_bool(condition.evaluate(activation))
        except CelError as err:
            errors.append(_error_message(condition.expression, err))
            continue
        if verdict is None:
            errors.append(f"expression '{condition.expression}' resulted in error: "
                          "matchCondition must evaluate to bool")
        elif not verdict:
            return _Result()  # one false condition: the policy does not apply to this request
    if errors:
        return _Result() if fail_open else _Result([_Failure("; ".join(errors))])
    failures = []
    for index, (validation, expression, message_expression) in enumerate(policy.validations):
        try:
            verdict = expression.evaluate(activation)
        except CelError as err:
            if not fail_open:
                failures.append(_Failure(_error_message(expression.expression, err), index=index))
            continue
        passed = as_bool(verdict)
        if passed is None:
            if not fail_open:
                failures.append(_Failure(f"expression '{expression.expression}' resulted in error: "
                                         "validation expression must evaluate to bool", index=index))
            continue
        if passed:
            continue
        failures.append(_Failure(_message(validation, message_expression, activation),
                                 str(validation.get("reason") or "Invalid"), index=index))
    result = _Result(failures)
    _annotate(policy, activation, fail_open, result)
    return result


def _annotate(policy: CompiledPolicy, activation: dict[str, Any], fail_open: bool, result: _Result) -> None:
    """The policy's ``auditAnnotations`` for a binding that applies: a non-empty string is
    published, null or ``""`` is omitted; an error or another type is a failure unless
    ``failurePolicy`` is Ignore."""
    for key, expression in policy.audit_annotations:
        try:
            value = expression.evaluate(activation)
        except CelError as err:
            if not fail_open:
                result.annotation_errors.append(_Failure(
                    f"valueExpression '{expression.expression}' resulted in error: {err}"))
            continue
        if value is None or (isinstance(value, str) and not value):
            continue
        if not isinstance(value, str):
            if not fail_open:
                result.annotation_errors.append(_Failure(
                    f"valueExpression '{expression.expression}' resulted in unsupported return type: "
                    f"{_cel_type_name(value)}. Return type must be either string or null."))
            continue
        result.annotations.append((key, str(value)[:MAX_AUDIT_VALUE]))


def _cel_type_name(value: Any) -> str:
    """The CEL type name of a value, as an error names it (``int``, ``bool``, ``map``...)."""
    name = type(value).__name__.lower()
    for cel_name in ("bool", "uint", "int", "double", "bytes", "list", "map", "timestamp", "duration"):
        if cel_name in name:
            return cel_name
    return name


def _params(policy: Mapping[str, Any], binding: Mapping[str, Any], attrs: Attributes,
            source: ParamSource) -> tuple[list[dict[str, Any] | None], _Failure | None]:
    """The parameter objects to evaluate with ([None] without paramKind), or a failure."""
    param_kind = (policy.get("spec") or {}).get("paramKind")
    if not param_kind:
        return [None], None
    api_version, kind = str(param_kind.get("apiVersion", "")), str(param_kind.get("kind", ""))
    ref = (binding.get("spec") or {}).get("paramRef")
    if not ref:
        return [], _Failure(f"failed to configure binding: paramRef is required when paramKind {api_version}, "
                            f"Kind={kind} is set", config=True)
    namespaced = source.param_kind_scope(api_version, kind)
    if namespaced is None:
        return [], _Failure(f"failed to configure policy: failed to find resource referenced by paramKind: "
                            f"'{api_version}, Kind={kind}'", config=True)
    namespace = ""
    if namespaced:
        namespace = ref.get("namespace") or attrs.namespace
        if not namespace:
            return [], _Failure("failed to configure binding: cannot use namespaced paramRef in policy binding "
                                "that matches cluster-scoped resources", config=True)
    if ref.get("name"):
        found = source.get_param(api_version, kind, namespace, str(ref["name"]))
        params = [found] if found is not None else []
    else:
        try:
            selector = label_selector_from_struct(ref.get("selector") or {}, "paramRef.selector")
        except SelectorError as err:
            return [], _Failure(f"failed to configure binding: {err}", config=True)
        params = [p for p in source.list_params(api_version, kind, namespace) if selector.matches(_labels(p))]
    if not params:
        if (ref.get("parameterNotFoundAction") or "Deny") == "Deny":
            return [], _Failure(f"failed to configure binding: {PARAMS_NOT_FOUND}", config=True)
        return [], None
    return list(params), None


def evaluate(policies: list[dict[str, Any]], bindings: list[dict[str, Any]], attrs: Attributes,
             source: ParamSource) -> Outcome:
    """Evaluate every (policy, binding) pair that matches the request.

    Pairs run in policy-name then binding-name order; the first denial is the answer (as
    kube-apiserver, which answers the first denied decision), warnings of all pairs are kept."""
    outcome = Outcome()
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for binding in sorted(bindings, key=lambda b: (b.get("metadata") or {}).get("name", "")):
        by_policy.setdefault(str((binding.get("spec") or {}).get("policyName", "")), []).append(binding)
    namespace_object = source.namespace(attrs.namespace) if attrs.namespaced and attrs.namespace else None
    inputs = _Inputs(attrs, namespace_object)
    annotations: dict[str, list[str]] = {}  # "<policy>/<key>" -> distinct values, in order
    audited: list[dict[str, Any]] = []  # failures of bindings with the Audit action
    for policy in sorted(policies, key=lambda p: (p.get("metadata") or {}).get("name", "")):
        name = str((policy.get("metadata") or {}).get("name", ""))
        spec = policy.get("spec") or {}
        fail_open = spec.get("failurePolicy") == "Ignore"
        its_bindings = by_policy.get(name, [])
        if not its_bindings:
            continue
        try:
            if not resources_match(spec.get("matchConstraints"), attrs, source):
                continue
        except SelectorError as err:
            if not fail_open:
                _deny(outcome, name, None, _Failure(f"failed to configure policy: {err}", config=True))
            continue
        program = compiled(policy)
        for binding in its_bindings:
            binding_name = str((binding.get("metadata") or {}).get("name", ""))
            bspec = binding.get("spec") or {}
            try:
                if bspec.get("matchResources") and not resources_match(bspec["matchResources"], attrs, source):
                    continue
            except SelectorError as err:
                if not fail_open:
                    _deny(outcome, name, binding_name, _Failure(f"failed to configure binding: {err}", config=True))
                continue
            params, problem = _params(policy, binding, attrs, source)
            failures: list[_Failure] = []
            if problem is not None:
                if not fail_open:
                    failures.append(problem)
            for param in params:
                result = _validate(program, inputs, param, fail_open)
                failures += result.failures
                for key, value in result.annotations:
                    published = annotations.setdefault(f"{name}/{key}", [])
                    if value not in published:
                        published.append(value)
                for error in result.annotation_errors:  # failurePolicy Fail: refuses, whatever the actions
                    _deny(outcome, name, binding_name, error)
            listed = list(bspec.get("validationActions") or [])
            actions = set(listed)
            for failure in failures:
                if failure.config or "Deny" in actions:
                    _deny(outcome, name, binding_name, failure)
                if "Warn" in actions and not failure.config:
                    outcome.warnings.append(f"Validation failed for ValidatingAdmissionPolicy '{name}' with binding "
                                            f"'{binding_name}': {failure.message}")
                if "Audit" in actions and not failure.config:
                    audited.append({"message": failure.message, "policy": name, "binding": binding_name,
                                    "expressionIndex": failure.index, "validationActions": listed})
    outcome.audit_annotations = {key: ", ".join(values) for key, values in annotations.items()}
    if audited:
        outcome.audit_annotations[VALIDATION_FAILURE_ANNOTATION] = json.dumps(audited, separators=(",", ":"))
    return outcome


def _deny(outcome: Outcome, policy: str, binding: str | None, failure: _Failure) -> None:
    if outcome.denial is not None:
        return
    if binding is not None:
        message = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {failure.message}"
    else:
        message = f"ValidatingAdmissionPolicy '{policy}' denied request: {failure.message}"
    reason = failure.reason if failure.reason in REASON_CODES else "Invalid"
    outcome.denial = Denial(REASON_CODES[reason], reason, message, policy, binding or "")


# --- defaults and validation of the stored objects ----------------------------------------

_FAILURE_POLICIES = ("Fail", "Ignore")
_MATCH_POLICIES = ("Equivalent", "Exact")
_ACTIONS = ("Audit", "Deny", "Warn")
_NOT_FOUND_ACTIONS = ("Allow", "Deny")
_OPERATIONS = ("*", "CONNECT", "CREATE", "DELETE", "UPDATE")
_SCOPES = ("*", "Cluster", "Namespaced")
_CEL_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CEL_RESERVED = frozenset({"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
                           "function", "if", "import", "let", "loop", "package", "namespace", "return", "var",
                           "void", "while"})


def _default_match(match: Any) -> None:
    if not isinstance(match, dict):
        return
    match.setdefault("matchPolicy", "Equivalent")
    match.setdefault("namespaceSelector", {})
    match.setdefault("objectSelector", {})
    for key in ("resourceRules", "excludeResourceRules"):
        for rule in match.get(key) or []:
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def set_defaults(kind: str, obj: dict[str, Any]) -> None:
    """kube-apiserver's v1 defaults: failurePolicy Fail; matchPolicy Equivalent, empty namespace
    and object selectors, rule scope ``*``; a paramRef's parameterNotFoundAction Deny."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    if kind == "ValidatingAdmissionPolicy":
        spec.setdefault("failurePolicy", "Fail")
        _default_match(spec.get("matchConstraints"))
    elif kind == "ValidatingAdmissionPolicyBinding":
        _default_match(spec.get("matchResources"))
        if isinstance(spec.get("paramRef"), dict):
            spec["paramRef"].setdefault("parameterNotFoundAction", "Deny")


def _cause(field_path: str, reason: str, message: str) -> dict[str, str]:
    return {"reason": reason, "field": field_path, "message": message}


def _required(field_path: str, detail: str = "") -> dict[str, str]:
    return _cause(field_path, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def _unsupported(field_path: str, value: Any, supported: tuple[str, ...]) -> dict[str, str]:
    listed = ", ".join(f'"{s}"' for s in supported)
    return _cause(field_path, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {listed}')


def _items(value: Any) -> list[dict[str, Any]]:
    """A list field's items, a null item read as an empty object (as Go decodes it)."""
    return [item if isinstance(item, dict) else {} for item in value] if isinstance(value, list) else []


def _rule_causes(rules: Any, where: str) -> list[dict[str, str]]:
    causes = []
    for i, rule in enumerate(_items(rules)):
        at = f"{where}[{i}]"
        for j, op in enumerate(rule.get("operations") or []):
            if op not in _OPERATIONS:
                causes.append(_unsupported(f"{at}.operations[{j}]", op, _OPERATIONS))
        if rule.get("scope") not in (None, *_SCOPES):
            causes.append(_unsupported(f"{at}.scope", rule["scope"], _SCOPES))
        if not rule.get("resources"):
            causes.append(_required(f"{at}.resources"))
    return causes


def _match_causes(match: dict[str, Any], where: str) -> list[dict[str, str]]:
    causes = []
    if match.get("matchPolicy") not in (None, *_MATCH_POLICIES):
        causes.append(_unsupported(f"{where}.matchPolicy", match["matchPolicy"], _MATCH_POLICIES))
    for key in ("namespaceSelector", "objectSelector"):
        if match.get(key):
            try:
                label_selector_from_struct(match[key], f"{where}.{key}")
            except SelectorError as err:
                causes.append(_cause(f"{where}.{key}", "FieldValueInvalid", f"Invalid value: {err}"))
    causes += _rule_causes(match.get("resourceRules"), f"{where}.resourceRules")
    causes += _rule_causes(match.get("excludeResourceRules"), f"{where}.excludeResourceRules")
    return causes


def spec_causes(kind: str, obj: dict[str, Any]) -> list[dict[str, str]]:
    """The cross-field rules kube-apiserver checks on a policy or binding, as field causes
    (the types and required fields are checked against the definitions before this)."""
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    if kind == "ValidatingAdmissionPolicyBinding":
        return _binding_causes(spec)
    causes = []
    if spec.get("failurePolicy") not in (None, *_FAILURE_POLICIES):
        causes.append(_unsupported("spec.failurePolicy", spec["failurePolicy"], _FAILURE_POLICIES))
    param_kind = spec.get("paramKind")
    if isinstance(param_kind, dict):
        for key in ("apiVersion", "kind"):
            if not param_kind.get(key):
                causes.append(_required(f"spec.paramKind.{key}"))
    match = spec.get("matchConstraints")
    if not isinstance(match, dict):
        causes.append(_required("spec.matchConstraints"))
    else:
        causes += _match_causes(match, "spec.matchConstraints")
        if not match.get("resourceRules"):
            causes.append(_required("spec.matchConstraints.resourceRules"))
    seen: set[str] = set()
    for i, condition in enumerate(_items(spec.get("matchConditions"))):
        at = f"spec.matchConditions[{i}]"
        if not str(condition.get("expression") or "").strip():
            causes.append(_required(f"{at}.expression"))
        name = str(condition.get("name") or "")
        if not name:
            causes.append(_required(f"{at}.name"))
        elif name in seen:
            causes.append(_cause(f"{at}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        seen.add(name)
    for i, variable in enumerate(_items(spec.get("variables"))):
        at = f"spec.variables[{i}]"
        name = str(variable.get("name") or "")
        if not name.strip():
            causes.append(_required(f"{at}.name", "name is not specified"))
        elif not _CEL_IDENTIFIER.match(name) or name in _CEL_RESERVED:
            causes.append(_cause(f"{at}.name", "FieldValueInvalid",
                                 f'Invalid value: "{name}": name is not a valid CEL identifier'))
        if not str(variable.get("expression") or "").strip():
            causes.append(_required(f"{at}.expression", "expression is not specified"))
    keys: set[str] = set()
    for i, annotation in enumerate(_items(spec.get("auditAnnotations"))):
        at = f"spec.auditAnnotations[{i}]"
        key = str(annotation.get("key") or "")
        if not key:
            causes.append(_required(f"{at}.key"))
        elif key in keys:
            causes.append(_cause(f"{at}.key", "FieldValueDuplicate", f'Duplicate value: "{key}"'))
        keys.add(key)
        if not str(annotation.get("valueExpression") or "").strip():
            causes.append(_required(f"{at}.valueExpression", "valueExpression is not specified"))
    validations = _items(spec.get("validations"))
    if not validations and not spec.get("auditAnnotations"):
        detail = "validations or auditAnnotations must contain at least one item"
        causes += [_required("spec.validations", detail), _required("spec.auditAnnotations", detail)]
    for i, validation in enumerate(validations):
        at = f"spec.validations[{i}]"
        if not str(validation.get("expression") or "").strip():
            causes.append(_required(f"{at}.expression", "expression is not specified"))
        message = validation.get("message")
        if isinstance(message, str) and message and not message.strip():
            causes.append(_cause(f"{at}.message", "FieldValueInvalid",
                                 f"Invalid value: {json.dumps(message)}: message must be non-empty if specified"))
        elif isinstance(message, str) and "\n" in message.strip():
            causes.append(_cause(f"{at}.message", "FieldValueInvalid",
                                 f"Invalid value: {json.dumps(message)}: message must not contain line breaks"))
        if validation.get("reason") is not None and validation["reason"] not in REASON_CODES:
            causes.append(_unsupported(f"{at}.reason", validation["reason"], tuple(sorted(REASON_CODES))))
    return causes


def _binding_causes(spec: dict[str, Any]) -> list[dict[str, str]]:
    causes = []
    if not spec.get("policyName"):
        causes.append(_required("spec.policyName"))
    actions = spec.get("validationActions") or []
    seen: set[str] = set()
    for i, action in enumerate(actions):
        if action not in _ACTIONS:
            causes.append(_unsupported(f"spec.validationActions[{i}]", action, _ACTIONS))
        if action in seen:
            causes.append(_cause(f"spec.validationActions[{i}]", "FieldValueDuplicate", f'Duplicate value: "{action}"'))
        seen.add(action)
    if {"Deny", "Warn"} <= seen:
        causes.append(_cause("spec.validationActions", "FieldValueInvalid",
                             f"Invalid value: {json.dumps(actions)}: must not contain both Deny and Warn (repeating "
                             "the same validation failure information in the API response and headers serves no "
                             "purpose)"))
    if not seen:
        causes.append(_required("spec.validationActions", "at least one validation action is required"))
    ref = spec.get("paramRef")
    if isinstance(ref, dict):
        if not ref.get("name") and ref.get("selector") is None:
            causes.append(_required("spec.paramRef", "one of name or selector must be specified"))
        if ref.get("name") and ref.get("selector") is not None:
            causes.append(_cause("spec.paramRef.name", "FieldValueForbidden",
                                 "Forbidden: name and selector are mutually exclusive"))
        action = ref.get("parameterNotFoundAction")
        if action is not None and action not in _NOT_FOUND_ACTIONS:
            causes.append(_unsupported("spec.paramRef.parameterNotFoundAction", action, _NOT_FOUND_ACTIONS))
    if isinstance(spec.get("matchResources"), dict):
        causes += _match_causes(spec["matchResources"], "spec.matchResources")
    return causes


# --- offline: policies found among documents (trainyard validate) --------------------------

POLICY_API_VERSION = "admissionregistration.k8s.io/v1"


class DocumentSource:
    """A ``ParamSource`` over a list of objects: the files ``trainyard validate`` reads stand
    for the cluster (namespaces, parameter objects). A kind is cluster-scoped when named in
    ``cluster_scoped_kinds``."""

    def __init__(self, objects: list[dict[str, Any]], cluster_scoped_kinds: set[str] | frozenset[str]) -> None:
        self.objects = objects
        self.cluster_scoped = cluster_scoped_kinds

    def _of(self, api_version: str, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o.get("apiVersion") == api_version and o.get("kind") == kind]

    def namespace(self, name: str) -> dict[str, Any] | None:
        return next((o for o in self._of("v1", "Namespace") if (o.get("metadata") or {}).get("name") == name), None)

    def param_kind_scope(self, api_version: str, kind: str) -> bool | None:
        return kind not in self.cluster_scoped

    def list_params(self, api_version: str, kind: str, namespace: str) -> list[dict[str, Any]]:
        found = self._of(api_version, kind)
        if kind in self.cluster_scoped:
            return found
        return [o for o in found if (o.get("metadata") or {}).get("namespace", "") == namespace]

    def get_param(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return next((o for o in self.list_params(api_version, kind, namespace)
                     if (o.get("metadata") or {}).get("name") == name), None)


def policies_among(objects: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The ValidatingAdmissionPolicies and bindings among ``objects``, with the defaults
    kube-apiserver gives them; ``ValueError`` naming the object for one it would refuse."""
    import copy
    found: dict[str, list[dict[str, Any]]] = {"ValidatingAdmissionPolicy": [], "ValidatingAdmissionPolicyBinding": []}
    for obj in objects:
        kind = obj.get("kind")
        if obj.get("apiVersion") != POLICY_API_VERSION or kind not in found:
            continue
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        meta.pop("namespace", None)  # cluster-scoped
        meta.setdefault("uid", f"{kind}/{meta.get('name', '')}")
        meta.setdefault("generation", 1)
        try:
            set_defaults(str(kind), obj)
            causes = spec_causes(str(kind), obj)
        except (AttributeError, TypeError, KeyError) as err:  # a shape the definitions would refuse
            raise ValueError(f'{kind}.admissionregistration.k8s.io "{meta.get("name", "")}" is invalid: '
                             f"spec: not a {kind} spec ({type(err).__name__}: {err})") from None
        if causes:
            first = causes[0]
            raise ValueError(f'{kind}.admissionregistration.k8s.io "{meta.get("name", "")}" is invalid: '
                             f'{first["field"]}: {first["message"]}')
        found[str(kind)].append(obj)
    return found["ValidatingAdmissionPolicy"], found["ValidatingAdmissionPolicyBinding"]
