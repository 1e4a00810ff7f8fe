"""The order of admission in devcluster, as kube-apiserver's: a table of cases, each citing the rule.

One devcluster and one real HTTPS webhook server (a thread) for the module. Each case installs
mutating webhooks, a ValidatingAdmissionPolicy with its binding and a recording validating
webhook, makes one request over HTTP and checks what a client sees (status, message, the object
stored) and which webhooks were called with which object.

The rules (Kubernetes v1.36 source paths, tag v1.36.0, and documentation):
- ORDER: kube-apiserver's admission plugins run in the order of ``AllOrderedPlugins`` in
  ``pkg/kubeapiserver/options/plugins.go``: ..., MutatingAdmissionWebhook,
  ValidatingAdmissionPolicy, ValidatingAdmissionWebhook, ResourceQuota; mutating plugins run in
  the first phase and validating plugins in the second
  (https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/ "What are
  they?"), and the chain stops at the first error
  (``staging/src/k8s.io/apiserver/pkg/admission/chain.go``).
- STRATEGY: the create handler runs mutating admission
  (``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go``), then the registry's
  ``Create`` runs ``rest.BeforeCreate`` (prepare, validate incl. ObjectMeta) and only then
  ``createValidation``, the validating admission
  (``staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go``,
  ``staging/src/k8s.io/apiserver/pkg/registry/rest/create.go``).
- REINVOKE: ``reinvocationPolicy: IfNeeded`` - a webhook is called again once if a later
  mutation changed the object after its call; Never (default) - not again
  (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#reinvocation-policy,
  ``staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go``).
"""
from __future__ import annotations

import base64
import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import httpx
import pytest

from trainyard_services.devcluster.tls import ensure_credentials

ADM = "/apis/admissionregistration.k8s.io/v1"
CM = "/api/v1/namespaces/default/configmaps"


class Hooks:
    """A webhook server whose path says what it does; every call is recorded as (path, request).

    ``/mutate/label/<key>/<value>`` sets a label; ``/mutate/count`` increments the
    ``calls`` annotation (so it changes the object on every call); ``/validate/<name>``
    admits and records."""

    def __init__(self, url: str, ca: str) -> None:
        self.url, self.ca = url, ca
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def called(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [request for path, request in self.calls if path.startswith(prefix)]


def _answer(path: str, request: dict[str, Any]) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    obj = request.get("object") or {}
    meta = obj.get("metadata") or {}
    patch = None
    parts = path.strip("/").split("/")
    if parts[:2] == ["mutate", "label"]:
        labels = dict(meta.get("labels") or {})
        labels[parts[2]] = parts[3]
        patch = [{"op": "add", "path": "/metadata/labels", "value": labels}]
    elif parts[:2] == ["mutate", "count"]:
        annotations = dict(meta.get("annotations") or {})
        annotations["calls"] = str(int(annotations.get("calls", "0")) + 1)
        patch = [{"op": "add", "path": "/metadata/annotations", "value": annotations}]
    if patch is not None and request.get("object") is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


@pytest.fixture(scope="module")
def hooks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hooks]:
    creds = ensure_credentials(tmp_path_factory.mktemp("hooks"))
    recorder: Hooks

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with recorder.lock:
                recorder.calls.append((self.path, review["request"]))
            body = json.dumps(_answer(self.path, review["request"])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(creds.server_cert, creds.server_key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    recorder = Hooks(f"https://127.0.0.1:{server.server_address[1]}",
                     base64.b64encode(creds.ca_cert.read_bytes()).decode())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def client(devcluster_module) -> Iterator[httpx.Client]:
    with devcluster_module.client(timeout=30) as c:
        yield c


@pytest.fixture(autouse=True)
def clean(client: httpx.Client, hooks: Hooks) -> Iterator[None]:
    yield
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations",
                 "validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        assert client.delete(f"{ADM}/{kind}").status_code == 200
    assert client.delete(CM, params={"labelSelector": "case"}).status_code == 200
    with hooks.lock:
        hooks.calls.clear()


def _hook(hooks: Hooks, name: str, path: str, reinvocation: str | None = None) -> dict[str, Any]:
    hook = {"name": f"{name}.example.com", "clientConfig": {"url": hooks.url + path, "caBundle": hooks.ca},
            "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail", "timeoutSeconds": 5,
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                       "resources": ["configmaps"]}]}
    if reinvocation:
        hook["reinvocationPolicy"] = reinvocation
    return hook


