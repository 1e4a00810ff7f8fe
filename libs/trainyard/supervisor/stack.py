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

from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.supervisor import kubeapi, lock, manifests
from trainyard.supervisor.binaries import nats_server_binary
from trainyard.supervisor.children import ChildSpec, ChildStartupError, ManagedChild
from trainyard.supervisor.layout import StackLayout
from trainyard.supervisor.ports import LOOPBACK, PortRequest, free_port
from trainyard.supervisor.proctable import ProcessId, become_child_subreaper, descendants, signal_process
from trainyard.supervisor.shutdown import kill_leftover_children
from trainyard.supervisor.state import StackState, write_pid_file, write_state
from trainyard.roles import CLUSTER_ROLES

SERVICES = CLUSTER_ROLES
COMPONENTS = ("nats", "devcluster", *SERVICES, "dashboard")
# Cluster names on the bus: a single cluster keeps the services' default; with workers, the
# manager is "manager" (the origin label of its copies) and the workers worker-1..worker-N.
SINGLE_CLUSTER = "default"
MANAGER_CLUSTER = "manager"
SECRETS_NAMESPACE = "kubeflow-system"

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
    workers: int = 0
    worker_lost_timeout_s: float = 900.0
    dashboard_port: int = 0
    nats_cluster: int = 1  # NATS nodes; more than one: a local JetStream cluster (routes on free ports)
    # Feature gate TrainJobStatus (off by default upstream; on in a local stack): trainer pods
    # report progress to the status service's HTTPS endpoint (docs/pipeline.md).
    trainjob_status: bool = True
    # Planner processes per cluster; each serves the admission webhooks behind one Service, so
    # a planner that dies mid-burst costs clients nothing (docs/security.md, deploy/ runs 2).
    planner_replicas: int = 2
    # Upstream behaviour where Kubeflow Trainer v2.1.0 and v2.3.0 differ (docs/compatibility.md):
    # passed to the planners and the status service.
    trainer_compat: TrainerCompat = DEFAULT_COMPAT
    # devcluster API worker processes (docs/devcluster.md); 0: devcluster's default from the cores
    api_workers: int = 0


@dataclass(frozen=True)
class ClusterPlan:
    """One API server of the stack and the four services that run for it."""

    name: str            # the cluster name on the bus (--cluster)
    prefix: str          # of its children's names: "" for the manager, "worker-1-" for a worker
    devcluster_dir: Path
    kubeconfig: Path     # the copy users point kubectl at
    api_port: int
    webhook_port: int
    service_ports: dict[str, int]
    # Replicas 2..N of the planner: (webhook port, health/metrics port) each.
    extra_planners: tuple[tuple[int, int], ...] = ()

    def child(self, component: str) -> str:
        return f"{self.prefix}{component}"

    def planner_replicas(self) -> list[tuple[str, int, int]]:
        """Every planner process of this cluster: (child name, webhook port, health port)."""
        first = [(self.child("planner"), self.webhook_port, self.service_ports["planner"])] \
            if "planner" in self.service_ports else []
        return first + [(self.child(f"planner-{index}"), webhook, http)
                        for index, (webhook, http) in enumerate(self.extra_planners, 2)]


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


def trainyard_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainyard.cli.main", *args]


def nats_route_args(index: int, route_ports: list[int]) -> list[str]:
    """nats-server flags that make node ``index`` (1-based) of a local JetStream cluster listen
    for routes on ``route_ports[index - 1]`` and route to every other node, over loopback without
    authentication (``trainyard up --nats-cluster`` without bus security; bench/e2e.py)."""
    routes = [f"nats://{LOOPBACK}:{port}" for i, port in enumerate(route_ports, 1) if i != index]
    return ["--cluster_name", "trainyard", "--cluster", f"nats://{LOOPBACK}:{route_ports[index - 1]}",
            "--routes", ",".join(routes)]


