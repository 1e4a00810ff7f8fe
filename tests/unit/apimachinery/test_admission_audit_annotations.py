"""ValidatingAdmissionPolicy ``auditAnnotations`` and the ``Audit`` action, table tests of the
pure evaluator (``trainyard.apimachinery.admission_policy.evaluate``).

Each row cites the Kubernetes text it encodes: the API reference of ``AuditAnnotation`` and of
``ValidatingAdmissionPolicyBindingSpec.validationActions`` (as generated in
kubernetes-client/python, kubernetes/docs/V1AuditAnnotation.md and
V1ValidatingAdmissionPolicyBindingSpec.md) and the "Validating Admission Policy" page
(https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/, "Audit
annotations"). The end-to-end path (the audit log of ``--audit-log-path``) is
tests/integration/apiserver/test_admission_policies.py.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from trainyard.apimachinery.admission_policy import (VALIDATION_FAILURE_ANNOTATION, Attributes, DocumentSource,
                                                     Outcome, evaluate)

RULES = {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["configmaps"]}]}


def policy(annotations: list[dict[str, str]], validations: list[dict[str, Any]] | None = None, *,
           name: str = "demo", failure_policy: str = "Fail", param_kind: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"matchConstraints": RULES, "failurePolicy": failure_policy,
                            "auditAnnotations": annotations, "validations": validations or []}
    if param_kind:
        spec["paramKind"] = {"apiVersion": "v1", "kind": "ConfigMap"}
    return {"metadata": {"name": name, "uid": f"{name}-{json.dumps(spec, sort_keys=True)}", "generation": 1},
            "spec": spec}


def binding(name: str, actions: list[str], policy_name: str = "demo", param: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"policyName": policy_name, "validationActions": actions}
    if param is not None:
        spec["paramRef"] = {"name": param, "namespace": "default", "parameterNotFoundAction": "Deny"}
    return {"metadata": {"name": name}, "spec": spec}


def run(policies: list[dict[str, Any]], bindings: list[dict[str, Any]], data: dict[str, str],
        params: list[dict[str, Any]] | None = None) -> Outcome:
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"}, "data": data}
    attrs = Attributes(operation="CREATE", group="", version="v1", resource="configmaps", kind="ConfigMap",
                       namespaced=True, name="cm", namespace="default", object=obj)
    return evaluate(policies, bindings, attrs, DocumentSource(params or [], frozenset()))


# "If the expression evaluates to a string, the audit annotation is included with the string
# value. If the expression evaluates to null or empty string the audit annotation will be
# omitted." The key is "{ValidatingAdmissionPolicy name}/{key}". (AuditAnnotation.valueExpression, .key)
@pytest.mark.parametrize("expression,published", [
    ("'high'", {"demo/level": "high"}),
    ("size(object.data) > 1 ? 'many' : null", {}),
    ("''", {}),
    ("null", {}),
])
def test_a_string_is_published_as_policy_slash_key_null_and_empty_are_omitted(expression, published):
    outcome = run([policy([{"key": "level", "valueExpression": expression}])], [binding("b", ["Deny"])], {"a": "1"})
    assert outcome.denial is None
    assert outcome.audit_annotations == published


def test_values_of_several_bindings_are_joined_distinct_in_a_comma_separated_list():
    """"If multiple ValidatingAdmissionPolicyBinding resources match an API request, then the
    valueExpression will be evaluated for each binding. All unique values produced by the
    valueExpressions will be joined together in a comma-separated list." (AuditAnnotation.valueExpression)"""
    params = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": "default"},
               "data": {"team": t}} for n, t in (("p1", "red"), ("p2", "blue"), ("p3", "red"))]
    outcome = run([policy([{"key": "team", "valueExpression": "params.data.team"}], param_kind=True)],
                  [binding(f"b{i}", ["Deny"], param=f"p{i}") for i in (1, 2, 3)], {}, params)
    assert outcome.audit_annotations == {"demo/team": "red, blue"}


def test_a_value_over_10kb_is_truncated_to_10kb():
    """"If the result of the valueExpression is more than 10kb in length, it will be truncated to
    10kb." (AuditAnnotation.valueExpression)"""
    outcome = run([policy([{"key": "long", "valueExpression": "object.data.long"}])], [binding("b", ["Deny"])],
                  {"long": "x" * 12000})
    assert outcome.audit_annotations == {"demo/long": "x" * 10240}


@pytest.mark.parametrize("expression,error", [
    ("size(object.data)", "valueExpression 'size(object.data)' resulted in unsupported return type: int. "
                          "Return type must be either string or null."),
    ("object.data.missing", "valueExpression 'object.data.missing' resulted in error: "),
])
@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_an_error_or_another_type_denies_under_fail_whatever_the_actions(expression, error, failure_policy):
    """"The expression must evaluate to either a string or null value" (AuditAnnotation.valueExpression);
    failurePolicy decides errors ("Failures can occur from CEL expression parse errors, type check
    errors, runtime errors", ValidatingAdmissionPolicySpec.failurePolicy): under Fail the request
    is refused even by a Warn-only binding, under Ignore the annotation is left out."""
    outcome = run([policy([{"key": "k", "valueExpression": expression}], failure_policy=failure_policy)],
                  [binding("b", ["Warn"])], {"a": "1"})
    assert outcome.audit_annotations == {}
    if failure_policy == "Ignore":
        assert outcome.denial is None
        return
    assert outcome.denial is not None and outcome.denial.code == 422
    assert outcome.denial.message.startswith(f"ValidatingAdmissionPolicy 'demo' with binding 'b' denied request: {error}")


def test_annotations_are_published_only_where_the_binding_applies():
    """matchConditions: "If ANY matchCondition evaluates to FALSE, the policy is skipped" - its
    audit annotations too (ValidatingAdmissionPolicySpec.matchConditions)."""
    skipped = policy([{"key": "k", "valueExpression": "'v'"}])
    skipped["spec"]["matchConditions"] = [{"name": "never", "expression": "false"}]
    assert run([skipped], [binding("b", ["Deny"])], {}).audit_annotations == {}


@pytest.mark.parametrize("actions,denied,warned", [
    (["Audit"], False, False),
    (["Deny", "Audit"], True, False),
    (["Warn", "Audit"], False, True),
    (["Deny"], True, False),
])
def test_the_audit_action_records_each_failure_as_json(actions, denied, warned):
    """validationActions "Audit": "the audit event will contain a
    `validation.policy.admission.k8s.io/validation_failure` audit annotation with a value
    containing the details of the validation failures, formatted as a JSON list of objects, each
    with ... message, policy, binding, expressionIndex (the index of the failed validations in the
    ValidatingAdmissionPolicy), validationActions (the enforcement actions enacted)"; Deny and
    Warn act as before (ValidatingAdmissionPolicyBindingSpec.validationActions)."""
    validations = [{"expression": "true"}, {"expression": "size(object.data) == 0", "message": "no data please"}]
    outcome = run([policy([], validations)], [binding("b", actions)], {"a": "1"})
    assert (outcome.denial is not None) == denied
    assert bool(outcome.warnings) == warned
    if "Audit" not in actions:
        assert VALIDATION_FAILURE_ANNOTATION not in outcome.audit_annotations
        return
    assert json.loads(outcome.audit_annotations[VALIDATION_FAILURE_ANNOTATION]) == [
        {"message": "no data please", "policy": "demo", "binding": "b", "expressionIndex": 1,
         "validationActions": actions}]
