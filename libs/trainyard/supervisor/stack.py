"""The whole local stack: NATS, devcluster, CRDs + runtimes, the four services; supervised."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trainyard.supervisor import kubeapi, lock, manifests
from trainyard.supervisor.binaries import nats_server_binary
from trainyard.supervisor.children import ChildSpec, ChildStartupError, ManagedChild
from trainyard.supervisor.layout import StackLayout
from trainyard.supervisor.ports import LOOPBACK, PortRequest
from trainyard.supervisor.proctable import ProcessId, become_child_subreaper, descendants, signal_process
from trainyard.supervisor.shutdown import kill_leftover_children
from trainyard.supervisor.state import StackState, write_pid_file, write_state

SERVICES = ("watcher", "planner", "applier", "status")
COMPONENTS = ("nats", "devcluster", *SERVICES)

Say = Callable[[str], None]


class StackError(Exception):
    """The stack could not start; the message says which part and why."""


@dataclass(frozen=True)
class StackConfig:
    data_dir: Path
    nats_port: int
    api_port: int
    services_port: int  # first of four consecutive ports; 0: a free port for each
    webhook_port: int
    skip: frozenset[str] = frozenset()
    startup_timeout_s: float = 120.0
    deploy_dir: Path = field(default_factory=manifests.repository_deploy_dir)


@dataclass(frozen=True)
class ResolvedPorts:
    nats: int
    api: int
    webhook: int
    services: dict[str, int]

    def as_dict(self) -> dict[str, int]:
        return {"nats": self.nats, "api": self.api, "webhook": self.webhook, **self.services}


def resolve_ports(config: StackConfig) -> ResolvedPorts:
    """Turn requested ports into real ones: 0 picks a free port, a busy port is a clear error.

    A skipped component's port is not checked: with `--skip nats` the services connect to a
    NATS the user runs on --nats-port, which is busy by design."""

    def resolve(component: str, request: PortRequest) -> int:
        return request.requested if component in config.skip else request.resolve()

    nats = resolve("nats", PortRequest(config.nats_port, "NATS client port", "--nats-port"))
    api = resolve("devcluster", PortRequest(config.api_port, "devcluster API server", "--api-port"))
    webhook = resolve("planner", PortRequest(config.webhook_port, "planner admission webhooks", "--webhook-port"))
    services = {}
    for offset, name in enumerate(SERVICES):
        if name in config.skip:
            continue
        requested = 0 if config.services_port == 0 else config.services_port + offset
        services[name] = PortRequest(requested, f"{name} health/metrics HTTP", "--services-port").resolve()
    return ResolvedPorts(nats=nats, api=api, webhook=webhook, services=services)


def _since(began: float) -> str:
    return f"{time.monotonic() - began:.1f}s"


def kubeconfig_server(kubeconfig: Path) -> str:
    import yaml

    clusters = (yaml.safe_load(kubeconfig.read_text()) or {}).get("clusters") or [{}]
    return str((clusters[0].get("cluster") or {}).get("server", ""))


def service_available(name: str) -> bool:
    from trainyard.cli.main import COMMANDS

    return name in COMMANDS


def trainyard_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainyard.cli.main", *args]


class Stack:
    def __init__(self, config: StackConfig, say: Say) -> None:
        self.config = config
        self.layout = StackLayout.at(config.data_dir)
        self.say = say
        self.children: dict[str, ManagedChild] = {}
        self.state: StackState | None = None
        self.ports: ResolvedPorts | None = None

    # -- checks before anything starts ---------------------------------------------------------

    def preflight(self) -> None:
        unknown = self.config.skip - set(COMPONENTS)
        if unknown:
            raise StackError(f"--skip: unknown component(s) {', '.join(sorted(unknown))}; choose from {', '.join(COMPONENTS)}")
        for name in SERVICES:
            if name not in self.config.skip and not service_available(name):
                raise StackError(
                    f"service {name} is not available in this installation (no `trainyard {name}` "
                    f"command; trainyard_services.{name} missing); run without it with --skip {name}"
                )
        if "devcluster" not in self.config.skip and not service_available("devcluster"):
            raise StackError("devcluster is not available in this installation (no `trainyard devcluster` "
                             "command; trainyard_services.devcluster missing)")
        running_services = [name for name in SERVICES if name not in self.config.skip]
        if "devcluster" in self.config.skip and running_services and not self.layout.kubeconfig.is_file():
            raise StackError(f"--skip devcluster: the services need the API server's kubeconfig at "
                             f"{self.layout.kubeconfig}; put it there or skip them too")
        if "nats" not in self.config.skip:
            nats_server_binary()
        manifests.load_runtimes(self.config.deploy_dir)  # fail now, not after starting processes

    # -- the child processes -------------------------------------------------------------------

    def _record_start(self, child: ManagedChild) -> None:
        assert self.state is not None and child.identity is not None
        self.state.children[child.name] = child.identity
        self.state.restarts[child.name] = child.restarts
        write_state(self.layout, self.state)

    def _child(self, spec: ChildSpec) -> ManagedChild:
        child = ManagedChild(spec, on_started=self._record_start)
        self.children[spec.name] = child
        return child

    @property
    def nats_url(self) -> str:
        assert self.ports is not None
        return f"nats://{LOOPBACK}:{self.ports.nats}"

    @property
    def devcluster_kubeconfig(self) -> Path:
        return self.layout.devcluster_dir / "kubeconfig"

    async def start_nats(self) -> None:
        assert self.ports is not None
        child = self._child(ChildSpec(
            name="nats",
            argv=[str(nats_server_binary()), "--jetstream", "--store_dir", str(self.layout.nats_dir),
                  "--addr", LOOPBACK, "--port", str(self.ports.nats), "--server_name", "trainyard"],
            log_file=self.layout.log_file("nats"),
        ))
        began = time.monotonic()
        await child.start()
        await child.wait_ready(self._nats_answers, timeout_s=30)
        self.say(f"  nats        ready   {self.nats_url}  ({_since(began)}; JetStream data in {self.layout.nats_dir})")

    async def _nats_answers(self) -> bool:
        assert self.ports is not None
        reader, writer = await asyncio.open_connection(LOOPBACK, self.ports.nats)
        try:
            greeting = await asyncio.wait_for(reader.readline(), timeout=2)
            return greeting.startswith(b"INFO ")
        finally:
            writer.close()

    async def start_devcluster(self) -> None:
        assert self.ports is not None
        child = self._child(ChildSpec(
            name="devcluster",
            argv=trainyard_argv("devcluster", "up", "--data-dir", str(self.layout.devcluster_dir),
                                "--port", str(self.ports.api)),
            log_file=self.layout.log_file("devcluster"),
            stop_timeout_s=30.0,
        ))
        # devcluster writes <its data dir>/ready (and the kubeconfig) once it serves, and removes
        # it when it stops; one left by a crash must not count as ready for this start.
        ready_file = self.layout.devcluster_dir / "ready"
        ready_file.unlink(missing_ok=True)

        async def answers() -> bool:
            if not ready_file.is_file() or not self.devcluster_kubeconfig.is_file():
                return False
            return await kubeapi.server_answers(self.devcluster_kubeconfig)

        began = time.monotonic()
        await child.start()
        await child.wait_ready(answers, timeout_s=self.config.startup_timeout_s)
        shutil.copyfile(self.devcluster_kubeconfig, self.layout.kubeconfig)
        if self.state is not None:
            self.state.api_url = kubeconfig_server(self.layout.kubeconfig)
            write_state(self.layout, self.state)
        self.say(f"  devcluster  ready   {self.state.api_url if self.state else self.ports.api}  "
                 f"({_since(began)}; data in {self.layout.devcluster_dir})")

    async def install_crds(self) -> None:
        """CRDs, the kubeflow-system namespace and the SDK's public ConfigMap: nothing a webhook checks."""
        began = time.monotonic()
        crds = manifests.load_crds(self.config.deploy_dir)
        client = await kubeapi.open_client(self.layout.kubeconfig)
        try:
            for crd in crds:
                await kubeapi.create_or_update(client, crd)
            await kubeapi.wait_until_served(
                client, "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", timeout_s=30
            )
            for manifest in (manifests.system_namespace(), manifests.public_configmap()):
                await kubeapi.create_or_update(client, manifest)
        finally:
            await client.close()
        self.say(f"  installed   {len(crds)} CRDs, {manifests.SYSTEM_NAMESPACE}/{manifests.PUBLIC_CONFIGMAP}  ({_since(began)})")

    async def install_runtimes(self) -> None:
        """After the planner is ready: runtimes pass its validating webhook, and on a resumed data
        dir the webhook configuration from the last run is only current once the planner re-registered."""
        began = time.monotonic()
        runtimes = manifests.load_runtimes(self.config.deploy_dir)
        client = await kubeapi.open_client(self.layout.kubeconfig)
        try:
            for runtime in runtimes:
                await kubeapi.create_or_update(client, runtime)
        finally:
            await client.close()
        self.say(f"  installed   runtimes {', '.join(r['metadata']['name'] for r in runtimes)}  ({_since(began)})")

    async def start_service(self, name: str) -> None:
        assert self.ports is not None
        port = self.ports.services[name]
        argv = trainyard_argv(name, "--kubeconfig", str(self.layout.kubeconfig), "--nats-url", self.nats_url,
                              "--http-port", str(port))
        if name == "planner":
            argv += ["--webhook-port", str(self.ports.webhook)]
        child = self._child(ChildSpec(name=name, argv=argv, log_file=self.layout.log_file(name)))

        async def ready() -> bool:
            import httpx

            async with httpx.AsyncClient(timeout=2) as http:
                response = await http.get(f"http://{LOOPBACK}:{port}/readyz")
                return response.status_code == 200

        began = time.monotonic()
        await child.start()
        await child.wait_ready(ready, timeout_s=self.config.startup_timeout_s)
        self.say(f"  {name:<11} ready   http://{LOOPBACK}:{port}/readyz  ({_since(began)})")

    async def start_all(self) -> None:
        if "nats" not in self.config.skip:
            await self.start_nats()
        if "devcluster" not in self.config.skip:
            await self.start_devcluster()
            await self.install_crds()
        services = [name for name in SERVICES if name not in self.config.skip]
        await asyncio.gather(*(self.start_service(name) for name in services))
        if "devcluster" not in self.config.skip:
            await self.install_runtimes()

    # -- stopping ------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        """Services first (they talk to both), then devcluster (it stops its pods), then NATS;
        finally anything still below us, e.g. a pod orphaned by a crashed devcluster."""
        before = descendants(os.getpid())
        services = [self.children[name] for name in SERVICES if name in self.children]
        await asyncio.gather(*(child.stop() for child in services))
        for name in ("devcluster", "nats"):
            if name in self.children:
                await self.children[name].stop()
        leftovers = [p for p in before + descendants(os.getpid()) if p.is_alive()]
        for process in leftovers:
            signal_process(process, signal.SIGKILL)
        for process in leftovers:
            try:
                os.waitpid(process.pid, os.WNOHANG)
            except ChildProcessError:
                pass

    # -- the whole run -------------------------------------------------------------------------

    async def run(self, on_ready: Callable[[Stack], None]) -> int:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stopping.set)
        startup = asyncio.ensure_future(self.start_all())
        stop_wait = asyncio.ensure_future(stopping.wait())
        try:
            await asyncio.wait({startup, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if not startup.done():
                self.say("trainyard: interrupted while starting; stopping")
                startup.cancel()
                await asyncio.gather(startup, return_exceptions=True)
                return 130
            error = startup.exception()
            if error is not None:
                if isinstance(error, (ChildStartupError, manifests.ManifestError, kubeapi.InstallError)):
                    print(f"error: {error}", file=sys.stderr, flush=True)
                    return 1
                raise error
            assert self.state is not None
            self.state.ready = True
            write_state(self.layout, self.state)
            on_ready(self)
            supervisors = [asyncio.ensure_future(child.supervise(stopping, self._report_restart))
                           for child in self.children.values()]
            await stopping.wait()
            await asyncio.gather(*supervisors, return_exceptions=True)
            return 0
        finally:
            stop_wait.cancel()
            self.say("trainyard: stopping")
            await self.stop_all()
            if self.state is not None:
                self.state.ready = False
                write_state(self.layout, self.state)
            self.layout.pid_file.unlink(missing_ok=True)
            self.say("trainyard: stopped")

    def _report_restart(self, message: str) -> None:
        self.say(f"trainyard: {message}")
        if self.state is not None:
            write_state(self.layout, self.state)


def run_stack(config: StackConfig, say: Say, on_ready: Callable[[Stack], None]) -> int:
    """Start the stack, call `on_ready` once everything is ready, run until SIGINT/SIGTERM."""
    stack = Stack(config, say)
    stack.preflight()
    stack.layout.create()
    try:
        held = lock.acquire(stack.layout)
    except lock.StackAlreadyRunning as err:
        running = stack.layout.pid_file.read_text().strip() if stack.layout.pid_file.exists() else "?"
        raise StackError(
            f"a trainyard stack is already running on {err} (pid {running}); "
            f"stop it with `trainyard down --data-dir {err}`"
        ) from err
    try:
        leftovers = kill_leftover_children(stack.layout)
        if leftovers:
            say(f"trainyard: stopped processes left by an earlier run: {', '.join(leftovers)}")
        stack.ports = resolve_ports(config)
        become_child_subreaper()
        me = ProcessId.of(os.getpid())
        stack.state = StackState(
            supervisor=me, ports=stack.ports.as_dict(), kubeconfig=str(stack.layout.kubeconfig),
            nats_url=stack.nats_url,
        )
        write_state(stack.layout, stack.state)
        write_pid_file(stack.layout, me.pid)
        return asyncio.run(stack.run(on_ready))
    finally:
        held.close()
