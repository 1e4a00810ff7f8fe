"""ValidatingAdmissionPolicy in devcluster, table tests from the Kubernetes documentation's rules.

One devcluster for the module; each case installs its policies and bindings (and parameter
ConfigMaps), makes one request over HTTP and checks what a client sees: the status code,
reason and message kube-apiserver would answer, the ``Warning`` header, or the write stored.
Policies and bindings are removed after every case.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.fixtures.devcluster import Devcluster, api_workers_args, start_devcluster

ADM = "/apis/admissionregistration.k8s.io/v1"
POLICIES = f"{ADM}/validatingadmissionpolicies"
BINDINGS = f"{ADM}/validatingadmissionpolicybindings"
NS = "/api/v1/namespaces"


@pytest.fixture(scope="module")
def devcluster_module(tmp_path_factory: pytest.TempPathFactory, api_workers: int) -> Iterator[Devcluster]:
    """The module's one devcluster, with an audit log (kube-apiserver's ``--audit-log-path``)."""
    base = tmp_path_factory.mktemp("devcluster")
    cluster = start_devcluster(base / "data", ["--audit-log-path", str(base / "audit.log"),
                                               *api_workers_args(api_workers)])
    try:
        yield cluster
    finally:
        cluster.stop()


def last_audit_event(cluster: Devcluster) -> dict[str, Any]:
    """The audit event of the last request answered (written before its answer is sent)."""
    lines = (Path(cluster.data_dir).parent / "audit.log").read_text().splitlines()
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def client(devcluster_module) -> Iterator[httpx.Client]:
    with devcluster_module.client(timeout=20) as c:
        for name, labels in (("team-a", {"tenant": "a"}), ("team-b", {"tenant": "b"}), ("plain", {})):
            assert c.post(NS, json={"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": name, "labels": labels}}).status_code == 201
        yield c


@pytest.fixture(autouse=True)
def clean(client: httpx.Client) -> Iterator[None]:
    yield
    assert client.delete(BINDINGS).status_code == 200
    assert client.delete(POLICIES).status_code == 200
    for ns in ("team-a", "team-b", "plain", "default"):
        client.delete(f"{NS}/{ns}/configmaps", params={"labelSelector": "case"})


def configmap_rules(operations: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": operations or ["CREATE", "UPDATE"],
            "resources": ["configmaps"]}
    rule.update(extra)
    return {"resourceRules": [rule]}


def install(c: httpx.Client, validations: list[dict[str, Any]], *, name: str = "p", binding: str = "b",
            actions: list[str] | None = None, match: dict[str, Any] | None = None, **spec: Any) -> None:
    """A policy ``name`` (matching ConfigMap creates/updates unless ``match`` says otherwise) and
    one binding ``binding`` to it; ``spec`` keys ``binding_*`` go to the binding's spec."""
    bspec = {k[len("binding_"):]: spec.pop(k) for k in list(spec) if k.startswith("binding_")}
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"matchConstraints": match or configmap_rules(), "validations": validations, **spec}}
    answer = c.post(POLICIES, json=policy)
    assert answer.status_code == 201, answer.text
    bound = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
             "metadata": {"name": binding},
             "spec": {"policyName": name, "validationActions": actions or ["Deny"], **bspec}}
    answer = c.post(BINDINGS, json=bound)
    assert answer.status_code == 201, answer.text


def configmap(c: httpx.Client, name: str, data: dict[str, str] | None = None, ns: str = "default",
              labels: dict[str, str] | None = None) -> httpx.Response:
    return c.post(f"{NS}/{ns}/configmaps", json={
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"case": "yes", **(labels or {})}}, "data": data or {}})


def denied(answer: httpx.Response, code: int, reason: str, text: str, name: str, policy: str = "p",
           binding: str = "b") -> None:
    """The Status kube-apiserver answers for a policy denial."""
    assert answer.status_code == code, answer.text
    status = answer.json()
    cause = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {text}"
    assert status["reason"] == reason
    assert status["message"] == f'configmaps "{name}" is forbidden: {cause}'
    assert status["details"] == {"name": name, "kind": "configmaps", "causes": [{"message": cause}]}


# --- validations, messages, reasons ---------------------------------------------------------

@pytest.mark.parametrize("reason,code", [(None, 422), ("Invalid", 422), ("Forbidden", 403),
                                         ("Unauthorized", 401), ("RequestEntityTooLarge", 413)])
def test_a_false_validation_denies_with_its_reason_and_code(client, reason, code):
    validation = {"expression": "size(object.data) < 2"}
    if reason:
        validation["reason"] = reason
    install(client, [validation])
    assert configmap(client, "small", {"a": "1"}).status_code == 201
    denied(configmap(client, "big", {"a": "1", "b": "2"}), code, reason or "Invalid",
           "failed expression: size(object.data) < 2", "big")
    assert client.get(f"{NS}/default/configmaps/big").status_code == 404


def test_message_and_message_expression(client):
    install(client, [
        {"expression": "size(object.data) < 2", "message": "  at most one key  ",
         "messageExpression": "'ConfigMap ' + object.metadata.name + ' has ' + string(size(object.data)) + ' keys'"},
        {"expression": "!has(object.data.x)", "message": "no x", "messageExpression": "object.data.missing"},
        {"expression": "!has(object.data.y)", "message": "no y, please"},
    ])
    denied(configmap(client, "two", {"a": "1", "b": "2"}), 422, "Invalid", "ConfigMap two has 2 keys", "two")
    # a messageExpression that errs falls back to message
    denied(configmap(client, "hasx", {"x": "1"}), 422, "Invalid", "no x", "hasx")
    denied(configmap(client, "hasy", {"y": "1"}), 422, "Invalid", "no y, please", "hasy")


