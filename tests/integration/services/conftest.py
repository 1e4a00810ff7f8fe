"""Fixtures for the service integration tests: a real nats-server, a real devcluster, and the
four services as real processes (`python -m trainyard.cli.main <service> ...`), each stopped by
pid at the end of the test."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from fixtures.pipeline_builders import torch_cluster_runtime
from fixtures.waiting import wait_for  # noqa: F401 - the services tests import it from here

REPO = Path(__file__).resolve().parents[3]
CRDS = REPO / "deploy" / "crds"
HOST = "127.0.0.1"


@dataclass
class ServiceProcess:
    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str]
    process: subprocess.Popen | None = None
    http_port: int = 0

    def start(self) -> None:
        self.spawn()
        self.await_listening()

    def spawn(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainyard.cli.main", self.name, *self.args],
            stdout=subprocess.PIPE, stderr=log, cwd=REPO, env=self.env, text=True,
        )
        log.close()

    def await_listening(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"{self.name} did not start: {line!r}\n{self.log_path.read_text()[-3000:]}")
        self.http_port = int(line.rsplit(":", 1)[1].strip())

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.http_port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_path.read_text()[-3000:]}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready: {self.get('/readyz')}\n{self.log_path.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()
        code = self.process.returncode
        self.process = None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class Stack:
    """nats-server + devcluster + any number of service processes."""

    nats: object
    cluster: object
    workdir: Path
    services: list[ServiceProcess] = field(default_factory=list)

    def start_service(self, name: str, *extra: str, ready: bool = True) -> ServiceProcess:
        return self.start_services([(name, list(extra))], ready=ready)[0]

    def start_services(self, specs: list[tuple[str, list[str]]], ready: bool = True) -> list[ServiceProcess]:
        """Starts several services at once (in parallel: Python start-up dominates)."""
        started = [self._spawn(name, extra) for name, extra in specs]
        for service in started:
            service.await_listening()
        if ready:
            for service in started:
                service.wait_ready()
        return started

    def _spawn(self, name: str, extra: list[str]) -> ServiceProcess:
        index = sum(1 for s in self.services if s.name == name)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if getattr(self.nats, "security", None) is not None:  # its own NATS identity
            env.update(self.nats.credentials_env(name, None if name in ("dispatcher", "dashboard") else "default"))
        args = ["--kubeconfig", str(self.cluster.kubeconfig), "--nats-url", self.nats.url,
                "--http-port", "0", "--shutdown-grace", "5", *extra]
        if name == "planner" and "--webhook-port" not in extra:
            args += ["--webhook-port", "0", "--webhook-namespace", "trainyard-system"]
        service = ServiceProcess(name, args, self.workdir / f"{name}-{index}.log", env)
        service.spawn()
        self.services.append(service)
        return service

    def start_all(self, *extra: str) -> dict[str, ServiceProcess]:
        names = ("watcher", "planner", "applier", "status")
        return dict(zip(names, self.start_services([(n, list(extra)) for n in names])))

    def stop_all(self) -> None:
        """SIGTERM to every service at once, then wait for each (graceful, in parallel)."""
        for service in self.services:
            if service.process is not None and service.process.poll() is None:
                os.kill(service.process.pid, signal.SIGTERM)
        for service in reversed(self.services):
            service.stop()

    def kubectl(self, *args: str, **kw):
        return self.cluster.kubectl(*args, **kw)


def install_crds(cluster) -> None:
    # Every CRD file (deploy/crds also holds a kustomization, which is not an object).
    files = [arg for path in sorted(CRDS.glob("*.yaml")) if path.name != "kustomization.yaml"
             for arg in ("-f", str(path))]
    cluster.kubectl("apply", "--server-side", *files)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        result = cluster.kubectl("get", "trainjobs,jobsets", "-A", check=False)
        if result.returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("CRDs not served")


@pytest.fixture
def stack(nats_server, devcluster, tmp_path) -> Iterator[Stack]:
    install_crds(devcluster)
    running = Stack(nats_server, devcluster, tmp_path)
    try:
        yield running
    finally:
        running.stop_all()


class Api:
    """A small synchronous REST client for assertions (httpx, the devcluster's token and CA)."""

    def __init__(self, cluster) -> None:
        import ssl

        import httpx

        self._client = httpx.Client(base_url=cluster.url,
                                    verify=ssl.create_default_context(cafile=str(cluster.ca_cert)),
                                    headers={"Authorization": f"Bearer {cluster.token}"}, timeout=30)

    def request(self, method: str, path: str, body=None, content_type: str = "application/json"):
        import json as _json

        response = self._client.request(method, path, content=None if body is None else _json.dumps(body),
                                        headers={"Content-Type": content_type})
        return response

    def get(self, path: str):
        response = self.request("GET", path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def create(self, path: str, body):
        response = self.request("POST", path, body)
        assert response.status_code in (200, 201), response.text
        return response.json()

    def merge_patch(self, path: str, patch, status: bool = False):
        response = self.request("PATCH", path + ("/status" if status else ""), patch,
                                "application/merge-patch+json")
        assert response.status_code == 200, response.text
        return response.json()

    def delete(self, path: str):
        return self.request("DELETE", path)

    def close(self) -> None:
        self._client.close()


TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets"
CTR = "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"


def trainjob(name: str, ns: str = "default", runtime: str = "torch-distributed", **spec) -> dict:
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"runtimeRef": {"name": runtime}, **spec}}