@dataclass
class Case:
    rule: str  # ORDER, STRATEGY or REINVOKE (module docstring): where the expectation comes from
    labels: dict[str, str]  # of the ConfigMap created
    mutating: list[tuple[str, str | None]] = field(default_factory=list)  # (path, reinvocationPolicy)
    policy: str | None = None  # a CEL validation of a policy bound with Deny
    code: int = 201
    message: str = ""  # the start of the refusal's message
    validating_sees: dict[str, str] | None = None  # labels the validating webhook saw; None: never called
    mutate_calls: dict[str, int] = field(default_factory=dict)  # path -> calls


TEAM_A = "has(object.metadata.labels.team) && object.metadata.labels.team == 'a'"
CASES = {
    # ORDER: the policy sees the label the mutating webhook set (without it the policy denies)
    "policy-sees-mutation": Case("ORDER", {"case": "1"}, [("/mutate/label/team/a", None)],
                                 policy=TEAM_A,
                                 validating_sees={"case": "1", "team": "a"}),
    # ORDER: a policy denial ends admission: the validating webhook (after it) is never called
    "policy-denial-skips-validating-webhook": Case(
        "ORDER", {"case": "1"}, policy=TEAM_A, code=422,
        message='configmaps "x" is forbidden: ValidatingAdmissionPolicy \'p\' with binding \'b\' denied request: '
                f"failed expression: {TEAM_A}"),
    # STRATEGY: ObjectMeta validation runs after mutation: a webhook can repair a bad label value
    "strategy-validates-the-mutated-object": Case("STRATEGY", {"case": "1", "team": "not valid!"},
                                                  [("/mutate/label/team/a", None)],
                                                  validating_sees={"case": "1", "team": "a"}),
    # STRATEGY: and before validating admission: an invalid object meets neither the policy nor the webhook
    "strategy-refuses-before-validating-admission": Case(
        "STRATEGY", {"case": "1", "team": "not valid!"}, policy="false", code=422,
        message='ConfigMap "x" is invalid: metadata.labels: Invalid value: "not valid!"'),
    # REINVOKE: IfNeeded, and a later webhook changed the object: called again, once
    "if-needed-is-reinvoked-after-a-later-change": Case(
        "REINVOKE", {"case": "1"}, [("/mutate/count", "IfNeeded"), ("/mutate/label/team/a", None)],
        validating_sees={"case": "1", "team": "a"}, mutate_calls={"/mutate/count": 2, "/mutate/label": 1}),
    # REINVOKE: Never (the default): not called again
    "never-is-not-reinvoked": Case(
        "REINVOKE", {"case": "1"}, [("/mutate/count", "Never"), ("/mutate/label/team/a", None)],
        validating_sees={"case": "1", "team": "a"}, mutate_calls={"/mutate/count": 1, "/mutate/label": 1}),
    # REINVOKE: IfNeeded, but nothing changed the object after it: not called again
    "if-needed-without-a-later-change-is-not-reinvoked": Case(
        "REINVOKE", {"case": "1"}, [("/mutate/label/team/a", None), ("/mutate/count", "IfNeeded")],
        validating_sees={"case": "1", "team": "a"}, mutate_calls={"/mutate/count": 1, "/mutate/label": 1}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_admission_order(client: httpx.Client, hooks: Hooks, case: Case) -> None:
    if case.mutating:
        mwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
               "metadata": {"name": "mutators"},
               "webhooks": [_hook(hooks, f"m{i}", path, policy) for i, (path, policy) in enumerate(case.mutating)]}
        assert client.post(f"{ADM}/mutatingwebhookconfigurations", json=mwc).status_code == 201
    vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": "recorder"}, "webhooks": [_hook(hooks, "v", "/validate/recorder")]}
    assert client.post(f"{ADM}/validatingwebhookconfigurations", json=vwc).status_code == 201
    if case.policy is not None:
        policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                  "metadata": {"name": "p"}, "spec": {
                      "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                              "operations": ["CREATE", "UPDATE"],
                                                              "resources": ["configmaps"]}]},
                      "validations": [{"expression": case.policy}]}}
        assert client.post(f"{ADM}/validatingadmissionpolicies", json=policy).status_code == 201
        binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                   "metadata": {"name": "b"}, "spec": {"policyName": "p", "validationActions": ["Deny"]}}
        assert client.post(f"{ADM}/validatingadmissionpolicybindings", json=binding).status_code == 201

    answer = client.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "x", "labels": case.labels}})

    assert answer.status_code == case.code, answer.text
    if case.code != 201:
        assert answer.json()["message"].startswith(case.message), answer.json()["message"]
        assert client.get(f"{CM}/x").status_code == 404
    seen = hooks.called("/validate/")
    if case.validating_sees is None:
        assert seen == []
    else:
        assert [r["object"]["metadata"]["labels"] for r in seen] == [case.validating_sees]
        assert answer.json()["metadata"]["labels"] == case.validating_sees
    for prefix, count in case.mutate_calls.items():
        assert len(hooks.called(prefix)) == count, prefix
    if "/mutate/count" in case.mutate_calls:
        assert answer.json()["metadata"]["annotations"]["calls"] == str(case.mutate_calls["/mutate/count"])


