"""docker-compose.yml's bus, run here without containers: the commands and environment of its
`bus-credentials`, `nats`, `bus-bootstrap` and service entries, taken from the file, with the
`bus` volume mapped to a local directory and the client port to a free one (the image tests,
tests/image/test_compose.py, run the file itself where podman is installed). The NATS that
compose starts is on TLS and refuses anonymous and plain-text clients; each service's
credentials file connects with its own identity; a second `up` keeps every identity."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nats
import pytest
import yaml

from fixtures.nats import NATS_SERVER, free_port
from trainyard.bus.auth import Credentials
from trainyard.bus.connection import connect
from trainyard.bus.session import BusSession
from trainyard.roles import CLUSTER_ROLES

REPO = Path(__file__).resolve().parents[3]
BUS_MOUNT = "/etc/trainyard/bus"
SERVICES = CLUSTER_ROLES


def interpolate(value: str) -> str:
    """Compose's ``${NAME:-default}`` with nothing set: the default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def local(value: str, bus_dir: Path) -> str:
    return interpolate(value).replace(BUS_MOUNT, str(bus_dir))


def run_trainyard(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainyard.cli.main", *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, **env})


def test_compose_runs_nats_on_tls_with_one_identity_per_service(tmp_path: Path, monkeypatch) -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    bus_dir = tmp_path / "bus"
    bus_dir.mkdir(mode=0o700)

    # bus-credentials, twice (each `compose up` runs it): the second run keeps every identity.
    credentials = services["bus-credentials"]
    assert f"bus:{BUS_MOUNT}" in credentials["volumes"]
    made = run_trainyard([local(arg, bus_dir) for arg in credentials["command"]], {})
    assert made.returncode == 0, made.stderr
    seeds = {path.name: json.loads(path.read_text())["seed"] for path in (bus_dir / "credentials").glob("*.json")}
    again = run_trainyard([local(arg, bus_dir) for arg in credentials["command"]], {})
    assert again.returncode == 0, again.stderr
    assert {path.name: json.loads(path.read_text())["seed"]
            for path in (bus_dir / "credentials").glob("*.json")} == seeds
    assert {f"{service}-default.json" for service in SERVICES} | {"bootstrap.json"} <= set(seeds)

    # nats: the entry's arguments, the client port moved to a free one.
    server = services["nats"]
    assert f"bus:{BUS_MOUNT}:ro" in server["volumes"]
    port, monitor = free_port(), free_port()
    argv = [local(arg, bus_dir).replace("/data", str(tmp_path / "data")) for arg in server["command"]]
    argv[argv.index("-m") + 1] = str(monitor)
    log = open(tmp_path / "nats.log", "wb")
    process = subprocess.Popen([str(NATS_SERVER), *argv, "-a", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true",
                                            timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "nats.log").read_text()
            time.sleep(0.2)
        varz = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{monitor}/varz", timeout=5).read())
        assert varz["tls_required"] is True and varz["auth_required"] is True

        # bus-bootstrap: its command and environment (the bootstrap identity), nats -> 127.0.0.1.
        bootstrap = services["bus-bootstrap"]
        env = {key: local(value, bus_dir) for key, value in bootstrap["environment"].items()}
        args = [local(arg, bus_dir).replace("tls://nats:4222", f"tls://127.0.0.1:{port}")
                for arg in bootstrap["command"]]
        booted = run_trainyard(args, env)
        assert booted.returncode == 0, booted.stderr
        assert "bus topology ready" in booted.stderr

        async def check() -> None:
            # Anonymous, and plain text: refused.
            with pytest.raises(Exception):
                await nats.connect(f"tls://127.0.0.1:{port}", connect_timeout=2, allow_reconnect=False,
                                   max_reconnect_attempts=0)
            with pytest.raises(Exception):
                await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=2, allow_reconnect=False,
                                   max_reconnect_attempts=0)
            # Each service: the credentials its entry names open a session (the buckets exist).
            for name in SERVICES:
                environment = services[name]["environment"]
                assert environment["TRAINYARD_NATS_URL"] == "tls://nats:4222"
                path = Path(local(environment["TRAINYARD_NATS_CREDENTIALS"], bus_dir))
                identity = Credentials.load(path)
                assert identity.user == f"{name}-default"
                client = await connect(f"tls://127.0.0.1:{port}", f"compose-{name}", credentials=identity)
                try:
                    assert client.is_connected
                finally:
                    await client.close()
            # A service's whole start (as the status service: it waits for the bootstrap's buckets).
            monkeypatch.setenv("TRAINYARD_NATS_CREDENTIALS", str(bus_dir / "credentials" / "status-default.json"))
            session = await asyncio.wait_for(BusSession.open(f"tls://127.0.0.1:{port}", "compose-status"), 60)
            await session.close()

        asyncio.run(check())
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
