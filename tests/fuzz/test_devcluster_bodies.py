"""Property-based fuzzing of devcluster request bodies, against the real server process over HTTPS.

Every fuzzed request (JSON, YAML and protobuf bodies; json, merge, strategic-merge and apply
patches) to the create, update, patch, status and scale endpoints of a TrainJob, a JobSet, a
ConfigMap and a Deployment must be answered with a success or a proper 4xx ``Status`` (kind
Status, a reason, a message; a 422 names its fields): never a 5xx, never a dead server, and a
rejected request leaves the stored object exactly as it was (resourceVersion and content).
"""
from __future__ import annotations

import json
import os
import ssl
from pathlib import Path

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from fixtures.fuzz_strategies import json_values, paths_of, replaced

from fixtures.devcluster import start_devcluster

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
EXAMPLES = int(os.environ.get("TRAINYARD_FUZZ_EXAMPLES", "0"))


def fuzz_settings(default: int) -> settings:
    return settings(max_examples=EXAMPLES or default, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=True)


TRAINJOB = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": "seed", "namespace": "default", "labels": {"app": "fuzz"}},
            "spec": {"runtimeRef": {"name": "torch-distributed"},
                     "trainer": {"numNodes": 2, "image": "busybox", "command": ["sleep", "1"],
                                 "env": [{"name": "A", "value": "1"}],
                                 "resourcesPerNode": {"limits": {"cpu": "1", "memory": "1Gi"}}}}}
JOBSET = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "metadata": {"name": "seed", "namespace": "default"},
          "spec": {"replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {
              "parallelism": 1, "completions": 1, "backoffLimit": 0,
              "template": {"spec": {"restartPolicy": "Never",
                                    "containers": [{"name": "node", "image": "busybox", "command": ["true"]}]}}}}}]}}
CONFIGMAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seed", "namespace": "default",
                                                                   "annotations": {"a": "b"}},
             "data": {"key": "value", "other": "x"}}
DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment",
              "metadata": {"name": "seed", "namespace": "default"},
              "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "seed"}},
                       "template": {"metadata": {"labels": {"app": "seed"}},
                                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}

RV = b"__RV__"


def template(seed: dict) -> dict:
    """The seed as fuzzed bodies start from it: a placeholder for the current resourceVersion."""
    return dict(seed, metadata=dict(seed["metadata"], resourceVersion=RV.decode()))


KINDS = {
    "TrainJob": ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", TRAINJOB, False),
    "JobSet": ("/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets", JOBSET, False),
    "ConfigMap": ("/api/v1/namespaces/default/configmaps", CONFIGMAP, True),
    "Deployment": ("/apis/apps/v1/namespaces/default/deployments", DEPLOYMENT, True),
}


# ---------------------------------------------------------------------------- the server


class Server:
    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.client = httpx.Client(base_url=cluster.url, timeout=30,
                                   verify=ssl.create_default_context(cafile=str(cluster.ca_cert)),
                                   headers={"Authorization": f"Bearer {cluster.token}"})
        self.seeds: dict[str, dict] = {}  # what is stored now, to compare after a rejection

    def with_rv(self, kind: str, body: bytes) -> bytes:
        """Bodies are drawn from the fixed templates (hypothesis needs the same draws for the same
        choices); the placeholder becomes the stored object's resourceVersion here."""
        rv = self.seeds[kind]["metadata"]["resourceVersion"].encode()
        return body.replace(b'"' + RV + b'"', b'"' + rv + b'"').replace(RV, b'"' + rv + b'"')

    def alive(self) -> bool:
        return self.cluster.process.poll() is None

    def get(self, kind: str) -> dict:
        response = self.client.get(f"{KINDS[kind][0]}/seed")
        assert response.status_code == 200, response.text
        return response.json()

    def send(self, method: str, path: str, body: bytes, content_type: str, query: dict | None = None) -> httpx.Response:
        return self.client.request(method, path, content=body, params=query or {},
                                   headers={"Content-Type": content_type})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cluster = start_devcluster(tmp_path_factory.mktemp("fuzz-devcluster") / "data")
    try:
        srv = Server(cluster)
        for name in ("trainer.kubeflow.org_trainjobs.yaml", "jobset.x-k8s.io_jobsets.yaml"):
            crd = yaml.safe_load((CRDS / name).read_text())
            answer = srv.client.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
            assert answer.status_code == 201, answer.text
        for kind, (path, seed, _) in KINDS.items():
            answer = srv.client.post(path, json=seed)
            assert answer.status_code == 201, (kind, answer.text)
            srv.seeds[kind] = answer.json()
        yield srv
        srv.client.close()
        assert cluster.process.poll() is None, "devcluster died during fuzzing"
    finally:
        cluster.stop()


