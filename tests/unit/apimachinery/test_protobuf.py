"""kubectl's protobuf request bodies decode to the JSON the API server would have received."""
import base64

import pytest

from trainyard.apimachinery.errors import ProtobufDecodeError
from trainyard.apimachinery.protobuf import decode_kubernetes_protobuf, is_kubernetes_protobuf


# -- a tiny protobuf encoder for the tests ---------------------------------------------------
def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def f_varint(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def f_bytes(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return varint(number << 3 | 2) + varint(len(data)) + data


def f_map(number: int, key: str, value: bytes | str) -> bytes:
    return f_bytes(number, f_bytes(1, key) + f_bytes(2, value))


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = f_bytes(1, api_version) + f_bytes(2, kind)
    return b"k8s\x00" + f_bytes(1, type_meta) + f_bytes(2, raw) + f_bytes(3, "") + f_bytes(4, "")


def object_meta(name: str, namespace: str = "", **extra: bytes) -> bytes:
    # Go always writes non-pointer strings, and an empty creationTimestamp
    return (f_bytes(1, name) + f_bytes(2, "") + f_bytes(3, namespace) + f_bytes(8, b"")
            + b"".join(extra.values()))


def test_configmap_as_kubectl_create_configmap_sends_it() -> None:
    raw = f_bytes(1, object_meta("x", "default")) + f_map(2, "a", "b") + f_map(2, "c", "")
    decoded = decode_kubernetes_protobuf(envelope("v1", "ConfigMap", raw))
    assert decoded == {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "x", "namespace": "default"}, "data": {"a": "b", "c": ""}}


def test_secret_bytes_are_base64_like_json() -> None:
    raw = f_bytes(1, object_meta("s")) + f_map(2, "token", b"\x00\xffhi") + f_bytes(3, "Opaque")
    decoded = decode_kubernetes_protobuf(envelope("v1", "Secret", raw))
    assert decoded["data"] == {"token": base64.b64encode(b"\x00\xffhi").decode()}
    assert decoded["type"] == "Opaque"


def test_namespace_and_service_account() -> None:
    namespace = decode_kubernetes_protobuf(envelope("v1", "Namespace", f_bytes(1, object_meta("team")) + f_bytes(2, b"") + f_bytes(3, b"")))
    assert namespace == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}, "spec": {}, "status": {}}
    account = decode_kubernetes_protobuf(envelope("v1", "ServiceAccount", f_bytes(1, object_meta("sa", "ns")) + f_varint(4, 0)))
    assert account["automountServiceAccountToken"] is False  # a pointer: false is meaningful


def test_pod_from_kubectl_run() -> None:
    resources = f_map(2, "cpu", f_bytes(1, "500m"))  # requests: Quantity{string=1}
    env_from_field = f_bytes(3, f_bytes(1, f_bytes(2, "metadata.name")))  # valueFrom.fieldRef.fieldPath
    container = (f_bytes(1, "node") + f_bytes(2, "busybox") + f_bytes(3, "sh") + f_bytes(3, "-c")
                 + f_bytes(4, "echo hi") + f_bytes(6, f_varint(3, 29500) + f_bytes(4, "TCP"))
                 + f_bytes(7, f_bytes(1, "A") + f_bytes(2, "1")) + f_bytes(7, f_bytes(1, "POD") + env_from_field)
                 + f_bytes(8, resources) + f_bytes(9, f_bytes(1, "data") + f_bytes(3, "/data"))
                 + f_varint(16, 0) + f_bytes(14, "IfNotPresent"))
    volume = f_bytes(1, "data") + f_bytes(2, f_bytes(2, b""))  # volumeSource.emptyDir = {}
    spec = (f_bytes(1, volume) + f_bytes(2, container) + f_bytes(3, "Never") + f_bytes(6, "ClusterFirst")
            + f_varint(4, 0) + f_bytes(7, f_bytes(1, "zone") + f_bytes(2, "a")))
    labels = f_map(11, "run", "p")
    raw = f_bytes(1, object_meta("p", "default", labels=labels)) + f_bytes(2, spec) + f_bytes(3, b"")
    pod = decode_kubernetes_protobuf(envelope("v1", "Pod", raw))
    assert pod["metadata"] == {"name": "p", "namespace": "default", "labels": {"run": "p"}}
    assert pod["spec"] == {
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [{
            "name": "node", "image": "busybox", "command": ["sh", "-c"], "args": ["echo hi"],
            "ports": [{"containerPort": 29500, "protocol": "TCP"}],
            "env": [{"name": "A", "value": "1"}, {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            "resources": {"requests": {"cpu": "500m"}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            "imagePullPolicy": "IfNotPresent",
        }],
        "restartPolicy": "Never", "dnsPolicy": "ClusterFirst",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {"zone": "a"},
    }
    assert pod["status"] == {}


def test_job_from_kubectl_create_job_keeps_pointer_zeros_and_times() -> None:
    template = f_bytes(1, object_meta("")) + f_bytes(2, f_bytes(2, f_bytes(1, "c") + f_bytes(2, "img")) + f_bytes(3, "Never"))
    job_spec = f_varint(1, 1) + f_varint(7, 0) + f_bytes(6, template)  # parallelism 1, backoffLimit 0
    created = f_bytes(8, f_varint(1, 1735787045))  # 2025-01-02T03:04:05Z
    meta = f_bytes(1, "j") + f_bytes(3, "default") + created + f_varint(7, 0)
    job = decode_kubernetes_protobuf(envelope("batch/v1", "Job", f_bytes(1, meta) + f_bytes(2, job_spec)))
    assert job["metadata"] == {"name": "j", "namespace": "default", "creationTimestamp": "2025-01-02T03:04:05Z"}
    assert job["spec"]["parallelism"] == 1 and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"] == {"metadata": {}, "spec": {"containers": [{"name": "c", "image": "img"}],
                                                                "restartPolicy": "Never"}}


def test_int_or_string_and_unknown_fields_are_handled() -> None:
    port = f_bytes(1, "http") + f_varint(3, 80) + f_bytes(4, f_varint(1, 1) + f_bytes(3, "web")) + f_bytes(99, "future")
    service = f_bytes(1, object_meta("svc")) + f_bytes(2, f_bytes(1, port) + f_bytes(3, "None"))
    decoded = decode_kubernetes_protobuf(envelope("v1", "Service", service))
    assert decoded["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "web"}]
    assert decoded["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{}", "missing the k8s"),
        (envelope("v1", "Frobnicator", b""), "kind 'Frobnicator'"),
        (b"k8s\x00" + f_bytes(1, b"\x0a\x05v1"), "truncated"),
        (envelope("v1", "ConfigMap", varint(2 << 3 | 3)), "unsupported wire type"),
        (envelope("v1", "ConfigMap", f_bytes(1, f_bytes(1, b"\xff\xfe"))), "ConfigMap.metadata|ObjectMeta.name"),
        (b"k8s\x00" + f_bytes(1, f_bytes(1, "v1") + f_bytes(2, "ConfigMap")) + f_bytes(3, "gzip"), "contentEncoding"),
    ],
)
def test_malformed_bodies_raise_a_clear_error(body: bytes, message: str) -> None:
    with pytest.raises(ProtobufDecodeError, match=message):
        decode_kubernetes_protobuf(body)


def test_magic_detection() -> None:
    assert is_kubernetes_protobuf(b"k8s\x00rest")
    assert not is_kubernetes_protobuf(b'{"kind":"Pod"}')