# --- validationActions ---------------------------------------------------------------------

def test_warn_sends_the_warning_and_admits(client):
    install(client, [{"expression": "has(object.data.owner)", "message": "set data.owner"}], actions=["Warn"])
    answer = configmap(client, "warned")
    assert answer.status_code == 201
    assert answer.headers.get_list("Warning") == [
        '299 - "Validation failed for ValidatingAdmissionPolicy \'p\' with binding \'b\': set data.owner"']


def test_audit_records_the_failure_in_the_audit_event(client, devcluster_module):
    """validationActions Audit: "a validation failure is included in the published audit event
    for the request ... a `validation.policy.admission.k8s.io/validation_failure` audit annotation
    ... a JSON list of objects, each with ... message, policy, binding, expressionIndex,
    validationActions" (API reference, ValidatingAdmissionPolicyBindingSpec.validationActions;
    kubernetes-client/python kubernetes/docs/V1ValidatingAdmissionPolicyBindingSpec.md)."""
    install(client, [{"expression": "true"}, {"expression": "false", "message": "never"}], actions=["Audit"])
    answer = configmap(client, "audited")
    assert answer.status_code == 201 and "Warning" not in answer.headers
    event = last_audit_event(devcluster_module)
    assert event["apiVersion"] == "audit.k8s.io/v1" and event["level"] == "Metadata"
    assert event["verb"] == "create" and event["responseStatus"]["code"] == 201
    assert event["objectRef"] == {"resource": "configmaps", "namespace": "default", "apiVersion": "v1"}
    assert json.loads(event["annotations"]["validation.policy.admission.k8s.io/validation_failure"]) == [
        {"message": "never", "policy": "p", "binding": "b", "expressionIndex": 1, "validationActions": ["Audit"]}]
    # Deny with Audit: refused, and the refusal is in the audit event too
    install(client, [{"expression": "false", "message": "never"}], name="p2", binding="b2", actions=["Deny", "Audit"])
    denied(configmap(client, "both"), 422, "Invalid", "never", "both", "p2", "b2")
    failures = json.loads(last_audit_event(devcluster_module)["annotations"][
        "validation.policy.admission.k8s.io/validation_failure"])
    assert {"message": "never", "policy": "p2", "binding": "b2", "expressionIndex": 0,
            "validationActions": ["Deny", "Audit"]} in failures


def test_audit_annotations_are_published_as_policy_slash_key(client, devcluster_module):
    """auditAnnotations: "The key is combined with the resource name of the
    ValidatingAdmissionPolicy to construct an audit annotation key: {ValidatingAdmissionPolicy
    name}/{key}"; "If the expression evaluates to null or empty string the audit annotation will
    be omitted" (API reference, AuditAnnotation; kubernetes-client/python
    kubernetes/docs/V1AuditAnnotation.md); the documentation's example event
    (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/,
    "Audit annotations"). A policy may have auditAnnotations and no validations."""
    install(client, [], name="demo", auditAnnotations=[
        {"key": "many-keys", "valueExpression":
            "size(object.data) > 1 ? 'ConfigMap ' + object.metadata.name + ' has ' + string(size(object.data)) "
            "+ ' keys' : null"},
        {"key": "empty", "valueExpression": "''"}])
    assert configmap(client, "wide", {"a": "1", "b": "2"}).status_code == 201
    assert last_audit_event(devcluster_module)["annotations"] == {"demo/many-keys": "ConfigMap wide has 2 keys"}
    assert configmap(client, "narrow", {"a": "1"}).status_code == 201
    assert "annotations" not in last_audit_event(devcluster_module)


@pytest.mark.parametrize("failure_policy,code", [("Fail", 422), ("Ignore", 201)])
def test_an_audit_annotation_error_goes_through_failure_policy(client, failure_policy, code):
    """auditAnnotations valueExpression "must evaluate to either a string or null value" (API
    reference, AuditAnnotation); kube-apiserver's validator turns an error or another type into
    a denial when failurePolicy is Fail and skips the annotation when Ignore (k8s.io/apiserver
    plugin/policy/validating/validator.go, dispatcher.go: "When failurePolicy=fail, audit
    annotation errors result in deny"), whatever the binding's validationActions."""
    install(client, [], actions=["Warn"], failurePolicy=failure_policy,
            auditAnnotations=[{"key": "size", "valueExpression": "size(object.data)"}])
    answer = configmap(client, "typed", {"a": "1"})
    assert answer.status_code == code, answer.text
    if code == 422:
        denied(answer, 422, "Invalid", "valueExpression 'size(object.data)' resulted in unsupported return type: "
               "int. Return type must be either string or null.", "typed")