def check_answer(srv: Server, kind: str, response: httpx.Response, what: str) -> None:
    """The properties every fuzzed request must keep."""
    assert srv.alive(), f"devcluster died on {what}"
    stored = srv.get(kind)
    before, srv.seeds[kind] = srv.seeds[kind], stored  # what is stored now is the next reference
    assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:2000]}"
    if response.status_code >= 400:
        assert response.headers.get("content-type", "").startswith("application/json"), (what, response.text[:500])
        status = response.json()
        assert status.get("kind") == "Status" and status.get("status") == "Failure", (what, status)
        assert status.get("code") == response.status_code, (what, status)
        assert status.get("reason") and isinstance(status["reason"], str), (what, status)
        assert status.get("message") and isinstance(status["message"], str), (what, status)
        if status["reason"] == "Invalid" and (status.get("details") or {}).get("causes"):
            for cause in status["details"]["causes"]:
                if cause.get("field"):
                    assert cause["field"] in status["message"], (what, status)
    else:  # an accepted write is answered in strict JSON (no NaN or Infinity: Go clients refuse those)
        json.loads(response.content, parse_constant=refuse_constant)
    if response.status_code >= 400:
        assert stored == before, f"{what}: rejected ({status['message']}) but the stored object changed"


def refuse_constant(name: str):
    raise AssertionError(f"{name} in an answer: not JSON")


# ---------------------------------------------------------------------------- strategies

@st.composite
def mutated(draw, seed: dict) -> dict:
    """The seed with one value anywhere in it replaced by a random one (wrong types at every level)."""
    paths = paths_of(seed)
    path = draw(st.sampled_from(paths[1:]))
    return replaced(seed, path, draw(json_values))


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


@st.composite
def json_bodies(draw, seed: dict) -> bytes:
    text = json.dumps(seed)
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.binary(max_size=300))
    if choice == 1:  # a truncated valid body
        return text[:draw(st.integers(0, len(text) - 1))].encode()
    if choice == 2:  # deep nesting, in a field and as the whole body
        depth = draw(st.sampled_from([50, 900, 5000, 200_000]))
        return (text[:-1] + ', "spec": ' + nested(depth) + "}").encode() if draw(st.booleans()) else \
            nested(depth).encode()
    if choice == 3:  # huge numbers and the literals Go's JSON refuses
        number = draw(st.sampled_from(["1e400", "-1e400", "1" * 5000, "NaN", "Infinity", "-Infinity",
                                       "123456789012345678901234567890", "0.1e-400", "-0"]))
        path = draw(st.sampled_from(paths_of(seed)[1:]))
        marker = "__NUMBER__"
        return json.dumps(replaced(seed, path, marker)).replace(f'"{marker}"', number).encode()
    if choice == 4:  # duplicate keys
        key = draw(st.sampled_from(["kind", "apiVersion", "metadata", "spec", "data"]))
        value = json.dumps(draw(json_values))
        return (text[:-1] + f', "{key}": {value}}}').encode()
    if choice == 5:  # unicode: lone surrogates, NUL, odd code points in names and values
        odd = draw(st.sampled_from(["\\ud800", "\\udfff", "\\u0000", "\u202e", "\U0001f600", "\\ufffe"]))
        path = draw(st.sampled_from(paths_of(seed)[1:]))
        marker = "__ODD__"
        return json.dumps(replaced(seed, path, marker)).replace(marker, odd).encode()
    if choice == 6:  # a valid object with a random value at a random place
        return json.dumps(draw(mutated(seed))).encode()
    if choice == 7:  # not an object
        return json.dumps(draw(json_values)).encode()
    if choice == 8:  # a key inserted anywhere
        paths = [p for p in paths_of(seed) if isinstance(value_at(seed, p), dict)]
        path = draw(st.sampled_from(paths))
        target = json.loads(text)
        node = value_at(target, path)
        node[draw(st.text(max_size=10))] = draw(json_values)
        return json.dumps(target).encode()
    return (text + draw(st.sampled_from(["", " ", "x", "{}", "]", "\x00"]))).encode()


