"""What may go on the bus (a Secret as a reference; a planned MPI Secret without key material)
and what each identity is granted (docs/security.md)."""
from __future__ import annotations

import base64

import pytest

from trainyard.bus.auth import grants_for, identities, identity_name, server_config
from trainyard.bus.redact import DATA_DIGEST_ANNOTATION, DATA_KEYS_ANNOTATION, LAST_APPLIED, data_digest, redact
from trainyard.pipeline.ssh_keys import (
    GENERATE_ANNOTATION, defer_generated_secrets, materialize, needs_generation, new_ssh_key_pair,
)


def secret(**extra) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "immutable": True,
            "metadata": {"name": "job-mpi-ssh-auth", "namespace": "ns",
                         "annotations": {LAST_APPLIED: '{"data": {"ssh-privatekey": "c2VjcmV0"}}', "keep": "me"}},
            "data": {"ssh-privatekey": "c2VjcmV0", "ssh-publickey": "cHVi"}, **extra}


def test_a_secret_is_published_as_keys_and_digest_only() -> None:
    original = secret(stringData={"extra": "plain"})
    published = redact(original)
    assert "data" not in published and "stringData" not in published
    annotations = published["metadata"]["annotations"]
    assert annotations == {"keep": "me", DATA_KEYS_ANNOTATION: "extra,ssh-privatekey,ssh-publickey",
                           DATA_DIGEST_ANNOTATION: data_digest(original)}
    assert "c2VjcmV0" not in repr(published) and "plain" not in repr(published)
    assert original["data"]["ssh-privatekey"] == "c2VjcmV0"  # the input is left alone
    changed = secret()
    changed["data"]["ssh-privatekey"] = "b3RoZXI="
    assert redact(changed)["metadata"]["annotations"][DATA_DIGEST_ANNOTATION] != data_digest(original)
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
    assert redact(configmap) is configmap


def test_the_planned_mpi_secret_has_no_key_until_the_applier_makes_it() -> None:
    planned = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/ssh-auth", "immutable": True,
               "metadata": {"name": "job-mpi-ssh-auth", "namespace": "ns", "ownerReferences": [{"uid": "u"}]},
               "data": {"ssh-privatekey": "", "ssh-publickey": ""}}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "job-mpi-hostfile"}, "data": {"h": ""}}
    deferred, kept = defer_generated_secrets([planned, other])
    assert kept is other and "data" not in deferred and needs_generation(deferred)
    made = materialize(deferred)
    assert not needs_generation(made) and "annotations" not in made["metadata"]
    assert made["metadata"]["ownerReferences"] == [{"uid": "u"}] and made["immutable"] is True
    assert base64.b64decode(made["data"]["ssh-privatekey"]).startswith(b"-----BEGIN EC PRIVATE KEY-----")
    assert base64.b64decode(made["data"]["ssh-publickey"]).startswith(b"ecdsa-sha2-nistp521 ")
    assert materialize(deferred)["data"] != made["data"]  # a fresh pair each time it is made
    bogus = {**deferred, "metadata": {**deferred["metadata"], "annotations": {GENERATE_ANNOTATION: "rsa"}}}
    with pytest.raises(ValueError):
        materialize(bogus)
    assert len(new_ssh_key_pair()) == 2


def test_grants_follow_the_code() -> None:
    watcher = grants_for("watcher", "c1").as_config()
    assert "ty.events.c1.>" in watcher["publish"]["allow"]
    assert not any(s.startswith(("ty.desired", "ty.results", "$KV.ty_applied")) for s in watcher["publish"]["allow"])
    assert watcher["subscribe"]["allow"] == ["_INBOX_watcher-c1.>"]
    # The roles' backlogs it exports for autoscalers: the listing of the three streams, read-only.
    listings = {s for s in watcher["publish"]["allow"] if s.startswith("$JS.API.CONSUMER.") and ".KV_" not in s}
    assert listings == {f"$JS.API.CONSUMER.LIST.{s}" for s in ("TY_EVENTS", "TY_PLANS", "TY_RESULTS")}
    applier = grants_for("applier", "c1", partitions=4).as_config()["publish"]["allow"]
    # One durable per partition, its own leases, nothing of another cluster or role.
    assert {f"$JS.API.CONSUMER.MSG.NEXT.TY_PLANS.applier-p{p}_c1" for p in range(4)} <= set(applier)
    assert "$JS.API.CONSUMER.MSG.NEXT.TY_PLANS.applier-p4_c1" not in applier
    assert "$KV.ty_leases.applier.c1.>" in applier
    # Its presence: a consumer on its own role's member keys; nothing written to the bucket.
    assert "$JS.API.CONSUMER.CREATE.KV_ty_members.*.$KV.ty_members.applier.c1.>" in applier
    assert "$JS.API.CONSUMER.NAMES.KV_ty_members" in applier
    assert not any(s.startswith("$KV.ty_members.") for s in applier)
    applier_subscribe = grants_for("applier", "c1", partitions=4).as_config()["subscribe"]["allow"]
    assert "$JS.EVENT.ADVISORY.CONSUMER.DELETED.KV_ty_members.*" in applier_subscribe
    assert not any(s.startswith("$KV.ty_leases.") and not s.startswith("$KV.ty_leases.applier.c1.") for s in applier)
    assert not any("applier_c2" in s or ".c2." in s for s in applier)
    assert not any(s.startswith("$JS.API.STREAM.CREATE") or s == "$JS.API.>" for s in applier)
    assert grants_for("bootstrap", "c1").as_config()["publish"]["allow"] == [  # the API, the floor markers
        "$JS.API.>", "$KV.ty_applied.trainyard-read-floor", "$KV.ty_objects.trainyard-read-floor",
        "$KV.ty_outcomes.trainyard-read-floor"]
    names = {identity_name(role, cluster) for role, cluster in identities(["m", "w1"])}
    assert names == {"bootstrap", "admin", "dispatcher", "dashboard", *(f"{r}-{c}" for r in
                     ("watcher", "planner", "applier", "status") for c in ("m", "w1"))}
    config = server_config([("watcher-c1", "UABC", grants_for("watcher", "c1"))], ("/x/tls.crt", "/x/tls.key"))
    assert 'nkey: "UABC"' in config and 'cert_file: "/x/tls.crt"' in config