def test_kubectl_prints_policy_warnings_and_denials(client, devcluster_module):
    install(client, [{"expression": "has(object.data.owner)", "message": "set data.owner"}], actions=["Warn"])
    install(client, [{"expression": "!has(object.data.forbidden)", "message": "no data.forbidden",
                      "reason": "Forbidden"}], name="p2", binding="b2")
    created = devcluster_module.kubectl("create", "configmap", "by-kubectl", "--from-literal=a=1")
    assert created.stdout.strip() == "configmap/by-kubectl created"
    assert created.stderr.strip() == ("Warning: Validation failed for ValidatingAdmissionPolicy 'p' with binding 'b': "
                                      "set data.owner")
    refused = devcluster_module.kubectl("create", "configmap", "refused", "--from-literal=owner=me",
                                        "--from-literal=forbidden=1", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: failed to create configmap: configmaps \"refused\" is forbidden: ValidatingAdmissionPolicy 'p2' with "
        "binding 'b2' denied request: no data.forbidden")
    devcluster_module.kubectl("delete", "configmap", "by-kubectl")


# --- failurePolicy ---------------------------------------------------------------------------

def test_an_expression_error_denies_under_fail_and_admits_under_ignore(client):
    install(client, [{"expression": "object.data.missing == 'x'"}])
    denied(configmap(client, "err"), 422, "Invalid",
           "expression 'object.data.missing == 'x'' resulted in error: no such key: missing", "err")
    client.delete(BINDINGS)
    client.delete(POLICIES)
    install(client, [{"expression": "object.data.missing == 'x'"}], failurePolicy="Ignore")
    assert configmap(client, "err").status_code == 201


def test_a_compile_error_goes_through_failure_policy(client):
    install(client, [{"expression": "object.data.(("}], failurePolicy="Fail")
    answer = configmap(client, "broken")
    assert answer.status_code == 422
    assert "denied request: compilation error: compilation failed:" in answer.json()["message"]
    install(client, [{"expression": "size(object.data) == 0 &&"}], name="p2", binding="b2", failurePolicy="Ignore")
    client.delete(f"{BINDINGS}/b")
    assert configmap(client, "ignored").status_code == 201


# --- matchConditions and variables ----------------------------------------------------------

def test_match_conditions_all_true_to_apply(client):
    install(client, [{"expression": "false", "message": "guarded"}], matchConditions=[
        {"name": "labelled", "expression": "'guard' in object.metadata.labels"},
        {"name": "not-exempt", "expression": "!('exempt' in object.metadata.labels)"}])
    assert configmap(client, "free").status_code == 201
    assert configmap(client, "exempt", labels={"guard": "1", "exempt": "1"}).status_code == 201
    denied(configmap(client, "guarded", labels={"guard": "1"}), 422, "Invalid", "guarded", "guarded")


def test_a_false_match_condition_wins_over_an_erring_one(client):
    install(client, [{"expression": "false", "message": "guarded"}], matchConditions=[
        {"name": "errs", "expression": "object.data.nope == 'x'"},
        {"name": "labelled", "expression": "'guard' in object.metadata.labels"}])
    assert configmap(client, "skipped").status_code == 201
    answer = configmap(client, "erred", labels={"guard": "1"})
    assert answer.status_code == 422
    assert "resulted in error: no such key: nope" in answer.json()["message"]


def test_variables_are_lazy_and_composable(client):
    install(client, [{"expression": "!variables.labelled || variables.keys <= 1",
                      "messageExpression": "'too many keys: ' + string(variables.keys)"}],
            variables=[{"name": "labelled", "expression": "'limit' in object.metadata.labels"},
                       {"name": "keys", "expression": "size(object.data)"},
                       {"name": "broken", "expression": "object.data.never"}])
    # ``broken`` is never read, so its error never matters
    assert configmap(client, "many", {"a": "1", "b": "2"}).status_code == 201
    denied(configmap(client, "limited", {"a": "1", "b": "2"}, labels={"limit": "1"}), 422, "Invalid",
           "too many keys: 2", "limited")


# --- matching ------------------------------------------------------------------------------

def test_namespace_and_object_selectors(client):
    match = configmap_rules()
    match["namespaceSelector"] = {"matchLabels": {"tenant": "a"}}
    match["objectSelector"] = {"matchExpressions": [{"key": "checked", "operator": "Exists"}]}
    install(client, [{"expression": "false", "message": "no"}], match=match)
    assert configmap(client, "x", ns="team-b", labels={"checked": "1"}).status_code == 201
    assert configmap(client, "y", ns="team-a").status_code == 201
    denied(configmap(client, "z", ns="team-a", labels={"checked": "1"}), 422, "Invalid", "no", "z")