def value_at(value, path):
    for step in path:
        value = value[step]
    return value


class YamlBomb:
    """A bounded alias bomb: ``levels`` anchors, each a list of ``width`` aliases to the previous one."""

    @staticmethod
    def text(levels: int, width: int) -> str:
        lines = ['apiVersion: v1', 'kind: ConfigMap', 'metadata: {name: seed, namespace: default}', 'x:',
                 '  a0: &a0 ["lol"]']
        for level in range(1, levels):
            lines.append(f"  a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
        lines.append(f"data: {{key: value, bomb: *a{levels - 1}}}")
        return "\n".join(lines) + "\n"


@st.composite
def yaml_bodies(draw, seed: dict) -> bytes:
    text = yaml.safe_dump(seed)
    choice = draw(st.integers(0, 6))
    if choice == 0:
        return YamlBomb.text(draw(st.integers(2, 9)), draw(st.integers(2, 10))).encode()
    if choice == 1:  # tags: python objects, binary, timestamps, sets, odd floats
        tag = draw(st.sampled_from(["!!binary aGVsbG8=", "2001-12-14t21:59:43.10-05:00", "!!set {a, b}",
                                    "!!python/object:os.system {}", "!!float .nan", "!!float .inf",
                                    "!!int 0x_ff", "!!timestamp 2002-12-14", "!custom x", "!!omap [a: 1]",
                                    "!!str", "~", "!!null ''", "!!pairs [a: 1, a: 2]", "2020-01-01"]))
        path = draw(st.sampled_from(paths_of(seed)[1:]))
        marker = "__TAGGED__"
        return yaml.safe_dump(replaced(seed, path, marker)).replace(f"{marker}", tag).encode()
    if choice == 2:  # several documents
        return (text + "---\n" + draw(st.sampled_from([text, "kind: Secret\n", "", "- 1\n"]))).encode()
    if choice == 3:
        return draw(st.binary(max_size=200))
    if choice == 4:
        return yaml.safe_dump(draw(mutated(seed))).encode()
    if choice == 5:  # a truncated document
        return text[:draw(st.integers(1, len(text) - 1))].encode()
    return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")


MAGIC = b"k8s\x00"


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field_bytes(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def configmap_protobuf() -> bytes:
    """``k8s\\x00`` + runtime.Unknown{typeMeta, raw: ConfigMap{metadata{name, namespace}, data}}."""
    meta = field_bytes(1, b"seed") + field_bytes(3, b"default")
    entry = field_bytes(1, b"key") + field_bytes(2, b"value")
    raw = field_bytes(1, meta) + field_bytes(2, entry)
    type_meta = field_bytes(1, b"v1") + field_bytes(2, b"ConfigMap")
    return MAGIC + field_bytes(1, type_meta) + field_bytes(2, raw)


@st.composite
def protobuf_bodies(draw) -> bytes:
    valid = configmap_protobuf()
    choice = draw(st.integers(0, 4))
    if choice == 0:
        return draw(st.binary(max_size=200))
    if choice == 1:
        return MAGIC + draw(st.binary(max_size=200))
    if choice == 2:  # a valid envelope cut short
        return valid[:draw(st.integers(0, len(valid) - 1))]
    if choice == 3:  # one byte of a valid envelope changed
        index = draw(st.integers(len(MAGIC), len(valid) - 1))
        return valid[:index] + bytes([draw(st.integers(0, 255))]) + valid[index + 1:]
    # a valid envelope with junk appended (fields of random numbers and wire types)
    return valid + draw(st.binary(min_size=1, max_size=40))


def pointers(seed: dict) -> list[str]:
    def escape(step) -> str:
        return str(step).replace("~", "~0").replace("/", "~1")
    return ["/" + "/".join(escape(s) for s in path) if path else "" for path in paths_of(seed)]


@st.composite
def json_patches(draw, seed: dict) -> bytes:
    if draw(st.integers(0, 5)) == 0:
        return draw(json_bodies(seed))
    ops = []
    for _ in range(draw(st.integers(0, 4))):
        op = {"op": draw(st.one_of(st.sampled_from(["add", "remove", "replace", "move", "copy", "test"]),
                                   st.text(max_size=6), json_values)),
              "path": draw(st.one_of(st.sampled_from(pointers(seed)),
                                     st.sampled_from(["/spec/-", "/metadata/~2", "/data/x/y", "x", "/", "/-",
                                                      "/metadata/resourceVersion", "/metadata/name", "/kind"]),
                                     st.text(max_size=10), json_values))}
        if draw(st.booleans()):
            op["value"] = draw(json_values)
        if draw(st.booleans()):
            op["from"] = draw(st.one_of(st.sampled_from(pointers(seed)), st.text(max_size=6), json_values))
        if draw(st.integers(0, 4)) == 0:
            op = draw(json_values)
        ops.append(op)
    return json.dumps(ops).encode()


@st.composite
def merge_patches(draw, seed: dict) -> bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(json_bodies(seed))
    if choice == 1:
        return json.dumps(draw(json_values)).encode()
    patch = draw(mutated(seed))
    # a merge patch sends only part of the object: keep a random subset of top-level keys
    keys = draw(st.lists(st.sampled_from(sorted(patch)), unique=True, max_size=len(patch)))
    return json.dumps({k: patch[k] for k in keys}).encode()


DIRECTIVES = st.sampled_from(["$patch", "$retainKeys", "$setElementOrder/containers", "$setElementOrder/env",
                              "$deleteFromPrimitiveList/finalizers", "$setElementOrder/finalizers",
                              "$setElementOrder/data", "$patch/x", "$retainKeys/x"])
DIRECTIVE_VALUES = st.one_of(st.sampled_from(["delete", "replace", "merge", "bogus", ""]), json_values,
                             st.lists(st.one_of(st.text(max_size=5), st.dictionaries(st.sampled_from(["name", "x"]),
                                                                                     json_values, max_size=2)),
                                      max_size=3))


@st.composite
def strategic_patches(draw, seed: dict) -> bytes:
    if draw(st.integers(0, 3)) == 0:
        return draw(merge_patches(seed))
    patch = json.loads(json.dumps(seed))
    patch["metadata"].pop("resourceVersion", None)
    dicts = [p for p in paths_of(patch) if isinstance(value_at(patch, p), dict)]
    for _ in range(draw(st.integers(1, 3))):
        where = value_at(patch, draw(st.sampled_from(dicts)))
        where[draw(DIRECTIVES)] = draw(DIRECTIVE_VALUES)
    lists = [p for p in paths_of(patch) if isinstance(value_at(patch, p), list)]
    if lists and draw(st.booleans()):
        value_at(patch, draw(st.sampled_from(lists))).append(
            {"$patch": draw(st.sampled_from(["delete", "replace", "merge", 1])), "name": draw(st.text(max_size=4))})
    return json.dumps(patch).encode()


@st.composite
def apply_requests(draw, seed: dict) -> tuple[bytes, str, dict]:
    config = json.loads(json.dumps(seed))
    for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
        config["metadata"].pop(key, None)
    config.pop("status", None)
    choice = draw(st.integers(0, 3))
    if choice == 0:
        body = draw(json_bodies(config))
    elif choice == 1:
        body = yaml.safe_dump(draw(mutated(config))).encode()
    elif choice == 2:
        body = draw(yaml_bodies(config))
    else:
        body = json.dumps(draw(mutated(config))).encode()
    query = {}
    manager = draw(st.one_of(st.none(), st.sampled_from(["fuzz", "", "x" * 129, "kubectl", "\u00e9t\u00e9", " "]),
                             st.text(max_size=20)))
    if manager is not None:
        query["fieldManager"] = manager
    force = draw(st.one_of(st.none(), st.sampled_from(["true", "false", "yes", "1", "", "TRUE"]), st.text(max_size=5)))
    if force is not None:
        query["force"] = force
    content_type = draw(st.sampled_from(["application/apply-patch+yaml", "application/apply-patch+json"]))
    return body, content_type, query


def clean_text(text: str) -> str:
    """httpx encodes query values as UTF-8: lone surrogates cannot be sent at all."""
    return text.encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------------------- the fuzzers

SUBRESOURCES = st.sampled_from(["", "", "/status", "/scale"])


@fuzz_settings(90)
@given(data=st.data())
def test_create_and_update_bodies_in_json_yaml_and_protobuf(server, fuzz_count, data):
    kind = data.draw(st.sampled_from(sorted(KINDS)), label="kind")
    path, seed, _ = KINDS[kind]
    seed = template(seed)
    encoding = data.draw(st.sampled_from(["json", "json", "json", "yaml", "protobuf"]), label="encoding")
    if encoding == "json":
        body, content_type = data.draw(json_bodies(seed), label="body"), "application/json"
    elif encoding == "yaml":
        body, content_type = data.draw(yaml_bodies(seed), label="body"), "application/yaml"
    else:
        body, content_type = data.draw(protobuf_bodies(), label="body"), "application/vnd.kubernetes.protobuf"
    verb = data.draw(st.sampled_from(["POST", "PUT"]), label="verb")
    target = path if verb == "POST" else f"{path}/seed{data.draw(SUBRESOURCES, label='subresource')}"
    fuzz_count(f"devcluster {encoding} bodies")
    body = server.with_rv(kind, body)
    response = server.send(verb, target, body, content_type)
    check_answer(server, kind, response, f"{verb} {target} {content_type} {body[:300]!r}")
    if verb == "POST" and response.status_code == 201:  # an accepted create (another name): remove it again
        name = response.json()["metadata"]["name"]
        if name != "seed":
            server.client.delete(f"{path}/{name}")


@fuzz_settings(90)
@given(data=st.data())
def test_patches_of_every_type(server, fuzz_count, data):
    kind = data.draw(st.sampled_from(sorted(KINDS)), label="kind")
    path, seed, _ = KINDS[kind]
    seed = template(seed)
    patch_type = data.draw(st.sampled_from(["json", "merge", "strategic", "apply"]), label="patch type")
    query: dict = {}
    if patch_type == "json":
        body, content_type = data.draw(json_patches(seed), label="patch"), "application/json-patch+json"
    elif patch_type == "merge":
        body, content_type = data.draw(merge_patches(seed), label="patch"), "application/merge-patch+json"
    elif patch_type == "strategic":
        body, content_type = data.draw(strategic_patches(seed), label="patch"), "application/strategic-merge-patch+json"
    else:
        body, content_type, query = data.draw(apply_requests(seed), label="apply")
        query = {k: clean_text(v) for k, v in query.items()}
    target = f"{path}/seed{data.draw(SUBRESOURCES, label='subresource')}"
    fuzz_count(f"devcluster {patch_type} patches")
    body = server.with_rv(kind, body)
    response = server.send("PATCH", target, body, content_type, query)
    check_answer(server, kind, response, f"PATCH {target} {content_type} {query} {body[:300]!r}")


# ---------------------------------------------------------------------------- found by the fuzzers

CM = "/api/v1/namespaces/default/configmaps"
JS = KINDS["JobSet"][0]
BOMB = YamlBomb.text(9, 10)  # 10**8 values once expanded, from under 1 KiB


@pytest.mark.parametrize("method,path,content_type,body,code,text", [
    # a lone surrogate could neither be stored nor answered (the Status itself failed: a bare 500)
    ("POST", CM, "application/json", b'{"apiVersion": "\\ud800", "kind": "ConfigMap", "metadata": {"name": "s"}}',
     400, "the API version in the data (\ufffd) does not match"),
    ("POST", CM, "application/json", b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": 1e400}',
     400, "out of range"),
    ("POST", CM, "application/json", b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": 5}',
     400, "metadata must be a JSON object"),
    ("POST", CM, "application/json", b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "n"}, '
                                     b'"data": {"a": NaN}}', 400, "NaN is not JSON"),
    ("POST", JS, "application/json", b'{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", '
                                     b'"metadata": {"name": ["x", 1]}}', 400, "metadata.name: must be a string"),
    ("PATCH", CM + "/seed?fieldManager=fuzz", "application/apply-patch+yaml",
     b"apiVersion:\n- null\nkind: ConfigMap\nmetadata:\n  name: seed\n", 400, "apiVersion: must be a string"),
    ("POST", CM, "application/yaml", BOMB.encode(), 400, "excessive aliasing"),
    ("POST", CM, "application/yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: loop}\nx: &a [*a]\n",
     400, "contains itself"),
    ("POST", CM, "application/yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\nbinaryData: "
                                     b"{k: !!binary aGVsbG8=}\n", 400, "has no JSON value"),
    ("POST", CM, "application/yaml", b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: f}\ndata: {k: .inf}\n",
     400, "has no JSON form"),
    ("POST", "/api/v1/namespaces/default/serviceaccounts/default/token", "application/json",
     b'{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": "x"}', 422,
     "spec: Invalid value: must be an object"),
    ("DELETE", CM + "/seed?dryRun=All", "application/json", b'{"preconditions": 5}', 400,
     "DeleteOptions.preconditions: must be an object"),
    ("DELETE", CM + "/seed?dryRun=All", "application/json", b'{"preconditions": {"uid": 1e400}}', 400,
     "out of range"),
    # an apply body of 5000 digits: not JSON (Python's int limit), then a ValueError out of YAML
    ("PATCH", CM + "/seed?fieldManager=fuzz", "application/apply-patch+yaml",
     b'{"apiVersion": ' + b"1" * 5000 + b"}", 400, "Exceeds the limit"),
    # an integer beyond int64 reached a CEL rule: cel-python's "overflow" ValueError (the
    # startupPolicy makes the spec's rule reach replicatedJobs: without it the rule is decided
    # from its has() term, without CEL)
    ("PATCH", JS + "/seed", "application/merge-patch+json",
     b'{"spec": {"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": 9223372036854775808}}',
     422, "overflow"),
    # a Secret whose data (a map) arrives as a number: TypeError in the decoder
    ("POST", "/api/v1/namespaces/default/secrets", "application/vnd.kubernetes.protobuf",
     b"k8s\x00\n\x0c\n\x02v1\x12\x06Secret\x12\x02\x10\x08", 400, "expected a map entry"),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "application/json",
     b'{"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": true, "spec": {}}',
     400, "metadata must be a JSON object"),
])
def test_found_bad_bodies_get_a_clear_4xx(server, method, path, content_type, body, code, text):
    before = server.get("ConfigMap")
    path, _, query = path.partition("?")
    response = server.send(method, path, body, content_type, dict([query.split("=")]) if query else None)
    assert response.status_code == code, response.text
    status = response.json()
    assert status["kind"] == "Status" and text in status["message"], status
    assert server.get("ConfigMap") == before


