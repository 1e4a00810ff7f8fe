"""The bus's install Job (`trainyard bus install`, deploy/services/bus-security.yaml), run for
real against a devcluster and a real nats-server in the order Kubernetes gives: the Job writes
the credentials into Secrets, NATS starts once its Secret exists (as a pod waits for its
volume) with the server config from it, then the Job creates the topology as the bootstrap
identity. A second run keeps every identity's seed and the CA. Each service's Secret lets it
connect (TLS, NKey) with exactly its grants."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fixtures.nats import NatsServer, free_port

NAMESPACE = "kubeflow-system"


def secret(cluster, name: str) -> dict | None:
    result = cluster.kubectl("get", "secret", name, "-n", NAMESPACE, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def install(cluster, port: int, tls_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainyard.cli.main", "bus", "install", "--kubeconfig", str(cluster.kubeconfig),
         "--namespace", NAMESPACE, "--cluster", "default", "--nats-url", f"tls://127.0.0.1:{port}",
         "--server-tls-dir", str(tls_dir), "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def mount(data: dict, directory: Path) -> None:
    """What the kubelet does with a Secret volume."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (directory / key).write_bytes(base64.b64decode(value))
        os.chmod(directory / key, 0o600)


def test_install_job_makes_secrets_then_bootstraps_and_keeps_identities(devcluster, tmp_path: Path) -> None:
    assert devcluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode == 0  # devcluster makes it
    port = free_port()
    tls_dir = tmp_path / "nats-auth"
    first = install(devcluster, port, tls_dir)
    server = None
    try:
        deadline = time.monotonic() + 60
        while (auth := secret(devcluster, "trainyard-nats-auth")) is None:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no trainyard-nats-auth Secret"
            time.sleep(0.2)
        mount(auth["data"], tls_dir)
        server = NatsServer(tmp_path / "nats-store", port=port,
                            security=SimpleNamespace(server_config=tls_dir / "nats-auth.conf"))
        server.start()
        out, err = first.communicate(timeout=90)
        assert first.returncode == 0, err
        assert "bus topology ready" in err

        watcher = json.loads(base64.b64decode(secret(devcluster, "trainyard-bus-watcher-default")["data"]["credentials.json"]))
        admin = json.loads(base64.b64decode(secret(devcluster, "trainyard-bus-admin")["data"]["credentials.json"]))
        assert sorted(auth["data"]) == ["nats-auth.conf", "tls.crt", "tls.key"]
        assert watcher["seed"] not in base64.b64decode(auth["data"]["nats-auth.conf"]).decode()
        for name in ("planner-default", "applier-default", "status-default", "dispatcher", "dashboard", "bootstrap"):
            assert secret(devcluster, f"trainyard-bus-{name}") is not None, name

        async def check() -> list[str]:
            import nats

            context = ssl.create_default_context(cadata=watcher["ca"])
            errors: list[str] = []

            async def on_error(e: Exception) -> None:
                errors.append(str(e))

            nc = await nats.connect(server.url, tls=context, nkeys_seed_str=watcher["seed"],
                                    inbox_prefix=watcher["inboxPrefix"], error_cb=on_error, allow_reconnect=False)
            try:
                await nc.jetstream().publish("ty.events.default.TrainJob.default.x", b"{}", timeout=5)
                await nc.publish("ty.desired.default.TrainJob.default.x", b"{}")
                await nc.flush()
                await asyncio.sleep(0.5)
            finally:
                await nc.close()
            assert any("permissions violation" in e for e in errors), errors
            nc = await nats.connect(server.url, tls=ssl.create_default_context(cadata=admin["ca"]),
                                    nkeys_seed_str=admin["seed"], inbox_prefix=admin["inboxPrefix"])
            try:
                return [info.config.name for info in await nc.jetstream().streams_info()]
            finally:
                await nc.close()

        assert {"TY_EVENTS", "TY_PLANS", "KV_ty_objects"} <= set(asyncio.run(check()))

        # Again (an upgrade re-runs the Job): identities and CA kept, NATS config the same users.
        ca_before = secret(devcluster, "trainyard-bus-ca")["data"]["ca.crt"]
        second = install(devcluster, port, tls_dir)
        out, err = second.communicate(timeout=90)
        assert second.returncode == 0, err
        again = json.loads(base64.b64decode(secret(devcluster, "trainyard-bus-watcher-default")["data"]["credentials.json"]))
        assert again["seed"] == watcher["seed"]
        assert secret(devcluster, "trainyard-bus-ca")["data"]["ca.crt"] == ca_before
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        if server is not None:
            server.stop()


REPO = Path(__file__).resolve().parents[3]


def test_deploy_wires_each_service_to_its_own_identity(devcluster, tmp_path: Path) -> None:
    """What deploy/ ships: the install Job, NATS reading the generated users and certificate,
    each service (and the dispatcher, with the multicluster component) mounting only its own
    identity's Secret; the names are the ones `trainyard bus install` writes."""
    import yaml

    from trainyard.bus.auth import identities, identity_name

    docs = [d for d in yaml.safe_load_all(devcluster.kubectl("kustomize", str(REPO / "deploy")).stdout) if d]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    made = {f"trainyard-bus-{identity_name(role, cluster)}" for role, cluster in identities(["default"])}
    for role in ("watcher", "planner", "applier", "status"):
        pod = by_name[("Deployment", f"trainyard-{role}")]["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["TRAINYARD_NATS_URL"].startswith("tls://")
        assert env["TRAINYARD_NATS_CREDENTIALS"] == "/etc/trainyard/bus/credentials.json"
        secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
        assert secrets == [f"trainyard-bus-{role}-default"] and secrets[0] in made
    nats = by_name[("StatefulSet", "trainyard-nats")]["spec"]["template"]["spec"]
    assert {"name": "auth", "secret": {"secretName": "trainyard-nats-auth", "defaultMode": 0o440}} in nats["volumes"]
    assert "include ../auth/nats-auth.conf" in by_name[("ConfigMap", "trainyard-nats")]["data"]["nats.conf"]
    job = by_name[("Job", "trainyard-bus-setup")]["spec"]["template"]["spec"]
    assert job["containers"][0]["args"][:2] == ["bus", "install"] and job["serviceAccountName"] == "trainyard-bus-setup"

    overlay = tmp_path / "manager"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(REPO / "deploy", overlay)],
        "components": [os.path.relpath(REPO / "deploy" / "multicluster", overlay)]}))
    docs = [d for d in yaml.safe_load_all(devcluster.kubectl("kustomize", str(overlay)).stdout) if d]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    args = by_name[("Job", "trainyard-bus-setup")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[-2:] == ["--cluster", "manager"]
    pod = by_name[("Deployment", "trainyard-dispatcher")]["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == ["trainyard-bus-dispatcher"]