def test_delete_is_admitted_by_policies_before_validating_webhooks(client: httpx.Client, hooks: Hooks) -> None:
    """ORDER for DELETE: the delete handler runs mutating then validating admission with the
    stored object as oldObject (``staging/src/k8s.io/apiserver/pkg/registry/rest/delete.go``,
    ``AdmissionToValidateObjectDeleteFunc``): a policy's denial leaves the validating webhook
    uncalled and the object in place; without the policy the webhook sees the DELETE."""
    assert client.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                 "metadata": {"name": "kept", "labels": {"case": "1"}}}).status_code == 201
    hook = _hook(hooks, "v", "/validate/recorder")
    hook["rules"][0]["operations"] = ["DELETE"]
    vwc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": "recorder"}, "webhooks": [hook]}
    assert client.post(f"{ADM}/validatingwebhookconfigurations", json=vwc).status_code == 201
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": "p"}, "spec": {
                  "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                          "operations": ["DELETE"], "resources": ["configmaps"]}]},
                  "validations": [{"expression": "false", "message": "kept", "reason": "Forbidden"}]}}
    assert client.post(f"{ADM}/validatingadmissionpolicies", json=policy).status_code == 201
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "b"}, "spec": {"policyName": "p", "validationActions": ["Deny"]}}
    assert client.post(f"{ADM}/validatingadmissionpolicybindings", json=binding).status_code == 201

    refused = client.delete(f"{CM}/kept")
    assert refused.status_code == 403, refused.text
    assert hooks.called("/validate/") == []
    assert client.get(f"{CM}/kept").status_code == 200

    assert client.delete(f"{ADM}/validatingadmissionpolicybindings/b").status_code == 200
    assert client.delete(f"{CM}/kept").status_code == 200
    seen = hooks.called("/validate/")
    assert [(r["operation"], r["object"], r["oldObject"]["metadata"]["name"]) for r in seen] == [("DELETE", None, "kept")]


@pytest.mark.parametrize("kind", ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"])
@pytest.mark.parametrize("failure_policy,code", [("Fail", 500), ("Ignore", 201)])
def test_failure_policy_of_a_webhook_that_cannot_be_called(client: httpx.Client, hooks: Hooks, kind: str,
                                                           failure_policy: str, code: int) -> None:
    """failurePolicy (https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/#failure-policy):
    Fail refuses the request with kube-apiserver's ``ErrCallingWebhook`` text
    (``staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/errors/errors.go``, wrapped as
    an internal error: ``Internal error occurred: failed calling webhook "<name>": failed to
    call webhook: Post "<url>?timeout=<n>s": ...``), Ignore admits as if it were not there."""
    hook = _hook(hooks, "gone", "/none")
    hook["clientConfig"]["url"] = "https://127.0.0.1:1/none"
    hook["failurePolicy"] = failure_policy
    config = {"apiVersion": "admissionregistration.k8s.io/v1",
              "kind": "MutatingWebhookConfiguration" if kind.startswith("mutating") else "ValidatingWebhookConfiguration",
              "metadata": {"name": "gone"}, "webhooks": [hook]}
    assert client.post(f"{ADM}/{kind}", json=config).status_code == 201
    answer = client.post(CM, json={"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": "x", "labels": {"case": "1"}}})
    assert answer.status_code == code, answer.text
    if code == 500:
        assert answer.json()["reason"] == "InternalError"
        assert answer.json()["message"].startswith(
            'Internal error occurred: failed calling webhook "gone.example.com": failed to call webhook: '
            'Post "https://127.0.0.1:1/none?timeout=5s": '), answer.json()["message"]