def test_a_yaml_timestamp_is_the_string_it_is_written_as(server):
    body = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: dated}\ndata: {day: 2020-01-01}\n"
    response = server.send("POST", CM, body, "application/yaml")
    assert response.status_code == 201, response.text
    assert response.json()["data"] == {"day": "2020-01-01"}
    server.client.delete(f"{CM}/dated")


def test_a_warning_about_a_field_named_with_control_characters_is_still_answered(server):
    # the Warning header held the raw control character: aiohttp dropped the connection
    body = b'{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "warned", "a\\u0004b": 1}}'
    response = server.send("POST", CM, body, "application/json")
    assert response.status_code == 201, response.text
    assert 'metadata.a\\u0004b' in response.headers["warning"]
    server.client.delete(f"{CM}/warned")


# ---------------------------------------------------------------------------- other request bodies

TOKEN_REQUEST = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                 "spec": {"audiences": ["fuzz"], "expirationSeconds": 3600,
                          "boundObjectRef": {"kind": "ConfigMap", "apiVersion": "v1", "name": "seed"}}}
DELETE_OPTIONS = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background",
                  "gracePeriodSeconds": 0, "preconditions": {"uid": "x", "resourceVersion": "1"}, "dryRun": ["All"]}
BINDING = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "seed"}, "target": {"kind": "Node", "name": "n"}}
REVIEW = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
          "spec": {"resourceAttributes": {"namespace": "default", "verb": "get", "resource": "configmaps"}}}