class Stack:
    def __init__(self, config: StackConfig, say: Say) -> None:
        self.config = config
        self.layout = StackLayout.at(config.data_dir)
        self.say = say
        self.children: dict[str, ManagedChild] = {}
        self.state: StackState | None = None
        self.ports: ResolvedPorts | None = None
        self.clusters: list[ClusterPlan] = []
        # The bus's NKey identities, CA and server config (docs/security.md); None with --skip nats.
        self.bus_security = None
        # --nats-cluster: the other nodes' client ports and every node's route port (free ports).
        self.nats_extra_ports: list[int] = []
        self.nats_route_ports: list[int] = []
        # TrainJobStatus per cluster: (bind address, port, certificate directory).
        self.trainjob_status: dict[str, tuple[str, int, Path]] = {}
        # (cluster, service) -> the kubeconfig with that service's ServiceAccount token (identities.py).
        self.identities: dict[tuple[str, str], Path] = {}

    def plan_clusters(self) -> None:
        """The manager from the configured ports; workers on free ports, each in its own
        directory under <data-dir>/clusters/."""
        assert self.ports is not None
        manager = ClusterPlan(
            name=MANAGER_CLUSTER if self.config.workers else SINGLE_CLUSTER, prefix="",
            devcluster_dir=self.layout.devcluster_dir, kubeconfig=self.layout.kubeconfig,
            api_port=self.ports.api, webhook_port=self.ports.webhook, service_ports=self.ports.services,
            extra_planners=self._extra_planner_ports(),
        )
        self.clusters = [manager]
        self._record_extra_planner_ports(manager)
        for index in range(1, self.config.workers + 1):
            name = f"worker-{index}"
            directory = self.layout.cluster_dir(name)
            self.clusters.append(ClusterPlan(
                name=name, prefix=f"{name}-", devcluster_dir=directory / "devcluster",
                kubeconfig=directory / "kubeconfig", api_port=free_port(), webhook_port=free_port(),
                service_ports={service: free_port() for service in SERVICES if service not in self.config.skip},
                extra_planners=self._extra_planner_ports(),
            ))
            self.ports.services.update({f"{name}-{k}": v for k, v in self.clusters[-1].service_ports.items()})
            self._record_extra_planner_ports(self.clusters[-1])
        if self.config.workers:
            self.ports.services["dispatcher"] = free_port()

    @property
    def webhook_behind_service(self) -> bool:
        """The planners' webhooks are called through a Service when the stack runs its own
        devcluster (an external API server cannot reach host processes by a Service)."""
        return "devcluster" not in self.config.skip and "planner" not in self.config.skip

    def _record_extra_planner_ports(self, cluster: ClusterPlan) -> None:
        assert self.ports is not None
        self.ports.services.update({name: http for name, _, http in cluster.planner_replicas()[1:]})

    def _extra_planner_ports(self) -> tuple[tuple[int, int], ...]:
        if not self.webhook_behind_service:
            return ()
        return tuple((free_port(), free_port()) for _ in range(self.config.planner_replicas - 1))

    @property
    def manager(self) -> ClusterPlan:
        return self.clusters[0]

    @property
    def workers(self) -> list[ClusterPlan]:
        return self.clusters[1:]

    # -- checks before anything starts ---------------------------------------------------------

    def preflight(self) -> None:
        if self.config.workers < 0:
            raise StackError(f"--workers: must be 0 or more, got {self.config.workers}")
        if self.config.api_workers < 0:
            raise StackError(f"--api-workers: must be 0 (the devcluster's default) or more, got {self.config.api_workers}")
        if self.config.planner_replicas < 1:
            raise StackError(f"--planner-replicas: must be 1 or more, got {self.config.planner_replicas}")
        if self.config.worker_lost_timeout_s <= 0:
            raise StackError("--worker-lost-timeout: must be greater than 0")
        if self.config.workers and "devcluster" in self.config.skip:
            raise StackError("--workers runs a devcluster per worker; it cannot be combined with --skip devcluster")
        unknown = self.config.skip - set(COMPONENTS)
        if unknown:
            raise StackError(f"--skip: unknown component(s) {', '.join(sorted(unknown))}; choose from {', '.join(COMPONENTS)}")
        running_services = [name for name in SERVICES if name not in self.config.skip]
        if "devcluster" in self.config.skip and running_services and not self.layout.kubeconfig.is_file():
            raise StackError(f"--skip devcluster: the services need the API server's kubeconfig at "
                             f"{self.layout.kubeconfig}; put it there or skip them too")
        if self.config.nats_cluster < 1 or (self.config.nats_cluster > 1 and self.config.nats_cluster % 2 == 0):
            raise StackError(f"--nats-cluster: 1 or an odd number of nodes (JetStream needs a majority), "
                             f"got {self.config.nats_cluster}")
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
        """The client URL, or with --nats-cluster every node's, comma-separated."""
        assert self.ports is not None
        ports = [self.ports.nats, *self.nats_extra_ports]
        scheme = "tls" if self.secured_bus else "nats"
        return ",".join(f"{scheme}://{LOOPBACK}:{port}" for port in ports)

    @property
    def secured_bus(self) -> bool:
        """The NATS this stack runs has TLS, NKey users and no anonymous access (an external
        one, --skip nats, is the user's to secure)."""
        return "nats" not in self.config.skip

    @property
    def bus_dir(self) -> Path:
        return self.layout.root / "bus"

    def bus_env(self, role: str, cluster: str | None = None) -> dict[str, str]:
        """The environment naming ``role``'s credentials file (empty on an unsecured bus)."""
        if self.bus_security is None:
            return {}
        from trainyard.bus.auth import CREDENTIALS_ENV

        return {CREDENTIALS_ENV: str(self.bus_security.credentials_for(role, cluster))}

    async def prepare_bus_security(self) -> None:
        """CA + server certificate, one NKey per identity, the server's authorization include:
        kept in <data dir>/bus (0700, files 0600); seeds survive a restart, grants are rewritten."""
        from trainyard.bus.auth import generate

        clusters = [cluster.name for cluster in self.clusters]
        self.bus_security = await asyncio.to_thread(generate, self.bus_dir, clusters, manager=self.manager.name)

    async def bootstrap_bus(self) -> None:
        """Streams and buckets, created as the bootstrap identity (the services cannot)."""
        from trainyard.bus.auth import BOOTSTRAP, Credentials
        from trainyard.bus.connection import ServerTooOld, connect
        from trainyard.bus.topology import ensure_topology

        assert self.bus_security is not None
        credentials = await asyncio.to_thread(Credentials.load, self.bus_security.credentials_for(BOOTSTRAP))
        began = time.monotonic()
        deadline = began + 30
        while True:
            try:
                nc = await connect(self.nats_url, "trainyard-bootstrap", credentials=credentials)
                try:
                    await ensure_topology(nc.jetstream())
                finally:
                    await nc.close()
                break
            except ServerTooOld as err:
                raise StackError(f"nats: {err}") from None
            except Exception as err:  # JetStream still starting (a cluster electing its leader)
                if time.monotonic() > deadline:
                    raise StackError(f"nats: creating the streams and buckets failed: {err}") from err
                await asyncio.sleep(0.3)
        self.say(f"  bus         ready   streams and buckets; {len(self.bus_security.credentials)} identities "
                 f"in {self.bus_dir}  ({_since(began)})")

    @property
    def nats_children(self) -> list[str]:
        return ["nats"] + [f"nats-{index}" for index in range(2, self.config.nats_cluster + 1)]

    def _nats_node_argv(self, index: int, client_port: int) -> list[str]:
        """Node ``index`` (1-based); with several nodes, a JetStream cluster over loopback routes."""
        name = self.nats_children[index - 1]
        store = self.layout.nats_dir if index == 1 else self.layout.nats_dir / name
        argv = [str(nats_server_binary()), "--jetstream", "--store_dir", str(store),
                "--addr", LOOPBACK, "--port", str(client_port),
                "--server_name", "trainyard" if self.config.nats_cluster == 1 else f"trainyard-{index}"]
        if self.bus_security is not None and self.config.nats_cluster > 1:
            # Routes authenticated too; the password in a 0600 file, never on a command line.
            argv[1:1] = ["--config", str(self._nats_node_config(index))]
            return argv
        if self.bus_security is not None:  # TLS, NKey users, least privilege (flags above override ports)
            argv[1:1] = ["--config", str(self.bus_security.server_config)]
        if self.config.nats_cluster > 1:
            argv += nats_route_args(index, self.nats_route_ports)
        return argv


    def _nats_node_config(self, index: int) -> Path:
        """A node's config for a secured local JetStream cluster: the users and TLS (included),
        and its cluster block, whose routes log in with a password kept in <data dir>/bus."""
        import json
        import secrets as random_secrets

        from trainyard.security.pki import write_private

        password_file = self.bus_dir / "route-password"
        if not password_file.is_file():
            write_private(password_file, random_secrets.token_urlsafe(32).encode())
        password = password_file.read_text().strip()
        routes = [f"nats://route:{password}@{LOOPBACK}:{port}"
                  for i, port in enumerate(self.nats_route_ports, 1) if i != index]
        text = (f"include {self.bus_security.server_config.name}\n"  # type: ignore[union-attr]
                "cluster {\n  name: trainyard\n"
                f"  listen: {json.dumps(f'{LOOPBACK}:{self.nats_route_ports[index - 1]}')}\n"
                f"  authorization {{ user: route, password: {json.dumps(password)} }}\n"
                f"  routes: {json.dumps(routes)}\n}}\n")
        path = self.bus_dir / f"nats-node-{index}.conf"
        write_private(path, text.encode())
        return path

    async def start_nats(self) -> None:
        assert self.ports is not None
        ports = [self.ports.nats, *self.nats_extra_ports]
        children = []
        for index, port in enumerate(ports, 1):
            name = self.nats_children[index - 1]
            children.append((self._child(ChildSpec(name=name, argv=self._nats_node_argv(index, port),
                                                   log_file=self.layout.log_file(name))), port))
        began = time.monotonic()
        for child, _ in children:
            await child.start()
        for child, port in children:
            await child.wait_ready(lambda port=port: self._nats_answers(port), timeout_s=30, waiting=self.say)
        nodes = f"; a JetStream cluster of {len(ports)} nodes" if len(ports) > 1 else ""
        self.say(f"  nats        ready   {self.nats_url}  ({_since(began)}; JetStream data in {self.layout.nats_dir}{nodes})")
        if self.bus_security is not None:
            await self.bootstrap_bus()

    async def _nats_answers(self, port: int | None = None) -> bool:
        assert self.ports is not None
        reader, writer = await asyncio.open_connection(LOOPBACK, port or self.ports.nats)
        try:
            greeting = await asyncio.wait_for(reader.readline(), timeout=2)
            return greeting.startswith(b"INFO ")
        finally:
            writer.close()

    async def start_devcluster(self, cluster: ClusterPlan) -> None:
        cluster.devcluster_dir.mkdir(parents=True, exist_ok=True)
        name = cluster.child("devcluster")
        child = self._child(ChildSpec(
            name=name,
            # ElasticJobSet on: elastic TrainJobs resize their JobSet in place (docs/elastic.md)
            argv=trainyard_argv("devcluster", "up", "--data-dir", str(cluster.devcluster_dir),
                                "--port", str(cluster.api_port), "--jobset-feature-gates", "ElasticJobSet=true",
                                *(["--api-workers", str(self.config.api_workers)] if self.config.api_workers else [])),
            log_file=self.layout.log_file(name),
            stop_timeout_s=30.0,
        ))
        # devcluster writes <its data dir>/ready (and the kubeconfig) once it serves, and
        # dataplane-ready once its data plane has made the pod network and registered the Node
        # with that network's address; it removes both when it stops. Files left by a crash must
        # not count as ready for this start: the stored Node then still names the last run's
        # bridge address, which is on no interface, and the status service could not bind it.
        ready_file = cluster.devcluster_dir / "ready"
        ready_file.unlink(missing_ok=True)
        self._dataplane_ready_file(cluster).unlink(missing_ok=True)
        served_kubeconfig = cluster.devcluster_dir / "kubeconfig"

        async def answers() -> bool:
            if not ready_file.is_file() or not served_kubeconfig.is_file():
                return False
            return await kubeapi.server_answers(served_kubeconfig) and self.dataplane_address(cluster) is not None

        began = time.monotonic()
        await child.start()
        await child.wait_ready(answers, timeout_s=self.config.startup_timeout_s, waiting=self.say)
        shutil.copyfile(served_kubeconfig, cluster.kubeconfig)
        api_url = kubeconfig_server(cluster.kubeconfig)
        if self.state is not None:
            if cluster is self.manager:
                self.state.api_url = api_url
            if self.config.workers:
                self.state.clusters[cluster.name] = {"kubeconfig": str(cluster.kubeconfig), "api_url": api_url}
            write_state(self.layout, self.state)
        self.say(f"  {name:<11} ready   {api_url}  ({_since(began)}; data in {cluster.devcluster_dir})")

    @staticmethod
    def _dataplane_ready_file(cluster: ClusterPlan) -> Path:
        return cluster.devcluster_dir / "dataplane-ready"

    def dataplane_address(self, cluster: ClusterPlan) -> str | None:
        """The node address the devcluster's data plane registered in this start (its pod
        bridge's host side, or 127.0.0.1 in shared-network mode); None until it has."""
        import json

        try:
            return str(json.loads(self._dataplane_ready_file(cluster).read_text())["host_ip"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not written yet (or being written)

    async def install_crds(self, cluster: ClusterPlan) -> None:
        """CRDs, the kubeflow-system namespace and the SDK's public ConfigMap: nothing a webhook checks."""
        began = time.monotonic()
        crds = manifests.load_crds(self.config.deploy_dir, self.config.trainer_compat)
        client = await kubeapi.open_client(cluster.kubeconfig)
        try:
            for crd in crds:
                await kubeapi.create_or_update(client, crd)
            await kubeapi.wait_until_served(
                client, "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes", timeout_s=30
            )
            for manifest in (manifests.system_namespace(), manifests.public_configmap(self.config.trainer_compat)):
                await kubeapi.create_or_update(client, manifest)
        finally:
            await client.close()
        self.say(f"  installed   {len(crds)} CRDs, {manifests.SYSTEM_NAMESPACE}/{manifests.PUBLIC_CONFIGMAP}"
                 f"{' on ' + cluster.name if self.config.workers else ''}  ({_since(began)})")

    async def install_runtimes(self, cluster: ClusterPlan) -> None:
        """After the planner is ready: runtimes pass its validating webhook, and on a resumed data
        dir the webhook configuration from the last run is only current once the planner re-registered."""
        began = time.monotonic()
        runtimes = manifests.load_runtimes(self.config.deploy_dir)
        client = await kubeapi.open_client(cluster.kubeconfig)
        try:
            for runtime in runtimes:
                await kubeapi.create_or_update(client, runtime)
        finally:
            await client.close()
        self.say(f"  installed   runtimes {', '.join(r['metadata']['name'] for r in runtimes)}"
                 f"{' on ' + cluster.name if self.config.workers else ''}  ({_since(began)})")

    async def prepare_trainjob_status(self, cluster: ClusterPlan) -> None:
        """The status endpoint's certificate, and the Service trainer pods reach it by (its
        EndpointSlice names the node's address, where the status service listens).

        The address is the one this start's data plane registered (start_devcluster waited for
        it), not whatever Node the store holds: on a resumed data dir that is the last run's."""
        from trainyard.security import pki

        began = time.monotonic()
        address = self.dataplane_address(cluster)
        if address is None:
            raise StackError(f"{cluster.child('devcluster')}: its data plane has not registered the node "
                             f"({self._dataplane_ready_file(cluster)} is missing)")
        client = await kubeapi.open_client(cluster.kubeconfig)
        try:
            port = free_port()
            directory = self.config.data_dir / "trainjob-status" / cluster.name
            pki.ensure_bundle(directory, manifests.status_service_hosts() + [address],
                              ca_common_name="trainyard trainer status CA")
            for manifest in (manifests.status_service(port), manifests.status_endpoint_slice(address, port)):
                await kubeapi.create_or_update(client, manifest)
        finally:
            await client.close()
        self.trainjob_status[cluster.name] = (address, port, directory)
        self.say(f"  prepared    trainer status endpoint https://{manifests.status_service_hosts()[0]}:{port}"
                 f"{' on ' + cluster.name if self.config.workers else ''}  ({_since(began)})")

    async def prepare_webhook_service(self, cluster: ClusterPlan) -> None:
        """The webhook Service and one EndpointSlice per planner replica; slices of replicas
        this run does not have (an earlier run's) are deleted."""
        client = await kubeapi.open_client(cluster.kubeconfig)
        try:
            await kubeapi.create_or_update(client, manifests.webhook_service())
            wanted = set()
            for replica, (name, webhook_port, _) in enumerate(cluster.planner_replicas(), 1):
                slice_ = manifests.webhook_endpoint_slice(str(replica), LOOPBACK, webhook_port)
                wanted.add(slice_["metadata"]["name"])
                await kubeapi.create_or_update(client, slice_)
            await kubeapi.delete_labelled(
                client, f"/apis/discovery.k8s.io/v1/namespaces/{manifests.SYSTEM_NAMESPACE}/endpointslices",
                f"kubernetes.io/service-name={manifests.WEBHOOK_SERVICE}", keep=wanted)
        finally:
            await client.close()

    async def prepare_identities(self, cluster: ClusterPlan) -> None:
        """deploy/'s ServiceAccounts and RBAC applied to the cluster, and a kubeconfig with its
        own ServiceAccount token for each service that runs there (docs/security.md)."""
        from trainyard.supervisor import identities

        began = time.monotonic()
        services = [name for name in SERVICES if name not in self.config.skip]
        dispatcher = bool(self.config.workers) and cluster is self.manager
        written = await identities.prepare(cluster.kubeconfig, self.config.deploy_dir,
                                           self.layout.root / "identities" / cluster.name, services, dispatcher,
                                           worker=cluster is not self.manager)
        self.identities.update({(cluster.name, service): path for service, path in written.items()})
        self.say(f"  identities  {len(written)} ServiceAccounts bound by deploy/ RBAC"
                 f"{' on ' + cluster.name if self.config.workers else ''}  ({_since(began)})")

    def service_kubeconfig(self, cluster: ClusterPlan, service: str) -> Path:
        """The service's own identity on a devcluster of the stack; the cluster's kubeconfig
        on an API server the stack did not start (--skip devcluster)."""
        return self.identities.get((cluster.name, service), cluster.kubeconfig)

    async def start_planners(self, cluster: ClusterPlan) -> None:
        await asyncio.gather(*(self.start_service(cluster, "planner", replica=replica)
                               for replica in cluster.planner_replicas()))

    async def start_service(self, cluster: ClusterPlan, service: str,
                            replica: tuple[str, int, int] | None = None) -> None:
        if service == "planner" and replica is None:
            await self.start_planners(cluster)
            return
        port = replica[2] if replica else cluster.service_ports[service]
        argv = trainyard_argv(service, "--kubeconfig", str(self.service_kubeconfig(cluster, service)),
                              "--nats-url", self.nats_url, "--http-port", str(port), "--cluster", cluster.name)
        if service == "planner" and replica is not None:
            # No drain locally: devcluster tries the next replica when one refuses (docs/devcluster.md).
            argv += ["--webhook-port", str(replica[1]), "--webhook-drain", "0"]
            if self.webhook_behind_service:
                argv += ["--webhook-service", manifests.WEBHOOK_SERVICE,
                         "--webhook-namespace", manifests.SYSTEM_NAMESPACE]
        if service in ("planner", "status"):
            argv += ["--trainer-compat", self.config.trainer_compat.value]
        endpoint = self.trainjob_status.get(cluster.name)
        if endpoint is not None and service == "planner":
            argv += ["--trainjob-status-url", f"https://{manifests.status_service_hosts()[0]}:{endpoint[1]}",
                     "--trainjob-status-ca-file", str(endpoint[2] / "ca.crt")]
        if endpoint is not None and service == "status":
            argv += ["--trainjob-status-host", endpoint[0], "--trainjob-status-port", str(endpoint[1]),
                     "--trainjob-status-cert-dir", str(endpoint[2])]
        await self._start_service_child(replica[0] if replica else cluster.child(service), argv, port,
                                        self.bus_env(service, cluster.name))

    async def start_dispatcher(self) -> None:
        port = self.ports.services["dispatcher"] if self.ports else 0
        argv = trainyard_argv("dispatcher", "--kubeconfig", str(self.service_kubeconfig(self.manager, "dispatcher")),
                              "--nats-url", self.nats_url,
                              "--http-port", str(port), "--cluster", self.manager.name,
                              "--secrets-namespace", SECRETS_NAMESPACE,
                              "--worker-lost-timeout", f"{self.config.worker_lost_timeout_s:g}",
                              "--probe-interval", "1", "--resync-interval", "2")
        await self._start_service_child("dispatcher", argv, port, self.bus_env("dispatcher"))

    async def _start_service_child(self, name: str, argv: list[str], port: int,
                                   env: dict[str, str] | None = None) -> None:
        child = self._child(ChildSpec(name=name, argv=argv, log_file=self.layout.log_file(name), env=env or {}))

        import httpx

        # One client for all the polls, and no certificate store: the probe is plain HTTP on
        # loopback, and loading the system CAs costs ~50 ms of CPU per client, which five
        # polls a second for each starting service turned into most of `up`'s own CPU.
        async with httpx.AsyncClient(timeout=2, verify=False) as http:
            async def ready() -> bool:
                response = await http.get(f"http://{LOOPBACK}:{port}/readyz")
                return response.status_code == 200

            began = time.monotonic()
            await child.start()
            await child.wait_ready(ready, timeout_s=self.config.startup_timeout_s, waiting=self.say)
        self.say(f"  {name:<11} ready   http://{LOOPBACK}:{port}/readyz  ({_since(began)})")

    async def start_all(self) -> None:
        if not self.clusters:
            self.plan_clusters()
        if "nats" not in self.config.skip:
            await self.prepare_bus_security()
            await self.start_nats()
        if "devcluster" not in self.config.skip:
            await asyncio.gather(*(self.start_devcluster(cluster) for cluster in self.clusters))
            await asyncio.gather(*(self.install_crds(cluster) for cluster in self.clusters))
            await asyncio.gather(*(self.prepare_identities(cluster) for cluster in self.clusters))
            if self.config.trainjob_status and {"planner", "status"}.isdisjoint(self.config.skip):
                await asyncio.gather(*(self.prepare_trainjob_status(cluster) for cluster in self.clusters))
            if self.webhook_behind_service:
                await asyncio.gather(*(self.prepare_webhook_service(cluster) for cluster in self.clusters))
        services = [name for name in SERVICES if name not in self.config.skip]
        await asyncio.gather(*(self.start_service(cluster, name) for cluster in self.clusters for name in services))
        if "devcluster" not in self.config.skip:
            await asyncio.gather(*(self.install_runtimes(cluster) for cluster in self.clusters))
        if self.config.workers:
            await self.register_workers()
            await self.start_dispatcher()
        if self.dashboard_wanted():
            await self.start_dashboard()

    def dashboard_wanted(self) -> bool:
        """With the services and an API server to show (not in a NATS-only stack)."""
        return "dashboard" not in self.config.skip \
            and any(name not in self.config.skip for name in SERVICES) and self.manager.kubeconfig.is_file()

    async def start_dashboard(self) -> None:
        """The live web dashboard over every cluster of the stack (services from stack.json)."""
        port = PortRequest(self.config.dashboard_port, "web dashboard", "--dashboard-port").resolve()
        argv = trainyard_argv("dashboard", "--kubeconfig", str(self.manager.kubeconfig), "--nats-url", self.nats_url,
                              "--http-port", str(port), "--cluster", self.manager.name,
                              "--clusters", ",".join(cluster.name for cluster in self.clusters),
                              "--stack-state", str(self.layout.state_file))
        await self._start_service_child("dashboard", argv, port, self.bus_env("dashboard"))
        if self.state is not None:
            self.state.dashboard_url = f"http://{LOOPBACK}:{port}/"
            self.state.ports["dashboard"] = port
            write_state(self.layout, self.state)

    async def register_workers(self) -> None:
        """On the manager: the MultiKueueCluster CRD (unless Kueue serves its own), and for each
        worker a Secret with its kubeconfig and a MultiKueueCluster naming that Secret."""
        began = time.monotonic()
        client = await kubeapi.open_client(self.manager.kubeconfig)
        try:
            if not await kubeapi.is_served(client, "/apis/kueue.x-k8s.io/v1beta1", "multikueueclusters"):
                for crd in manifests.load_multicluster_crds(self.config.deploy_dir):
                    await kubeapi.create_or_update(client, crd)
                await kubeapi.wait_until_served(client, "/apis/kueue.x-k8s.io/v1beta1/multikueueclusters",
                                                timeout_s=30)
            for worker in self.workers:
                # the dispatcher reaches the worker as trainyard-dispatcher-remote (worker-rbac.yaml)
                access = self.service_kubeconfig(worker, "dispatcher-remote")
                for manifest in manifests.worker_registration(worker.name, access.read_text(),
                                                              SECRETS_NAMESPACE):
                    await kubeapi.create_or_update(client, manifest)
        finally:
            await client.close()
        self.say(f"  registered  workers {', '.join(w.name for w in self.workers)} as MultiKueueClusters "
                 f"({_since(began)})")

    # -- stopping ------------------------------------------------------------------------------

    async def stop_all(self) -> None:
        """Services first (they talk to both), then devcluster (it stops its pods), then NATS;
        finally anything still below us, e.g. a pod orphaned by a crashed devcluster."""
        before = descendants(os.getpid())
        nats = set(self.nats_children)
        infrastructure = {cluster.child("devcluster") for cluster in self.clusters} | {"devcluster"} | nats
        services = [child for name, child in self.children.items() if name not in infrastructure]
        await asyncio.gather(*(child.stop() for child in services))
        devclusters = [self.children[name] for name in infrastructure - nats if name in self.children]
        await asyncio.gather(*(child.stop() for child in devclusters))
        await asyncio.gather(*(self.children[name].stop() for name in sorted(nats) if name in self.children))
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
            # What on_ready does (the user's kubeconfig merged, the announcement) is part of
            # being ready: whoever waits for the state file's ready (`trainyard up` callers,
            # tests) finds it done. Written before it, a loaded machine let a reader see ready
            # and the user's kubeconfig not yet merged.
            on_ready(self)
            self.state.ready = True
            write_state(self.layout, self.state)
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
        if config.nats_cluster > 1 and "nats" not in config.skip:
            stack.nats_extra_ports = [free_port() for _ in range(config.nats_cluster - 1)]
            stack.nats_route_ports = [free_port() for _ in range(config.nats_cluster)]
        stack.plan_clusters()
        become_child_subreaper()
        me = ProcessId.of(os.getpid())
        stack.state = StackState(
            supervisor=me, kubeconfig=str(stack.layout.kubeconfig),
            ports={**stack.ports.as_dict(), **{f"nats-{i}": p for i, p in enumerate(stack.nats_extra_ports, 2)}},
            nats_url=stack.nats_url,
            nats_credentials=str(stack.bus_dir / "credentials") if stack.secured_bus else "",
        )
        write_state(stack.layout, stack.state)
        write_pid_file(stack.layout, me.pid)
        return asyncio.run(stack.run(on_ready))
    finally:
        held.close()