def test_exclude_rules_operations_resource_names_and_binding_match_resources(client):
    match = configmap_rules(["CREATE", "UPDATE", "DELETE"])
    match["excludeResourceRules"] = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"],
                                      "resources": ["configmaps"], "resourceNames": ["excluded"]}]
    install(client, [{"expression": "request.operation != 'DELETE' || !('keep' in oldObject.metadata.labels)",
                      "message": "kept", "reason": "Forbidden"},
                     {"expression": "object == null || !has(object.data.bad)", "message": "bad"}],
            match=match, binding_matchResources={"namespaceSelector": {"matchLabels": {"tenant": "a"}},
                                                 "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                                    "operations": ["*"], "resources": ["*"]}]})
    assert configmap(client, "excluded", {"bad": "1"}, ns="team-a").status_code == 201
    assert configmap(client, "outside", {"bad": "1"}, ns="team-b").status_code == 201  # binding narrows
    denied(configmap(client, "inside", {"bad": "1"}, ns="team-a"), 422, "Invalid", "bad", "inside")
    assert configmap(client, "kept", ns="team-a", labels={"keep": "1"}).status_code == 201
    answer = client.delete(f"{NS}/team-a/configmaps/kept")
    assert answer.status_code == 403
    assert answer.json()["message"] == ('configmaps "kept" is forbidden: ValidatingAdmissionPolicy \'p\' with '
                                        "binding 'b' denied request: kept")
    # an update is checked too, with oldObject
    patch = client.patch(f"{NS}/team-a/configmaps/kept", json={"data": {"bad": "1"}},
                         headers={"Content-Type": "application/merge-patch+json"})
    denied(patch, 422, "Invalid", "bad", "kept")


def test_other_kinds_and_the_policy_kinds_themselves_are_not_matched(client):
    install(client, [{"expression": "false"}])
    assert client.post(f"{NS}/default/secrets", json={"apiVersion": "v1", "kind": "Secret",
                                                      "metadata": {"name": "s", "labels": {"case": "1"}}}).status_code == 201
    client.delete(f"{NS}/default/secrets/s")
    install(client, [{"expression": "false"}], name="all", binding="all",
            match={"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"],
                                      "resources": ["*"]}]}, binding_matchResources={
                "namespaceSelector": {"matchLabels": {"tenant": "b"}},
                "resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]})
    # policies and bindings are never subject to policies (no lock-out)
    assert client.delete(f"{BINDINGS}/all").status_code == 200


# --- request, namespaceObject, oldObject, libraries ----------------------------------------

def test_request_namespace_object_and_libraries(client):
    install(client, [
        {"expression": "request.userInfo.username == 'devcluster-admin' && 'system:masters' in request.userInfo.groups"},
        {"expression": "request.kind.kind == 'ConfigMap' && request.resource.resource == 'configmaps'"},
        {"expression": "request.namespace == object.metadata.namespace && request.name == object.metadata.name"},
        {"expression": "namespaceObject.metadata.labels.tenant == 'a'", "message": "tenant a only"},
        {"expression": "!has(object.data.mem) || quantity(object.data.mem).compareTo(quantity('1Gi')) <= 0",
         "message": "at most 1Gi"},
        {"expression": "!has(object.data.list) || object.data.list.split(',').isSorted()", "message": "sorted"},
        {"expression": "!has(object.data.id) || object.data.id.find('[0-9]+') == '42'", "message": "id 42"},
        {"expression": "[1, 5, 3].max() == 5 && [1, 2].sum() == 3 && 'AbC'.lowerAscii() == 'abc'"},
        {"expression": "request.dryRun == false", "message": "no dry runs"},
    ])
    assert configmap(client, "ok", {"mem": "512Mi", "list": "a,b,c", "id": "x42y"}, ns="team-a").status_code == 201
    denied(configmap(client, "ns", ns="team-b"), 422, "Invalid", "tenant a only", "ns")
    denied(configmap(client, "mem", {"mem": "2Gi"}, ns="team-a"), 422, "Invalid", "at most 1Gi", "mem")
    denied(configmap(client, "list", {"list": "b,a"}, ns="team-a"), 422, "Invalid", "sorted", "list")
    denied(configmap(client, "id", {"id": "7"}, ns="team-a"), 422, "Invalid", "id 42", "id")
    dry = client.post(f"{NS}/team-a/configmaps", params={"dryRun": "All"},
                      json={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dry"}})
    denied(dry, 422, "Invalid", "no dry runs", "dry")


def test_old_object_makes_a_field_immutable(client):
    install(client, [{"expression": "oldObject == null || object.data.tier == oldObject.data.tier",
                      "message": "data.tier is immutable"}])
    assert configmap(client, "fixed", {"tier": "gold"}).status_code == 201
    ok = client.patch(f"{NS}/default/configmaps/fixed", json={"data": {"other": "1"}},
                      headers={"Content-Type": "application/merge-patch+json"})
    assert ok.status_code == 200
    changed = client.patch(f"{NS}/default/configmaps/fixed", json={"data": {"tier": "silver"}},
                           headers={"Content-Type": "application/merge-patch+json"})
    denied(changed, 422, "Invalid", "data.tier is immutable", "fixed")


def test_a_new_policy_generation_is_compiled_again(client):
    install(client, [{"expression": "size(object.data) < 1", "message": "v1"}])
    denied(configmap(client, "g", {"a": "1"}), 422, "Invalid", "v1", "g")
    policy = client.get(f"{POLICIES}/p").json()
    policy["spec"]["validations"] = [{"expression": "size(object.data) < 5", "message": "v2"}]
    assert client.put(f"{POLICIES}/p", json=policy).status_code == 200
    assert configmap(client, "g", {"a": "1"}).status_code == 201


# --- parameters ----------------------------------------------------------------------------

LIMIT = [{"expression": "size(object.data) <= int(params.data.maxKeys)",
          "messageExpression": "'at most ' + params.data.maxKeys + ' keys (' + params.metadata.name + ')'"}]
PARAM_KIND = {"apiVersion": "v1", "kind": "ConfigMap"}


def param(c: httpx.Client, ns: str, name: str, max_keys: int, labels: dict[str, str] | None = None) -> None:
    assert configmap(c, name, {"maxKeys": str(max_keys)}, ns=ns, labels={"param": "yes", **(labels or {})}
                     ).status_code == 201


def limited_rules() -> dict[str, Any]:
    match = configmap_rules()
    match["objectSelector"] = {"matchExpressions": [{"key": "param", "operator": "DoesNotExist"}]}
    return match


def test_params_by_name_in_a_fixed_namespace(client):
    param(client, "default", "limits", 1)
    install(client, LIMIT, paramKind=PARAM_KIND, match=limited_rules(),
            binding_paramRef={"name": "limits", "namespace": "default", "parameterNotFoundAction": "Deny"})
    assert configmap(client, "one", {"a": "1"}, ns="team-a").status_code == 201
    denied(configmap(client, "two", {"a": "1", "b": "2"}, ns="team-b"), 422, "Invalid", "at most 1 keys (limits)", "two")


def test_params_by_name_in_the_request_namespace_and_not_found_actions(client):
    param(client, "team-a", "limits", 2)
    install(client, LIMIT, paramKind=PARAM_KIND, match=limited_rules(),
            binding_paramRef={"name": "limits", "parameterNotFoundAction": "Deny"})
    assert configmap(client, "two", {"a": "1", "b": "2"}, ns="team-a").status_code == 201
    denied(configmap(client, "three", {"a": "1", "b": "2", "c": "3"}, ns="team-a"), 422, "Invalid",
           "at most 2 keys (limits)", "three")
    # team-b has no parameters: Deny
    denied(configmap(client, "none", ns="team-b"), 422, "Invalid",
           "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction", "none")
    client.delete(f"{BINDINGS}/b")
    install(client, LIMIT, name="p2", binding="b2", paramKind=PARAM_KIND, match=limited_rules(),
            binding_paramRef={"name": "limits", "parameterNotFoundAction": "Allow"})
    client.delete(f"{POLICIES}/p")
    assert configmap(client, "none", ns="team-b").status_code == 201


def test_params_not_found_under_ignore_admits(client):
    install(client, LIMIT, paramKind=PARAM_KIND, match=limited_rules(), failurePolicy="Ignore",
            binding_paramRef={"name": "absent", "parameterNotFoundAction": "Deny"})
    assert configmap(client, "free", ns="team-b").status_code == 201


def test_params_by_selector_each_must_pass(client, devcluster_module):
    param(client, "team-a", "loose", 5, {"set": "x"})
    param(client, "team-a", "strict", 1, {"set": "x"})
    param(client, "team-a", "other", 0, {"set": "y"})
    install(client, LIMIT, paramKind=PARAM_KIND, match=limited_rules(),
            binding_paramRef={"selector": {"matchLabels": {"set": "x"}}, "parameterNotFoundAction": "Deny"})
    assert configmap(client, "one", {"a": "1"}, ns="team-a").status_code == 201
    denied(configmap(client, "two", {"a": "1", "b": "2"}, ns="team-a"), 422, "Invalid", "at most 1 keys (strict)", "two")
    # kubectl get shows the selector as kube-apiserver's ParamRef column does
    shown = devcluster_module.kubectl("get", "validatingadmissionpolicybinding", "b").stdout.splitlines()[1].split()
    assert shown[:3] == ["b", "p", "&LabelSelector{MatchLabels:map[string]string{set:"]
    assert shown[3] == "x,},MatchExpressions:[]LabelSelectorRequirement{},}"


def test_policies_are_served_with_kube_apiserver_defaults(client):
    install(client, [{"expression": "true"}], paramKind=PARAM_KIND,
            binding_paramRef={"name": "x"}, binding_matchResources={"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]})
    listed = client.get(POLICIES).json()
    assert [p["metadata"]["name"] for p in listed["items"]] == ["p"]
    spec = listed["items"][0]["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["matchPolicy"] == "Equivalent"
    assert spec["matchConstraints"]["namespaceSelector"] == {} and spec["matchConstraints"]["objectSelector"] == {}
    assert spec["matchConstraints"]["resourceRules"][0]["scope"] == "*"
    binding = client.get(f"{BINDINGS}/b").json()["spec"]
    assert binding["paramRef"] == {"name": "x", "parameterNotFoundAction": "Deny"}
    assert binding["matchResources"]["matchPolicy"] == "Equivalent"


def _refused(answer: httpx.Response, kind: str, name: str, causes: list[tuple[str, str]]) -> None:
    assert answer.status_code == 422, answer.text
    status = answer.json()
    assert [(c["field"], c["message"]) for c in status["details"]["causes"]] == causes
    assert status["message"].startswith(f'{kind}.admissionregistration.k8s.io "{name}" is invalid: ')


@pytest.mark.parametrize("spec,causes", [
    ({"policyName": "p", "validationActions": []},
     [("spec.validationActions", "Required value: at least one validation action is required")]),
    ({"policyName": "p", "validationActions": ["Deny", "Warn"]}, [(
        "spec.validationActions", 'Invalid value: ["Deny", "Warn"]: must not contain both Deny and Warn (repeating '
        "the same validation failure information in the API response and headers serves no purpose)")]),
    ({"policyName": "p", "validationActions": ["Audit", "Audit"]},
     [("spec.validationActions[1]", 'Duplicate value: "Audit"')]),
    ({"policyName": "p", "validationActions": ["Deny"], "paramRef": {"parameterNotFoundAction": "Deny"}},
     [("spec.paramRef", "Required value: one of name or selector must be specified")]),
    ({"policyName": "p", "validationActions": ["Deny"], "paramRef": {"name": "a", "selector": {}}},
     [("spec.paramRef.name", "Forbidden: name and selector are mutually exclusive")]),
    ({"policyName": "p", "validationActions": ["Deny"], "paramRef": {"name": "a", "parameterNotFoundAction": "Maybe"}},
     [("spec.paramRef.parameterNotFoundAction", 'Unsupported value: "Maybe": supported values: "Allow", "Deny"')]),
])
def test_bindings_are_validated(client, spec, causes):
    answer = client.post(BINDINGS, json={"apiVersion": "admissionregistration.k8s.io/v1",
                                         "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "x"},
                                         "spec": spec})
    _refused(answer, "ValidatingAdmissionPolicyBinding", "x", causes)


RULES = configmap_rules()


@pytest.mark.parametrize("spec,causes", [
    ({"matchConstraints": RULES}, [
        ("spec.validations", "Required value: validations or auditAnnotations must contain at least one item"),
        ("spec.auditAnnotations", "Required value: validations or auditAnnotations must contain at least one item")]),
    ({"validations": [{"expression": "true"}]}, [("spec.matchConstraints", "Required value")]),
    ({"matchConstraints": {"namespaceSelector": {}}, "validations": [{"expression": "true"}]},
     [("spec.matchConstraints.resourceRules", "Required value")]),
    ({"matchConstraints": RULES, "failurePolicy": "Maybe", "validations": [{"expression": "true", "reason": "Teapot"}]},
     [("spec.failurePolicy", 'Unsupported value: "Maybe": supported values: "Fail", "Ignore"'),
      ("spec.validations[0].reason", 'Unsupported value: "Teapot": supported values: "Forbidden", "Invalid", '
                                     '"RequestEntityTooLarge", "Unauthorized"')]),
    ({"matchConstraints": RULES, "validations": [{"expression": "true"}],
      "variables": [{"name": "not-an-identifier", "expression": "1"}],
      "matchConditions": [{"name": "a", "expression": "true"}, {"name": "a", "expression": "true"}]},
     [("spec.matchConditions[1].name", 'Duplicate value: "a"'),
      ("spec.variables[0].name", 'Invalid value: "not-an-identifier": name is not a valid CEL identifier')]),
    ({"matchConstraints": RULES, "auditAnnotations": [{"key": "k", "valueExpression": "'a'"},
                                                      {"key": "k", "valueExpression": "'b'"}]},
     [("spec.auditAnnotations[1].key", 'Duplicate value: "k"')]),
    ({"matchConstraints": RULES, "validations": [{"expression": "true"}], "variables": [None]},
     [("spec.variables[0].name", "Required value: name is not specified"),
      ("spec.variables[0].expression", "Required value: expression is not specified")]),
])
def test_policies_are_validated(client, spec, causes):
    answer = client.post(POLICIES, json={"apiVersion": "admissionregistration.k8s.io/v1",
                                         "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "x"}, "spec": spec})
    _refused(answer, "ValidatingAdmissionPolicy", "x", causes)


# --- custom resources: matchPolicy across served versions, subresources, scope -------------

WIDGETS = "/apis/example.com/{v}/namespaces/default/widgets"


@pytest.fixture(scope="module")
def widgets(client: httpx.Client) -> None:
    schema = {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
        "status": {"type": "object", "properties": {"phase": {"type": "string"}}}}}}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": v, "served": True, "storage": v == "v1", "schema": schema,
                                  "subresources": {"status": {}}} for v in ("v1", "v2")]}}
    answer = client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
    assert answer.status_code == 201, answer.text


def widget(c: httpx.Client, name: str, size: int, version: str = "v1") -> httpx.Response:
    return c.post(WIDGETS.format(v=version), json={"apiVersion": f"example.com/{version}", "kind": "Widget",
                                                   "metadata": {"name": name}, "spec": {"size": size}})


def widget_rules(resources: list[str], match_policy: str = "Equivalent") -> dict[str, Any]:
    return {"matchPolicy": match_policy, "resourceRules": [{
        "apiGroups": ["example.com"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
        "resources": resources, "scope": "Namespaced"}]}


@pytest.mark.parametrize("match_policy,v2_denied", [("Equivalent", True), ("Exact", False)])
def test_match_policy_across_served_versions(client, widgets, match_policy, v2_denied):
    install(client, [{"expression": "object.spec.size <= 3", "message": "too big"}],
            match=widget_rules(["widgets"], match_policy))
    assert widget(client, "w-small", 1).status_code == 201
    answer = widget(client, "w-big-v2", 9, "v2")
    assert answer.status_code == (422 if v2_denied else 201), answer.text
    if v2_denied:
        assert answer.json()["message"] == ('widgets.example.com "w-big-v2" is forbidden: ValidatingAdmissionPolicy '
                                            "'p' with binding 'b' denied request: too big")
    for name in ("w-small", "w-big-v2"):
        client.delete(f"{WIDGETS.format(v='v1')}/{name}")


def test_status_writes_match_only_rules_naming_the_subresource(client, widgets):
    install(client, [{"expression": "!has(object.status) || object.status.phase != 'Broken'",
                      "message": "no broken widgets"},
                     {"expression": "request.subResource == 'status'", "message": "status only"}],
            match=widget_rules(["widgets/status"]))
    assert widget(client, "w-status", 1).status_code == 201  # a main-resource create is not matched
    merge = {"Content-Type": "application/merge-patch+json"}
    ok = client.patch(f"{WIDGETS.format(v='v1')}/w-status/status", json={"status": {"phase": "Ready"}}, headers=merge)
    assert ok.status_code == 200, ok.text
    refused = client.patch(f"{WIDGETS.format(v='v1')}/w-status/status", json={"status": {"phase": "Broken"}},
                           headers=merge)
    assert refused.status_code == 422
    assert refused.json()["message"].endswith("denied request: no broken widgets")
    client.delete(f"{WIDGETS.format(v='v1')}/w-status")


def test_a_namespace_is_matched_by_its_own_labels_and_cluster_scoped_params(client):
    match = {"namespaceSelector": {"matchLabels": {"guarded": "yes"}},
             "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["namespaces"]}]}
    # the parameter is a cluster-scoped object (a Namespace): paramRef.namespace plays no part
    install(client, [{"expression": "object.metadata.name.startsWith(params.metadata.labels.prefix)",
                      "messageExpression": "'names start with ' + params.metadata.labels.prefix"}],
            match=match, paramKind={"apiVersion": "v1", "kind": "Namespace"},
            binding_paramRef={"name": "team-a", "parameterNotFoundAction": "Deny"})
    labelled = client.patch(f"{NS}/team-a", json={"metadata": {"labels": {"prefix": "team"}}},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert labelled.status_code == 200, labelled.text
    assert labelled.json()["metadata"]["labels"]["prefix"] == "team", labelled.text
    free = client.post(NS, json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "free-ns"}})
    assert free.status_code == 201
    refused = client.post(NS, json={"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": "other", "labels": {"guarded": "yes"}}})
    assert refused.status_code == 422
    assert refused.json()["message"] == ('namespaces "other" is forbidden: ValidatingAdmissionPolicy \'p\' with '
                                         "binding 'b' denied request: names start with team")
    ok = client.post(NS, json={"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": "team-c", "labels": {"guarded": "yes"}}})
    assert ok.status_code == 201


# --- a binding's matchResources --------------------------------------------------------------
# The rules, from the API reference of ValidatingAdmissionPolicyBindingSpec.matchResources
# (https://kubernetes.io/docs/reference/kubernetes-api/policy-resources/validating-admission-policy-binding-v1/):
# "Note that this is intersected with the policy's matchConstraints, so only requests that are
# matched by the policy can be selected by this. If this is unset, all resources matched by the
# policy are validated by this binding. When resourceRules is unset, it does not constrain
# resource matching. If a resource is matched by the other fields of this object, it will be
# validated." and of MatchResources: "The exclude rules take precedence over include rules".
# In the source: staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/matching/matching.go
# (v1.36.0: namespace selector, object selector, excludeResourceRules, then resourceRules, an
# empty list matching every resource).

ALL_CONFIGMAPS = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["*"], "resources": ["configmaps"]}
BINDING_CASES = {
    # "If this is unset, all resources matched by the policy are validated by this binding."
    "unset": (None, {"team-a": True, "team-b": True, "plain": True}),
    # "When resourceRules is unset, it does not constrain resource matching": namespaceSelector alone
    "namespace-selector-only": ({"namespaceSelector": {"matchLabels": {"tenant": "a"}}},
                                {"team-a": True, "team-b": False, "plain": False}),
    "namespace-selector-expression-only": (
        {"namespaceSelector": {"matchExpressions": [{"key": "tenant", "operator": "Exists"}]}},
        {"team-a": True, "team-b": True, "plain": False}),
    # objectSelector alone: objects carrying the label, in every namespace
    "object-selector-only": ({"objectSelector": {"matchLabels": {"strict": "yes"}}},
                             {"team-a": False, "team-b": False, "plain": False, "strict": True}),
    # "The exclude rules take precedence over include rules": excludeResourceRules alone
    "exclude-rules-only": ({"excludeResourceRules": [dict(ALL_CONFIGMAPS, resourceNames=["skipped"])]},
                           {"team-a": True, "team-b": True, "plain": True, "skipped": False}),
    # "intersected with the policy's matchConstraints": rules naming another resource select nothing here
    "rules-for-another-resource": ({"resourceRules": [dict(ALL_CONFIGMAPS, resources=["secrets"])]},
                                   {"team-a": False, "team-b": False, "plain": False}),
    "rules-and-namespace-selector": ({"resourceRules": [ALL_CONFIGMAPS],
                                      "namespaceSelector": {"matchLabels": {"tenant": "b"}}},
                                     {"team-a": False, "team-b": True, "plain": False}),
}