OTHER = {
    "token": ("POST", "/api/v1/namespaces/default/serviceaccounts/default/token", TOKEN_REQUEST),
    "delete options": ("DELETE", "/api/v1/namespaces/default/configmaps/seed", DELETE_OPTIONS),
    "binding": ("POST", "/api/v1/namespaces/default/pods/seed/binding", BINDING),
    "access review": ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", REVIEW),
}
SELECTORS = st.one_of(st.text(max_size=20), st.sampled_from(
    ["a in (b", "a notin ()", "!a,b", "a=b,,", "metadata.name=seed", "spec.x=1", "a==b==c", "a=" + "x" * 300,
     "status.phase!=Running", "a in (b,c),!d", "=", "!", "a,b=", "metadata.name in (x)"]))


@fuzz_settings(60)
@given(data=st.data())
def test_delete_options_token_binding_review_bodies_and_selectors(server, fuzz_count, data):
    which = data.draw(st.sampled_from(sorted(OTHER) + ["selectors"]), label="endpoint")
    if which == "selectors":
        fuzz_count("devcluster list selectors")
        query = {key: clean_text(data.draw(SELECTORS, label=key))
                 for key in data.draw(st.lists(st.sampled_from(["labelSelector", "fieldSelector"]), min_size=1,
                                               max_size=2, unique=True), label="keys")}
        response = server.client.get(KINDS[data.draw(st.sampled_from(sorted(KINDS)), label="kind")][0], params=query)
        check_answer(server, "ConfigMap", response, f"list {query}")
        return
    method, path, seed = OTHER[which]
    body = data.draw(json_bodies(seed), label="body")
    query = {"dryRun": "All"} if which == "delete options" else {}  # the seed ConfigMap stays
    fuzz_count(f"devcluster {which} bodies")
    response = server.send(method, path, body, "application/json", query)
    check_answer(server, "ConfigMap", response, f"{method} {path} {body[:300]!r}")


