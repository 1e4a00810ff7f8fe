"""``trainyard bus``: the bus's security set-up (docs/security.md).

``trainyard bus credentials --out DIR --cluster NAME...`` makes the NATS CA and server
certificate, one NKey identity per service and cluster, and the server config include (all
0600); ``trainyard bus bootstrap`` connects as the bootstrap identity and creates the streams
and buckets (services cannot: their grants name their own consumers only).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainyard.errors import UserError

HELP = ("Bus security: generate NATS credentials and server config (credentials), or create the "
        "streams and buckets as the bootstrap identity (bootstrap).")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bus_command", metavar="SUBCOMMAND", required=True)
    creds = sub.add_parser("credentials", help="CA, server certificate, one NKey per identity, server config")
    creds.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory for the files (0700)")
    creds.add_argument("--cluster", action="append", required=True, metavar="NAME",
                       help="a cluster whose services use this bus (repeat; the first is the manager)")
    creds.add_argument("--host", action="append", metavar="HOST",
                       help="a name or address the NATS server's certificate covers (repeat; "
                            "default 127.0.0.1 and localhost)")
    install = sub.add_parser("install", help="on Kubernetes (the install Job of deploy/): credentials into "
                             "Secrets (kept across runs, certificates rotated when due), then bootstrap")
    install.add_argument("--namespace", default="kubeflow-system")
    install.add_argument("--cluster", action="append", metavar="NAME",
                         help="a cluster whose services use this bus (repeat; default: default)")
    install.add_argument("--host", action="append", metavar="HOST", help="a name the NATS certificate covers (repeat)")
    install.add_argument("--route-host", action="append", metavar="HOST",
                         help="a name the NATS route certificate covers (repeat; default: the "
                              "headless Service's pod names)")
    install.add_argument("--kubeconfig", default=None, help="default: as kubectl (in-cluster in the Job)")
    install.add_argument("--nats-url", default=os.environ.get("TRAINYARD_NATS_URL",
                                                              "tls://trainyard-nats.kubeflow-system.svc:4222"))
    install.add_argument("--server-tls-dir", default="/etc/nats/auth",
                         help="where the NATS pods mount the trainyard-nats-auth Secret")
    install.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                         help="how long to wait for NATS to come up for the bootstrap")
    boot = sub.add_parser("bootstrap", help="create (or update) the streams and buckets")
    boot.add_argument("--nats-url", default=os.environ.get("TRAINYARD_NATS_URL", "nats://127.0.0.1:4222"))
    boot.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    if args.bus_command == "credentials":
        from trainyard.bus.auth import generate

        made = generate(args.out, args.cluster, tls_hosts=args.host)
        print(f"server config: {made.server_config}")
        for name, path in sorted(made.credentials.items()):
            print(f"{name}: {path}")
        return 0
    import asyncio

    if args.bus_command == "install":
        return asyncio.run(_install(args))
    return asyncio.run(_bootstrap(args.nats_url, args.timeout))


SERVER_SECRET = "trainyard-nats-auth"  # nats-auth.conf, tls.crt, tls.key: mounted by the NATS pods
CA_SECRET = "trainyard-bus-ca"  # the CA (key included): read by this installer only


def identity_secret(identity: str) -> str:
    """The Secret holding one identity's credentials.json (mounted by that service only)."""
    return f"trainyard-bus-{identity}"


