"""ValidatingAdmissionPolicy type checking (``trainyard.apimachinery.admission_typecheck``), table
tests of the rules of the "Type checking" section of
https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/ (the
end-to-end ``status.typeChecking`` is tests/integration/apiserver/test_admission_policies.py)."""
from __future__ import annotations

import pytest

from trainyard.apimachinery import openapi_definitions
from trainyard.apimachinery.admission_typecheck import (MAX_TYPES, CheckedKind, definitions_resolver, gvk_string,
                                                        matched_resources, type_checking)

RESOLVE = definitions_resolver(openapi_definitions.load_definitions())
DEPLOYMENT = CheckedKind(gvk_string("apps", "v1", "Deployment"), openapi_definitions.definition("io.k8s.api.apps.v1.Deployment"))
CONFIGMAP = openapi_definitions.definition("io.k8s.api.core.v1.ConfigMap")
NAMESPACE = openapi_definitions.definition("io.k8s.api.core.v1.Namespace")


def warnings(*expressions: str, **schemas) -> list[tuple[str, str]]:
    spec = {"validations": [{"expression": e} for e in expressions]}
    found = type_checking(spec, [DEPLOYMENT], RESOLVE, **schemas).get("expressionWarnings", [])
    return [(w["fieldRef"], w["warning"]) for w in found]


def test_gvk_is_printed_as_go_does():
    """schema.GroupVersionKind.String(): the core group is empty before the slash."""
    assert gvk_string("", "v1", "Pod") == "/v1, Kind=Pod"
    assert gvk_string("apps", "v1", "Deployment") == "apps/v1, Kind=Deployment"


def test_no_wildcards_and_at_most_ten_types_in_group_version_resource_order():
    """"No wildcard matching"; "The number of matched types is limited to 10 ... In the order of
    ascending group, version, and then resource, 11th combination and beyond are ignored.\""""
    rules = {"resourceRules": [
        {"apiGroups": ["*"], "apiVersions": ["v1"], "resources": ["pods"]},
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["*"]},
        {"apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments", "deployments/status"]},
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": [f"r{i:02}" for i in range(12)]},
    ]}
    found = matched_resources(rules)
    assert len(found) == MAX_TYPES
    assert found == sorted(found) and found[0] == ("", "v1", "r00") and ("apps", "v1", "deployments") not in found


@pytest.mark.parametrize("expression,field", [
    ("object.replicas > 1", "replicas"),  # the documentation's example: <input>:1:7
    ("object.spec.replicas > 1 && object.spec.template.metadata.labelz == {}", "labelz"),
    ("has(object.status.readyReplica)", "readyReplica"),
    ("object.spec.template.spec.containers.exists(c, c.ports.all(p, p.containerPorts > 0))", "containerPorts"),
])
def test_an_undefined_field_is_reported_at_its_dot(expression, field):
    """cel-go's checker: "undefined field '<name>'" at the selection's "." (1-based column), the
    source line and a caret under that column; through list items, map values, has() and macro
    variables."""
    column = expression.index(f".{field}") + 1
    found = warnings(expression)
    assert found == [("spec.validations[0].expression",
                      f"apps/v1, Kind=Deployment: ERROR: <input>:1:{column}: undefined field '{field}'\n"
                      f" | {expression}\n | {'.' * (column - 1)}^")]
    if field == "replicas":
        assert column == 7


@pytest.mark.parametrize("expression", [
    "object.spec.replicas > 1",
    "object.metadata.labels.team == 'a'",  # a map: any key
    "object.metadata.annotations['x'] == 'y'",
    "variables.anything.at.all == 1 && request.whatever == 1",  # not typed here
    "object.spec.strategy.rollingUpdate.maxSurge == 1",  # int-or-string
    "'unparsable' +",  # a parse error is reported when evaluated, not here
])
def test_declared_fields_maps_and_untyped_roots_give_no_warning(expression):
    assert warnings(expression) == []


def test_params_and_namespace_object_are_typed_when_built_in():
    found = warnings("params.data.max == '1' && params.dat == {} && namespaceObject.metadata.lables == {}",
                     params_schema=CONFIGMAP, namespace_schema=NAMESPACE)
    assert len(found) == 1
    text = found[0][1]
    assert "undefined field 'dat'" in text and "undefined field 'lables'" in text and "'data'" not in text
    assert warnings("params.dat == {}") == []  # paramKind not built-in (or none): untyped


def test_the_line_and_column_of_a_multi_line_expression():
    expression = "object.spec.replicas > 1 &&\n  object.spec.pausd"
    assert warnings(expression) == [("spec.validations[0].expression",
                                     "apps/v1, Kind=Deployment: ERROR: <input>:2:14: undefined field 'pausd'\n"
                                     "  |   object.spec.pausd\n  | .............^".replace("  |", " |"))]