# ---------------------------------------------------------------------------- the protobuf decoder


@st.composite
def protobuf_objects(draw) -> bytes:
    """A valid envelope naming a supported kind whose object bytes are random fields: numbers,
    wire types, lengths and nested payloads the decoder has to survive."""
    from trainyard.apimachinery.protobuf import supported_kinds
    api_version, kind = draw(st.sampled_from(supported_kinds()))
    fields = b""
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 20))
        wire = draw(st.sampled_from([0, 1, 2, 5, 3, 7]))
        if wire == 2:
            payload = draw(st.one_of(st.binary(max_size=30), st.builds(
                lambda n, p: field_bytes(n, p), st.integers(1, 12), st.binary(max_size=12))))
            fields += varint(number << 3 | 2) + varint(len(payload) + draw(st.sampled_from([0, 0, 0, 1, 50]))) + payload
        else:
            fields += varint(number << 3 | wire) + draw(st.binary(min_size=0, max_size=9))
    type_meta = field_bytes(1, api_version.encode()) + field_bytes(2, kind.encode())
    return MAGIC + field_bytes(1, type_meta) + field_bytes(2, fields)


@fuzz_settings(400)
@given(body=protobuf_objects())
def test_the_protobuf_decoder_only_ever_refuses_with_its_own_error(fuzz_count, body):
    """What devcluster calls for every protobuf body: a decoded object or ProtobufDecodeError
    (answered 400); any other exception would be a 500."""
    from trainyard.apimachinery.errors import ProtobufDecodeError
    from trainyard.apimachinery.protobuf import decode_kubernetes_protobuf
    fuzz_count("protobuf decoder (in-process)")
    try:
        decoded = decode_kubernetes_protobuf(body)
    except ProtobufDecodeError:
        return
    json.dumps(decoded, allow_nan=False).encode("utf-8")  # and what it decodes is JSON