async def _install(args: argparse.Namespace) -> int:
    """Restores what earlier runs made (seeds, CA) from the Secrets, lets ``generate`` keep or
    rotate it, writes every Secret back (server-side apply), then bootstraps the topology."""
    import base64
    import tempfile

    from trainyard.bus.auth import BOOTSTRAP, generate, identities, identity_name
    from trainyard.kube import resources as r
    from trainyard.kube.client import KubeClient
    from trainyard.security.pki import write_private

    clusters = args.cluster or ["default"]
    namespace = args.namespace
    kube = await KubeClient.from_kubeconfig(args.kubeconfig)
    try:
        with tempfile.TemporaryDirectory(prefix="trainyard-bus-") as tmp:
            work = Path(tmp)

            async def restore(secret_name: str, files: dict[str, Path]) -> None:
                secret = await kube.get(r.SECRET, namespace, secret_name)
                data = (secret or {}).get("data") or {}
                for key, path in files.items():
                    if key in data:
                        write_private(path, base64.b64decode(data[key]))

            tls = work / "tls"
            await restore(CA_SECRET, {"ca.crt": tls / "ca.crt", "ca.key": tls / "ca.key",
                                      "ca-bundle.crt": tls / "ca-bundle.crt"})
            await restore(SERVER_SECRET, {"tls.crt": tls / "tls.crt", "tls.key": tls / "tls.key",
                                          "route.crt": tls / "route.crt", "route.key": tls / "route.key"})
            for identity in (identity_name(role, cluster) for role, cluster in identities(clusters)):
                await restore(identity_secret(identity), {"credentials.json": work / "credentials" / f"{identity}.json"})
            hosts = args.host or [f"trainyard-nats.{namespace}.svc", f"trainyard-nats.{namespace}.svc.cluster.local",
                                  "trainyard-nats", "localhost", "127.0.0.1"]
            made = generate(work, clusters, tls_hosts=hosts, server_tls_dir=args.server_tls_dir)
            route_hosts = args.route_host or [f"*.trainyard-nats-headless.{namespace}.svc",
                                              f"*.trainyard-nats-headless.{namespace}.svc.cluster.local"]
            _ensure_route_certificate(tls, route_hosts)

            def secret(name: str, files: dict[str, Path], component: str) -> dict:
                return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {"name": name, "namespace": namespace,
                                     "labels": {"app.kubernetes.io/part-of": "trainyard",
                                                "app.kubernetes.io/component": component}},
                        "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in files.items()}}

            await kube.apply(secret(CA_SECRET, {"ca.crt": tls / "ca.crt", "ca.key": tls / "ca.key",
                                                "ca-bundle.crt": tls / "ca-bundle.crt"}, "bus-ca"),
                             field_manager="trainyard-bus-install")
            await kube.apply(secret(SERVER_SECRET, {"nats-auth.conf": made.server_config, "tls.crt": tls / "tls.crt",
                                                    "tls.key": tls / "tls.key", "route.crt": tls / "route.crt",
                                                    "route.key": tls / "route.key",
                                                    "ca-bundle.crt": tls / "ca-bundle.crt"}, "nats"),
                             field_manager="trainyard-bus-install")
            for identity, path in made.credentials.items():
                await kube.apply(secret(identity_secret(identity), {"credentials.json": path}, "bus-identity"),
                                 field_manager="trainyard-bus-install")
            print(f"bus credentials: {len(made.credentials)} identities in Secrets trainyard-bus-*, "
                  f"server config in {SERVER_SECRET}", file=sys.stderr, flush=True)
            os.environ["TRAINYARD_NATS_CREDENTIALS"] = str(made.credentials[BOOTSTRAP])
            return await _bootstrap(args.nats_url, args.timeout)
    finally:
        await kube.close()


def _ensure_route_certificate(tls: Path, hosts: list[str]) -> None:
    """The NATS nodes' route certificate (server and client: the routes are mutual TLS, each node
    verifying the other's certificate against the bus CA), kept until due for rotation."""
    from trainyard.security import pki

    ca, ca_key, bundle = (tls / "ca.crt").read_bytes(), (tls / "ca.key").read_bytes(), (tls / "ca-bundle.crt").read_bytes()
    if (tls / "route.crt").is_file() and (tls / "route.key").is_file():
        chain = (tls / "route.crt").read_bytes()
        current = pki.CertBundle(ca, ca_key, chain[: len(chain) - len(ca)] if chain.endswith(ca) else chain,
                                 (tls / "route.key").read_bytes(), bundle)
        if chain.endswith(ca) and not pki.needs_rotation(current, hosts):
            return
    cert, key = pki.new_serving_cert(ca, ca_key, hosts, common_name="trainyard-nats-route", client_auth=True)
    pki.write_private(tls / "route.crt", cert + ca)
    pki.write_private(tls / "route.key", key)


async def _bootstrap(url: str, timeout_s: float) -> int:
    import asyncio

    from trainyard.bus.auth import from_environment
    from trainyard.bus.connection import ServerTooOld, connect
    from trainyard.bus.topology import ensure_topology
    from trainyard.errortext import describe

    credentials = from_environment()
    if credentials is not None and not credentials.topology:
        raise UserError(f"{credentials.user}: not the bootstrap identity ($TRAINYARD_NATS_CREDENTIALS)")
    began = asyncio.get_running_loop().time()
    deadline = began + timeout_s
    next_say = began + 10.0
    while True:
        try:
            # The client retries a refused connection by itself: bound each try by what is left,
            # and by 10 s, so that a NATS still starting is reported while it is waited for.
            remaining = max(deadline - asyncio.get_running_loop().time(), 1.0)
            nc = await asyncio.wait_for(connect(url, "trainyard-bus-bootstrap"), timeout=min(remaining, 10.0))
            try:
                await asyncio.wait_for(ensure_topology(nc.jetstream()), timeout=max(remaining, 30.0))
            finally:
                await nc.close()
            print("bus topology ready", file=sys.stderr)
            return 0
        except ServerTooOld as err:
            raise UserError(str(err)) from None
        except Exception as err:
            now = asyncio.get_running_loop().time()
            if now > deadline:
                print(f"error: bus bootstrap failed after {timeout_s:g}s: {describe(err)}", file=sys.stderr)
                return 1
            if now >= next_say:  # a NATS that is not up yet is waited for aloud
                print(f"waiting {now - began:.0f}s of {timeout_s:g}s for NATS at {url}: {describe(err)}",
                      file=sys.stderr, flush=True)
                next_say = now + 10.0
            await asyncio.sleep(0.5)