@pytest.mark.parametrize("match_resources,enforced", BINDING_CASES.values(), ids=BINDING_CASES.keys())
def test_binding_match_resources(client, match_resources, enforced):
    spec = {"binding_matchResources": match_resources} if match_resources is not None else {}
    install(client, [{"expression": "false", "message": "enforced"}], **spec)
    for target, expect_denied in enforced.items():
        ns = target if target in ("team-a", "team-b", "plain") else "plain"
        labels = {"strict": "yes"} if target == "strict" else {}
        name = target if target == "skipped" else f"cm-{target}"
        answer = configmap(client, name, ns=ns, labels=labels)
        if expect_denied:
            denied(answer, 422, "Invalid", "enforced", name)
        else:
            assert answer.status_code == 201, (target, answer.text)


def test_kubectl_namespace_selected_binding_enforces_in_labelled_namespaces(client, devcluster_module):
    """The reproduction with real kubectl: a policy bound only to namespaces labelled
    ``tenant=a`` (matchResources with just a namespaceSelector) refuses there and nowhere else."""
    manifest = """\
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: p}
spec:
  matchConstraints:
    resourceRules:
    - {apiGroups: [""], apiVersions: ["v1"], operations: ["CREATE", "UPDATE"], resources: ["configmaps"]}
  validations:
  - {expression: "has(object.data.owner)", message: "data.owner is required"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: b}
spec:
  policyName: p
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {tenant: a}
"""
    applied = devcluster_module.kubectl("apply", "-f", "-", input=manifest)
    assert "validatingadmissionpolicybinding.admissionregistration.k8s.io/b created" in applied.stdout
    refused = devcluster_module.kubectl("-n", "team-a", "create", "configmap", "no-owner", "--from-literal=a=1",
                                        check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "error: failed to create configmap: configmaps \"no-owner\" is forbidden: ValidatingAdmissionPolicy 'p' "
        "with binding 'b' denied request: data.owner is required")
    created = devcluster_module.kubectl("-n", "team-b", "create", "configmap", "no-owner", "--from-literal=a=1")
    assert created.stdout.strip() == "configmap/no-owner created"
    devcluster_module.kubectl("-n", "team-b", "delete", "configmap", "no-owner")
    owned = devcluster_module.kubectl("-n", "team-a", "create", "configmap", "owned", "--from-literal=owner=me")
    assert owned.stdout.strip() == "configmap/owned created"
    devcluster_module.kubectl("-n", "team-a", "delete", "configmap", "owned")