def small_runtime(name: str = "torch-distributed") -> dict:
    """A ClusterTrainingRuntime shaped like upstream's torch-distributed (image kept)."""
    return torch_cluster_runtime(name, ["/bin/sh", "-c", "echo training"])


@pytest.fixture
def api(devcluster) -> Iterator[Api]:
    client = Api(devcluster)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="module")
def shared_stack(nats_server_module, devcluster_module, tmp_path_factory) -> Iterator[Stack]:
    """One stack (all four services running) for a whole test module; tests use their own names."""
    install_crds(devcluster_module)
    running = Stack(nats_server_module, devcluster_module, tmp_path_factory.mktemp("services"))
    running.start_all()
    try:
        yield running
    finally:
        running.stop_all()


@pytest.fixture(scope="module")
def shared_api(devcluster_module) -> Iterator[Api]:
    client = Api(devcluster_module)
    try:
        yield client
    finally:
        client.close()


def bus_call(url: str, action):
    """Runs ``await action(BusSession)`` against the stack's NATS from a synchronous test."""
    import asyncio

    from trainyard.bus.session import BusSession

    async def main():
        session = await BusSession.open(url, "test-inspector")
        try:
            return await action(session)
        finally:
            await session.close()

    return asyncio.run(main())


def stream_messages(url: str, stream: str, subject: str = ">") -> list:
    """Every message currently in ``stream`` (subject filter), read with an ephemeral consumer."""
    async def read(session):
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        info = await session.js.stream_info(stream)
        if info.state.messages == 0:
            return []
        sub = await session.js.pull_subscribe(subject, stream=stream, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0))
        total = (await sub.consumer_info()).num_pending  # matching messages when we started
        out = []
        deadline = time.monotonic() + 60
        # Read until every one has arrived (a fetch may time out or come back short on a
        # loaded machine).
        seen: set[int] = set()
        while len(out) < total and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(500, timeout=2.0)
            except Exception:
                continue
            for msg in msgs:  # without acks nothing is redelivered; keep each sequence once anyway
                if msg.metadata.sequence.stream not in seen:
                    seen.add(msg.metadata.sequence.stream)
                    out.append(msg)
        await sub.unsubscribe()
        return out

    return bus_call(url, read)


def leases(url: str) -> dict[str, dict[int, str]]:
    """role -> partition -> holder, as the ty_leases bucket has them now."""
    async def read(session):
        from nats.js.errors import KeyNotFoundError, NoKeysError

        from trainyard.bus.topology import LEASES_BUCKET

        kv = await session.js.key_value(LEASES_BUCKET)
        try:
            keys = await kv.keys()
        except NoKeysError:  # none yet (anything else, e.g. a listing that timed out on a busy
            return {}        # machine, is not "no leases": it read as {} and failed a test)
        found: dict[str, dict[int, str]] = {}
        for key in keys:
            role, _, kind, ident = key.split(".")
            if kind != "p":
                continue
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:  # handed over (deleted) between the listing and this read
                continue
            found.setdefault(role, {})[int(ident)] = entry.value.decode()
        return found

    return bus_call(url, read)
