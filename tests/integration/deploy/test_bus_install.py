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
        assert sorted(auth["data"]) == ["ca-bundle.crt", "nats-auth.conf", "route.crt", "route.key", "tls.crt", "tls.key"]
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
        route_before = secret(devcluster, "trainyard-nats-auth")["data"]["route.crt"]
        second = install(devcluster, port, tls_dir)
        out, err = second.communicate(timeout=90)
        assert second.returncode == 0, err
        again = json.loads(base64.b64decode(secret(devcluster, "trainyard-bus-watcher-default")["data"]["credentials.json"]))
        assert again["seed"] == watcher["seed"]
        assert secret(devcluster, "trainyard-bus-ca")["data"]["ca.crt"] == ca_before
        assert secret(devcluster, "trainyard-nats-auth")["data"]["route.crt"] == route_before
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
    # The dispatcher runs as the manager's cluster (`default`), whose identities the Job already makes.
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--cluster"] == ["default"]
    pod = by_name[("Deployment", "trainyard-dispatcher")]["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == ["trainyard-bus-dispatcher"]


def test_nats_routes_are_mutual_tls_with_the_install_jobs_certificate(devcluster, tmp_path: Path) -> None:
    """The cluster block deploy/ ships (its `tls {}` taken verbatim from the ConfigMap, the mount
    path pointed at a local copy of trainyard-nats-auth): two nodes form a route with the Job's
    route certificate; a third node without one is refused."""
    import re
    import urllib.request

    import yaml

    tls_dir = tmp_path / "auth"
    done = subprocess.run(
        [sys.executable, "-m", "trainyard.cli.main", "bus", "install", "--kubeconfig", str(devcluster.kubeconfig),
         "--namespace", NAMESPACE, "--nats-url", "tls://127.0.0.1:1", "--server-tls-dir", str(tls_dir),
         "--route-host", "127.0.0.1", "--route-host", "localhost", "--timeout", "0"],
        capture_output=True, text=True, timeout=120)
    assert "bus credentials:" in done.stderr, done.stderr  # (the bootstrap itself has no NATS here)
    auth = secret(devcluster, "trainyard-nats-auth")["data"]
    assert {"route.crt", "route.key", "ca-bundle.crt"} <= set(auth)
    mount(auth, tls_dir)

    shipped = next(d for d in yaml.safe_load_all((REPO / "deploy" / "services" / "nats.yaml").read_text())
                   if d["kind"] == "ConfigMap")["data"]["nats.conf"]
    route_tls = re.search(r"\n( *)tls \{.*?\n\1\}", shipped, re.S).group(0).replace("/etc/nats/auth", str(tls_dir))
    assert "verify: true" in route_tls

    route_ports = [free_port(), free_port(), free_port()]
    monitor_ports = [free_port(), free_port(), free_port()]
    processes: list[subprocess.Popen] = []

    def node(index: int, with_tls: bool) -> None:
        routes = ", ".join(f'"nats://127.0.0.1:{port}"' for i, port in enumerate(route_ports[:2]) if i != index)
        config = tmp_path / f"node-{index}.conf"
        config.write_text(f"port: {free_port()}\nhttp_port: {monitor_ports[index]}\nserver_name: n{index}\n"
                          f"cluster {{\n  name: trainyard\n  listen: 127.0.0.1:{route_ports[index]}\n"
                          f"  routes: [{routes}]\n{route_tls if with_tls else ''}\n}}\n")
        log = open(tmp_path / f"node-{index}.log", "wb")
        processes.append(subprocess.Popen([str(Path(sys.executable).parent / "nats-server"), "-c", str(config)],
                                          stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def routez(index: int) -> dict:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{monitor_ports[index]}/routez", timeout=2) as response:
                return json.loads(response.read())
        except OSError:
            return {"num_routes": -1, "routes": []}

    def peers_of(index: int) -> set[str]:
        """The server names node `index` has routes to (nats-server pools several connections
        per peer, so the count of routes says nothing about who joined)."""
        return {route.get("remote_name", "") for route in routez(index).get("routes") or []}

    try:
        node(0, True)
        node(1, True)
        deadline = time.monotonic() + 30
        while not ("n1" in peers_of(0) and "n0" in peers_of(1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert peers_of(0) == {"n1"} and peers_of(1) == {"n0"}, (tmp_path / "node-0.log").read_text()[-2000:]
        node(2, False)  # an intruder: routes to nodes 0 and 1 with no certificate
        # Wait until both nodes have refused it at least once (each logs the failed handshake).
        def refused(index: int) -> bool:
            return "TLS route handshake error" in (tmp_path / f"node-{index}.log").read_text()
        deadline = time.monotonic() + 30
        while not (refused(0) and refused(1)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert refused(0) and refused(1), (tmp_path / "node-0.log").read_text()[-2000:]
        assert peers_of(0) == {"n1"} and peers_of(1) == {"n0"}
        assert routez(2)["num_routes"] == 0 and peers_of(2) == set()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