# --- status.typeChecking ----------------------------------------------------------------------

def policy_status(c: httpx.Client, name: str = "p") -> dict[str, Any]:
    answer = c.get(f"{POLICIES}/{name}")
    assert answer.status_code == 200
    return answer.json()["status"]


DEPLOYMENTS = {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
               "resources": ["deployments"]}
UNDEFINED_REPLICAS = ("ERROR: <input>:1:7: undefined field 'replicas'\n"
                      " | object.replicas > 1\n"
                      " | ......^")


def test_type_checking_warns_of_undefined_fields_of_matched_kinds(client):
    """The documentation's "Type checking" examples, word for word
    (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/):
    ``object.replicas > 1`` against apps/v1 Deployment, then against Deployment and ReplicaSet
    (one line per kind); the presence of status.typeChecking means the check ran, an empty one
    that nothing was found; type checking never changes enforcement."""
    install(client, [{"expression": "object.replicas > 1"}], match={"resourceRules": [DEPLOYMENTS]})
    status = policy_status(client)
    assert status == {"observedGeneration": 1, "typeChecking": {"expressionWarnings": [
        {"fieldRef": "spec.validations[0].expression", "warning": f"apps/v1, Kind=Deployment: {UNDEFINED_REPLICAS}"}]}}
    both = dict(DEPLOYMENTS, resources=["deployments", "replicasets"])
    answer = client.patch(f"{POLICIES}/p", json={"spec": {"matchConstraints": {"resourceRules": [both]}}},
                          headers={"Content-Type": "application/merge-patch+json"})
    assert answer.status_code == 200, answer.text
    assert policy_status(client) == {"observedGeneration": 2, "typeChecking": {"expressionWarnings": [
        {"fieldRef": "spec.validations[0].expression",
         "warning": f"apps/v1, Kind=Deployment: {UNDEFINED_REPLICAS}\napps/v1, Kind=ReplicaSet: {UNDEFINED_REPLICAS}"}]}}


