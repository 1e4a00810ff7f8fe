"""`trainyard up` secures its NATS (docs/security.md): TLS on the client port, one NKey
identity per service, no anonymous access; the credentials and server config in the data dir,
readable by their owner only, the config holding public keys only; the topology made by the
bootstrap identity before any service starts."""
from __future__ import annotations

import asyncio
import json
import ssl
import stat
from pathlib import Path

import nats
import pytest

from fixtures.stack import start_stack

NATS_ONLY = ("--skip", "devcluster", "--skip", "watcher", "--skip", "planner", "--skip", "applier", "--skip", "status")


def test_up_runs_nats_with_tls_nkeys_and_no_anonymous_access(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "data", *NATS_ONLY)
    try:
        assert stack.nats_url.startswith("tls://127.0.0.1:")
        bus = stack.data_dir / "bus"
        credentials = sorted((bus / "credentials").glob("*.json"))
        names = {path.stem for path in credentials}
        assert {"admin", "bootstrap", "watcher-default", "planner-default", "applier-default", "status-default",
                "dispatcher", "dashboard"} <= names
        for directory in (bus, bus / "credentials", bus / "tls"):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        for path in [*credentials, bus / "nats-auth.conf", bus / "tls" / "tls.key", bus / "tls" / "ca.key"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        config = (bus / "nats-auth.conf").read_text()
        seeds = [json.loads(path.read_text())["seed"] for path in credentials]
        assert all(seed.startswith("SU") and seed not in config for seed in seeds)
        ca = json.loads(stack.nats_credentials("watcher-default").read_text())["ca"]

        async def probe() -> list[str]:
            with pytest.raises(Exception, match="Authorization Violation"):
                await nats.connect(stack.nats_url, tls=ssl.create_default_context(cadata=ca), allow_reconnect=False,
                                   max_reconnect_attempts=0, connect_timeout=3)
            admin = await stack.nats_connect("admin")
            try:
                return [info.config.name for info in await admin.jetstream().streams_info()]
            finally:
                await admin.close()

        streams = asyncio.run(probe())
        assert {"TY_EVENTS", "TY_PLANS", "TY_RESULTS", "TY_DEAD_LETTER",
                "KV_ty_objects", "KV_ty_applied", "KV_ty_outcomes"} <= set(streams)
        assert "bus         ready" in stack.output()
    finally:
        stack.stop()
        stack.kill()


def test_a_local_nats_cluster_authenticates_its_routes(tmp_path: Path) -> None:
    """--nats-cluster 3: the nodes' routes log in with a password from a 0600 file (never on a
    command line), an unauthenticated route is refused, and the cluster forms (replicas 3)."""
    import re
    import socket


    stack = start_stack(tmp_path / "data", *NATS_ONLY, "--nats-cluster", "3")
    try:
        bus = stack.data_dir / "bus"
        password = (bus / "route-password").read_text().strip()
        assert stat.S_IMODE((bus / "route-password").stat().st_mode) == 0o600
        for index in (1, 2, 3):
            config = (bus / f"nats-node-{index}.conf").read_text()
            assert stat.S_IMODE((bus / f"nats-node-{index}.conf").stat().st_mode) == 0o600
            assert config.startswith("include nats-auth.conf") and password in config
        for name in ("nats", "nats-2", "nats-3"):
            pid = stack.state["children"][name]["pid"]
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
            assert password not in cmdline and "--routes" not in cmdline
        route_port = int(re.search(r'listen: "127.0.0.1:(\d+)"', (bus / "nats-node-1.conf").read_text()).group(1))
        with socket.create_connection(("127.0.0.1", route_port), timeout=5) as conn:
            info = json.loads(conn.recv(4096).decode().split(" ", 1)[1])
            assert info.get("auth_required") is True
            conn.sendall(b'CONNECT {"verbose":false,"pedantic":false,"name":"intruder"}\r\nPING\r\n')
            reply = conn.recv(4096)
            assert b"-ERR" in reply and b"PONG" not in reply

        async def replicas() -> int:
            admin = await stack.nats_connect("admin")
            try:
                return (await admin.jetstream().stream_info("TY_EVENTS")).config.num_replicas
            finally:
                await admin.close()

        assert asyncio.run(replicas()) == 3
    finally:
        stack.stop()
        stack.kill()
