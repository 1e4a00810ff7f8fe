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

    return asyncio.run(_bootstrap(args.nats_url, args.timeout))


async def _bootstrap(url: str, timeout_s: float) -> int:
    import asyncio

    from trainyard.bus.auth import from_environment
    from trainyard.bus.connection import connect
    from trainyard.bus.topology import ensure_topology
    from trainyard.cli.main import UserError

    credentials = from_environment()
    if credentials is not None and not credentials.topology:
        raise UserError(f"{credentials.user}: not the bootstrap identity ($TRAINYARD_NATS_CREDENTIALS)")
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            nc = await connect(url, "trainyard-bus-bootstrap")
            try:
                await ensure_topology(nc.jetstream())
            finally:
                await nc.close()
            print("bus topology ready", file=sys.stderr)
            return 0
        except Exception as err:
            if asyncio.get_running_loop().time() > deadline:
                print(f"error: bus bootstrap failed: {err}", file=sys.stderr)
                return 1
            await asyncio.sleep(0.5)