# ---------------------------------------------------------------------------- patch machinery in-process

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "seed", "namespace": "default",
                                                       "labels": {"a": "b"}, "finalizers": ["x", "y"]},
       "spec": {"containers": [{"name": "c", "image": "busybox", "env": [{"name": "A", "value": "1"}],
                                "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                               {"name": "d", "image": "busybox"}],
                "volumes": [{"name": "v", "emptyDir": {}}], "tolerations": [{"key": "k", "operator": "Exists"}]}}


@fuzz_settings(300)
@given(data=st.data())
def test_the_patch_machinery_only_ever_refuses_with_a_status(fuzz_count, data):
    """What devcluster runs for every PATCH (json, merge, strategic) and apply, called directly
    with many more patches than go over HTTP: a result or a 4xx ApiError, never another error."""
    from trainyard_services.devcluster.apiserver.registry import machinery
    from trainyard_services.devcluster.apiserver.errors import ApiError
    from trainyard_services.devcluster.apiserver.registry.kinds import Registry
    from trainyard_services.devcluster.apiserver.registry.store import Api, WriteOptions
    from trainyard_services.devcluster.apiserver.registry.bodies import check_body

    registry = Registry()
    kind = data.draw(st.sampled_from(["Pod", "ConfigMap", "Deployment"]), label="kind")
    rt = {"Pod": registry.lookup("", "v1", "pods"), "ConfigMap": registry.lookup("", "v1", "configmaps"),
          "Deployment": registry.lookup("apps", "v1", "deployments")}[kind]
    live = {"Pod": POD, "ConfigMap": CONFIGMAP, "Deployment": DEPLOYMENT}[kind]
    patch_type = data.draw(st.sampled_from(["json", "merge", "strategic", "apply"]), label="patch type")
    fuzz_count(f"patch machinery (in-process) {patch_type}")
    try:
        if patch_type == "apply":
            body, _, query = data.draw(apply_requests(live), label="apply")
            opts = WriteOptions(manager=clean_text(query.get("fieldManager") or "fuzz"), force=query.get("force") == "true")
            api = Api(None, registry)  # the checks Api._apply makes before applying (no store needed)
            config = api._prune_config(rt, check_body(rt, machinery.parse_apply_body(body)), opts)
            result = machinery.server_side_apply(rt, json.loads(json.dumps(live)), config, opts)
            json.dumps(result.object, allow_nan=False)
            return
        body = data.draw({"json": json_patches, "merge": merge_patches, "strategic": strategic_patches}[patch_type](live),
                         label="patch")
        patched = machinery.apply_patch(rt, patch_type, json.loads(json.dumps(live)), body)
        json.dumps(patched, allow_nan=False)
    except ApiError as err:
        assert 400 <= err.code < 500 and err.message, (err.code, err.message)
    except RecursionError:  # the server answers 400 "the request body is nested too deeply"
        pass
