"""No key material on the bus (docs/security.md): an MPI TrainJob runs through the four real
services on a real nats-server and devcluster; its SSH key Secret is made, with upstream's
shape, and then neither any stream message, any KV entry nor any byte of the JetStream store
on disk holds the private key (its PEM header, its base64 as in the Secret, or any line of
its PEM body). The Secret is created once and kept when the TrainJob is planned again."""
from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import yaml

from integration.services.conftest import JOBSETS, TRAINJOBS, CTR, bus_call, stream_messages, wait_for

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[3]
SECRETS = "/api/v1/namespaces/{ns}/secrets"


def key_material(secret: dict) -> list[bytes]:
    """Every form in which the Secret's private key could have been stored."""
    private_b64 = secret["data"]["ssh-privatekey"]
    pem = base64.b64decode(private_b64)
    body_lines = [line for line in pem.splitlines() if line and not line.startswith(b"-----")]
    assert pem.startswith(b"-----BEGIN EC PRIVATE KEY-----") and len(body_lines) >= 3
    return [b"PRIVATE KEY", private_b64.encode(), private_b64[8:72].encode(), *body_lines]


def everything_on_the_bus(url: str) -> list[tuple[str, bytes]]:
    """(stream, data) of every message of every stream, KV buckets (KV_*) included."""
    async def names(session):
        return [info.config.name async for info in _streams(session)]

    out: list[tuple[str, bytes]] = []
    for stream in bus_call(url, names):
        out.extend((stream, msg.data + repr(msg.headers or {}).encode()) for msg in stream_messages(url, stream))
    return out


async def _streams(session):
    for info in await session.js.streams_info():
        yield info


def test_mpi_ssh_keys_never_reach_jetstream(stack, api) -> None:
    stack.start_all()
    runtime = yaml.safe_load((REPO / "deploy" / "runtimes" / "mlx-distributed.yaml").read_text())
    api.create(CTR, runtime)
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "mpi-keys", "namespace": "default"},
           "spec": {"runtimeRef": {"name": "mlx-distributed"}, "suspend": True,
                    "trainer": {"numNodes": 2, "command": ["mpirun", "true"]}}}
    created = api.create(TRAINJOBS.format(ns="default"), job)
    secret_path = SECRETS.format(ns="default") + "/mpi-keys-mpi-ssh-auth"
    secret = wait_for(lambda: api.get(secret_path), what="the MPI SSH Secret")
    wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/mpi-keys"), what="JobSet")

    # Upstream's Secret: type, immutability, controller owner, the two keys; nothing of ours.
    assert secret["type"] == "kubernetes.io/ssh-auth" and secret["immutable"] is True
    assert sorted(secret["data"]) == ["ssh-privatekey", "ssh-publickey"]
    assert base64.b64decode(secret["data"]["ssh-publickey"]).startswith(b"ecdsa-sha2-nistp521 ")
    assert not (secret["metadata"].get("annotations") or {})
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
        ("TrainJob", "mpi-keys", created["metadata"]["uid"], True)
    assert [m["manager"] for m in secret["metadata"]["managedFields"]] == ["trainer"]

    # Planned again (resumed: a new generation): the Secret is kept as it was.
    api.merge_patch(TRAINJOBS.format(ns="default") + "/mpi-keys", {"spec": {"suspend": False}})
    wait_for(lambda: (api.get(JOBSETS.format(ns="default") + "/mpi-keys") or {}).get("spec", {}).get("suspend")
             is False, what="JobSet resumed")
    assert api.get(secret_path)["data"] == secret["data"]

    # The watcher's snapshot of the Secret is a reference: keys and digest, no data.
    from trainyard.bus.redact import DATA_DIGEST_ANNOTATION, DATA_KEYS_ANNOTATION, data_digest
    from trainyard.bus.subjects import ObjectKey

    snapshot = wait_for(lambda: bus_call(stack.nats.url, lambda s: s.snapshots.get(
        ObjectKey("default", "Secret", "default", "mpi-keys-mpi-ssh-auth"))), what="Secret snapshot")
    assert "data" not in snapshot and "stringData" not in snapshot
    annotations = snapshot["metadata"]["annotations"]
    assert annotations[DATA_KEYS_ANNOTATION] == "ssh-privatekey,ssh-publickey"
    assert annotations[DATA_DIGEST_ANNOTATION] == data_digest(secret)

    needles = key_material(secret)
    time.sleep(1.0)  # let the last publications land before reading the store
    messages = everything_on_the_bus(stack.nats.url)
    streams = {stream for stream, _ in messages}
    assert {"TY_EVENTS", "KV_ty_objects", "KV_ty_applied"} <= streams
    assert any(b"mpi-keys-mpi-ssh-auth" in data for _, data in messages)  # the Secret did go by, as a reference
    leaks = [(stream, needle[:20]) for stream, data in messages for needle in needles if needle in data]
    assert leaks == []

    store_files = [p for p in Path(stack.nats.store_dir).rglob("*") if p.is_file()]
    assert any(p.suffix == ".blk" for p in store_files)
    on_disk = [(str(p), needle[:20]) for p in store_files for needle in needles if needle in p.read_bytes()]
    assert on_disk == []
    assert any(b"mpi-keys-mpi-ssh-auth" in p.read_bytes() for p in store_files)


def test_flux_curve_certificate_never_reaches_jetstream(stack, api) -> None:
    """The Flux CURVE Secret follows the same rule: planned without data, written by the applier."""
    stack.start_all()
    golden = REPO / "tests" / "unit" / "pipeline" / "golden" / "flux"
    api.create(CTR, yaml.safe_load((golden / "flux_distributed.runtime.yaml").read_text()))
    job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": "flux-keys", "namespace": "default"},
           "spec": {"runtimeRef": {"name": "flux-distributed"}, "suspend": True,
                    "trainer": {"numNodes": 2, "command": ["hostname"]}}}
    created = api.create(TRAINJOBS.format(ns="default"), job)
    secret = wait_for(lambda: api.get(SECRETS.format(ns="default") + "/flux-keys-flux-curve"),
                      what="the Flux CURVE Secret")
    jobset = wait_for(lambda: api.get(JOBSETS.format(ns="default") + "/flux-keys"), what="JobSet")
    assert wait_for(lambda: api.get("/api/v1/namespaces/default/configmaps/flux-keys-flux-entrypoint"),
                    what="the Flux ConfigMap")["data"]["init.sh"].startswith("#!/bin/bash")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["flux-installer"]

    assert sorted(secret["data"]) == ["curve.cert"] and not secret.get("immutable")
    assert not (secret["metadata"].get("annotations") or {})
    owner = secret["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == \
        ("TrainJob", "flux-keys", created["metadata"]["uid"], True)
    cert_b64 = secret["data"]["curve.cert"]
    cert = base64.b64decode(cert_b64).decode()
    assert '    name = "flux-keys"\n' in cert
    secret_key = cert.split('secret-key = "')[1].split('"')[0]
    assert len(secret_key) == 40

    time.sleep(1.0)
    messages = everything_on_the_bus(stack.nats.url)
    assert any(b"flux-keys-flux-curve" in data for _, data in messages)  # went by as a reference
    needles = [secret_key.encode(), cert_b64.encode(), cert_b64[8:72].encode()]
    assert [(stream, n[:20]) for stream, data in messages for n in needles if n in data] == []
    store_files = [p for p in Path(stack.nats.store_dir).rglob("*") if p.is_file()]
    assert [(str(p), n[:20]) for p in store_files for n in needles if n in p.read_bytes()] == []