def test_type_checking_of_nested_fields_macros_and_message_expressions(client):
    """Fields reached through lists, maps and macro variables are checked; map keys
    (labels) are not fields; messageExpression is checked too ("spec.validations[i].messageExpression")."""
    containers = "object.spec.template.spec.containers.all(c, c.image != '' && c.imagePullPolicyy != 'x')"
    message = "'replicas: ' + string(object.spec.replica)"
    install(client, [
        {"expression": containers},
        {"expression": "object.metadata.labels.team == 'a' && object.spec.replicas > 0", "messageExpression": message},
        {"expression": "has(object.metadata.labels) && !has(object.spec.paused)"},
    ], match={"resourceRules": [DEPLOYMENTS]})
    warnings = policy_status(client)["typeChecking"]["expressionWarnings"]
    assert [w["fieldRef"] for w in warnings] == ["spec.validations[0].expression",
                                                 "spec.validations[1].messageExpression"]
    # cel-go places the error at the selection's "." (1-based column), the caret under it
    column = containers.index(".imagePullPolicyy")
    assert warnings[0]["warning"] == (f"apps/v1, Kind=Deployment: ERROR: <input>:1:{column + 1}: undefined field "
                                      f"'imagePullPolicyy'\n | {containers}\n | {'.' * column}^")
    column = message.index(".replica)")
    assert warnings[1]["warning"] == (f"apps/v1, Kind=Deployment: ERROR: <input>:1:{column + 1}: undefined field "
                                      f"'replica'\n | {message}\n | {'.' * column}^")


def test_type_checking_skips_wildcards_and_custom_resources(client, widgets):
    """"No wildcard matching ... the types that "*" matches will not be checked"; "Type Checking
    does not apply to CRDs" (documentation, "Type checking"): both get an empty typeChecking."""
    install(client, [{"expression": "object.nothing > 1"}], match=widget_rules(["widgets"]))
    assert policy_status(client)["typeChecking"] == {}
    install(client, [{"expression": "object.nothing > 1"}], name="wild", binding="wild-b",
            match={"resourceRules": [dict(DEPLOYMENTS, apiVersions=["*"])]})
    assert policy_status(client, "wild")["typeChecking"] == {}
