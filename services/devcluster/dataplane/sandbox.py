"""A pod's sandbox on this node (what the CRI calls the pod sandbox): its directory, network
address, resolved ConfigMaps/Secrets/tokens, volumes, hosts-file entry and the host mount
targets it holds, and the command line that enters a process into it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Awaitable, Callable

from .hosts import HostsTable
from .isolation import entered_command, isolated_mounts, resolv_conf, wrapper_script
from .network import PodAddress, PodNetwork, kill_netns_processes
from .podenv import (ContainerConfigError, PodContext, TokenProjection, container_env, pod_hostname,
                     token_projections)
from .volumes import Mount, MountpointRegistry, VolumeError, container_mounts, materialize_volumes, remove_tree

SourceFetcher = Callable[[str, set[str], set[str]],
                         Awaitable[tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]]]
# (namespace, service account, pod name, pod uid, projection) -> token; raises
# ContainerConfigError when the API server refuses.
TokenFetcher = Callable[[str, str, str, str, TokenProjection], Awaitable[str]]


class PodSandbox:
    """Everything one pod's containers share on this node, from set-up to tear-down.

    ``pod`` is the latest pod object (the kubelet replaces it as updates arrive); the sandbox
    reads it whenever it builds an environment or a hostname.
    """

    def __init__(self, pod: dict[str, Any], *, uid: str, data_dir: Path, node_name: str,
                 base_env: Callable[[], dict[str, str]], network: PodNetwork, hosts: HostsTable,
                 mountpoints: MountpointRegistry, fetch_sources: SourceFetcher,
                 fetch_token: TokenFetcher | None) -> None:
        self.pod = pod
        metadata = pod.get("metadata") or {}
        self.namespace = metadata.get("namespace", "default")
        self.name = metadata.get("name", "")
        self.uid = uid
        self.data_dir = data_dir
        self.node_name = node_name
        self.base_env = base_env
        self.network = network
        self.hosts = hosts
        self.mountpoints = mountpoints
        self.fetch_sources = fetch_sources
        self.fetch_token = fetch_token
        self.directory = data_dir / "sandboxes" / uid
        self.address: PodAddress | None = None
        self.context: PodContext | None = None
        self.volume_paths: dict[str, Path] = {}
        self.ready = False  # the PodReadyToStartContainers condition
        self._acquired: list[str] = []

    # -- set-up ------------------------------------------------------------------------
    async def resolve(self, sources: tuple[set[str], set[str]], containers: list[dict[str, Any]]) -> None:
        """One attempt at what the containers need: their ConfigMaps and Secrets, the projected
        tokens, the pod's address (taken once) and its volumes. Raises ContainerConfigError or
        VolumeError, with the kubelet's message, while something is missing."""
        configmap_names, secret_names = sources
        configmaps, secrets = await self.fetch_sources(self.namespace, configmap_names, secret_names)
        tokens = await self._tokens()
        if self.address is None:
            self.address = await self.network.attach()
        self.context = PodContext(
            pod_ip=self.address.ip, host_ip=self.network.host_ip,
            node_name=self.node_name, configmaps=configmaps, secrets=secrets,
            base_env=self.base_env(), tokens=tokens)
        self.volume_paths = materialize_volumes(self.pod, self.context, self.directory / "volumes",
                                                self.data_dir / "claims")
        for spec in containers:
            container_env(self.pod, spec, self.context)  # validates every source now

    async def _tokens(self) -> dict[str, str]:
        """The pod's projected ServiceAccount tokens, requested as the kubelet does: for the
        pod's ServiceAccount, bound to the pod (they are not refreshed: pods here are short)."""
        projections = token_projections(self.pod)
        if not projections:
            return {}
        if self.fetch_token is None:
            raise ContainerConfigError("serviceAccountToken projections need the API server")
        account = (self.pod.get("spec") or {}).get("serviceAccountName") or "default"
        return {p.key: await self.fetch_token(self.namespace, account, self.name, self.uid, p) for p in projections}

    def open(self) -> None:
        """Make the directory and the pod's DNS records; the sandbox is then ready."""
        self.directory.mkdir(parents=True, exist_ok=True)
        assert self.address is not None
        spec = self.pod.get("spec") or {}
        hosts_file = self.directory / "hosts"
        hosts_file.touch()
        self.hosts.add_pod(self.uid, hosts_file, self.address.ip, pod_hostname(self.pod),
                           self.namespace, spec.get("subdomain"))
        self.ready = True

    # -- entering it -------------------------------------------------------------------
    def scratch(self, container: str) -> Path:
        path = self.directory / "work" / container
        path.mkdir(parents=True, exist_ok=True)
        return path

    def container_command(self, container: str, argv: list[str], mounts: list[Mount],
                          working_dir: str) -> list[str]:
        """``argv`` as started in the sandbox, its mount targets held until tear-down."""
        if not isolated_mounts():
            if mounts:
                raise VolumeError("volume mounts need a private mount namespace (root); "
                                  "this data plane runs without one")
            return argv
        for mount in mounts:
            self.mountpoints.acquire(mount.target, is_file=Path(mount.source).is_file())
            self._acquired.append(mount.target)
        if working_dir:
            under_mount = any(working_dir == m.target or working_dir.startswith(m.target.rstrip("/") + "/")
                              for m in mounts)
            if not under_mount:
                self.mountpoints.acquire(working_dir, is_file=False)
                self._acquired.append(working_dir)
        script = self.directory / f"enter-{container}.sh"
        resolv = self.directory / "resolv.conf"
        if self.address is not None and self.address.netns and not resolv.exists():
            resolv.write_text(resolv_conf(self.namespace))
        script.write_text(wrapper_script(self.directory / "hosts", pod_hostname(self.pod), mounts,
                                         working_dir or str(self.scratch(container)),
                                         resolv if resolv.exists() else None))
        return entered_command(script, argv, self._netns_path())

    def container_cwd(self, container: str, working_dir: str) -> str | None:
        """The directory to start in; None where the entry script changes into it."""
        return None if isolated_mounts() else (working_dir or str(self.scratch(container)))

    def probe_command(self, spec: dict[str, Any], argv: list[str]) -> list[str]:
        """An exec probe's ``argv`` as run in the container's mounts, network and hostname."""
        mounts = container_mounts(spec, self.volume_paths)
        if not isolated_mounts():
            return argv
        script = self.directory / f"probe-{spec.get('name', '')}.sh"
        script.write_text(wrapper_script(self.directory / "hosts", pod_hostname(self.pod),
                                         mounts, spec.get("workingDir") or "/"))
        return entered_command(script, argv, self._netns_path())

    def _netns_path(self) -> str | None:
        return self.address.netns_path if self.address is not None else None

    # -- tear-down ---------------------------------------------------------------------
    async def teardown(self) -> None:
        """Remove the DNS records, the network (and any process left in it), the mount targets
        and the directory; the processes have been stopped before."""
        self.hosts.remove_pod(self.uid)
        if self.address is not None:
            if self.address.netns:
                kill_netns_processes(self.address.netns)
            await self.network.release(self.address)
        for target in self._acquired:
            self.mountpoints.release(target)
        self._acquired.clear()
        self.ready = False
        remove_tree(self.directory)
