"""The node agent: one Node object, the scheduler loop, and the pod runners ("kubelet")."""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from trainyard.errortext import describe
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.events import build_event
from trainyard.kube.resources import CONFIGMAP, COSCHEDULING_PODGROUP, SECRET, VOLCANO_PODGROUP

from .hosts import HostsTable, external_addresses
from .informers import NODE, POD, Informer, key_of
from .network import PodNetwork
from .podenv import ContainerConfigError, TokenProjection
from .podstatus import now_rfc3339
from .runner import PodRunner, RunnerConfig
from .scheduling import GPU, GangKey, node_allocatable, pod_key, pod_requests, schedule
from .volumes import MountpointRegistry

log = logging.getLogger(__name__)
DEFAULT_GRACE_S = 30


def detect_gpus() -> int:
    """How many GPUs ``nvidia-smi`` lists (0 without the tool or GPUs)."""
    tool = shutil.which("nvidia-smi")
    if not tool:
        return 0
    try:
        out = subprocess.run([tool, "--list-gpus"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def machine_capacity(gpus: int) -> dict[str, str]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    capacity = {"cpu": str(os.cpu_count() or 1), "memory": f"{pages // 1024}Ki", "pods": "110",
                "ephemeral-storage": "100Gi"}
    if gpus:
        capacity[GPU] = str(gpus)
    return capacity


def node_object(name: str, capacity: dict[str, str], host_ip: str) -> dict[str, Any]:
    now = now_rfc3339()
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "kubernetes.io/os": "linux",
                                              "kubernetes.io/arch": platform.machine()}},
        "spec": {},
        "status": {
            "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": host_ip},
                          {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "trainyard devcluster pod runner is ready",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"kubeletVersion": "v1.36.0-trainyard", "operatingSystem": "linux",
                         "architecture": platform.machine(), "containerRuntimeVersion": "local://processes",
                         "osImage": platform.platform(), "kernelVersion": platform.release(),
                         "machineID": "", "systemUUID": "", "bootID": "", "kubeProxyVersion": ""},
        },
    }


async def register_node(client: KubeClient, node: dict[str, Any]) -> None:
    try:
        created = await client.request("POST", NODE.path(), body=node)
    except KubeError as err:
        if err.status != 409:
            raise
        created = await client.request("GET", NODE.path(None, node["metadata"]["name"]))
    body = copy.deepcopy(created)
    body["status"] = node["status"]
    await client.request("PUT", NODE.path(None, node["metadata"]["name"], "status"), body=body)


class Scheduler:
    """Binds pending pods to the node when they fit; gangs all together or not at all."""

    def __init__(self, client: KubeClient, node_name: str, allocatable: dict[str, str],
                 pods: Informer, podgroups: list[tuple[str, Informer]],
                 nodes: Informer | None = None) -> None:
        self.client = client
        self.node_name = node_name
        self.allocatable = node_allocatable(allocatable)
        self.nodes = nodes
        self.pods = pods
        self.podgroups = podgroups
        self.wake = asyncio.Event()
        self._reported: dict[str, tuple[str, str]] = {}
        pods.listeners.append(lambda _e, _o: self.wake.set())
        if nodes is not None:
            nodes.listeners.append(lambda _e, _o: self.wake.set())
        for _, informer in podgroups:
            informer.listeners.append(lambda _e, _o: self.wake.set())

    def _node_allocatable(self) -> dict[str, int]:
        """The Node object's ``status.allocatable`` (what kube-scheduler reads), else the default."""
        node = self.nodes.get("", self.node_name) if self.nodes is not None else None
        allocatable = ((node or {}).get("status") or {}).get("allocatable")
        return node_allocatable(allocatable) if allocatable else self.allocatable

    def _node_labels(self) -> dict[str, str] | None:
        """The Node object's labels (``kubectl label node`` changes them), None before it is seen."""
        node = self.nodes.get("", self.node_name) if self.nodes is not None else None
        return dict((node or {}).get("metadata", {}).get("labels") or {}) if node is not None else None

    def _gangs(self) -> dict[GangKey, int]:
        gangs: dict[GangKey, int] = {}
        for kind, informer in self.podgroups:
            for group in informer.items():
                namespace, name = key_of(group)
                gangs[GangKey(kind, namespace, name)] = int((group.get("spec") or {}).get("minMember") or 1)
        return gangs

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.wake.clear()
            try:
                await self.schedule_once()
            except KubeError as err:
                log.warning("scheduling pass failed: %s", describe(err))
                await asyncio.sleep(0.2)
            except Exception:  # a bug in one pass must not stop scheduling for good
                log.exception("scheduling pass failed")
                await asyncio.sleep(0.5)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=2.0)
            await asyncio.sleep(0.01)  # coalesce bursts of pod events

    async def schedule_once(self) -> None:
        pods = self.pods.items()
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        pending = [p for p in pods if not (p.get("spec") or {}).get("nodeName")
                   and not (p.get("metadata") or {}).get("deletionTimestamp")
                   and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
        if not pending:
            return
        decision = schedule(self._node_allocatable(), bound, pending, self._gangs(), self._node_labels())
        by_key = {pod_key(p): p for p in pending}
        for key in decision.bind:
            pod = by_key[key]
            namespace, name = key_of(pod)
            binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": namespace},
                       "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name}}
            try:
                await self.client.request("POST", POD.path(namespace, name, "binding"), body=binding)
                log.info("bound pod %s/%s", namespace, name)
            except KubeError as err:
                if not (err.not_found or err.conflict):
                    raise
            self._reported.pop(key, None)
        for key, (reason, message) in decision.unschedulable.items():
            if self._reported.get(key) == (reason, message):
                continue
            pod = by_key[key]
            namespace, name = key_of(pod)
            status = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": reason, "message": message,
                "lastProbeTime": None, "lastTransitionTime": now_rfc3339()}]}
            try:
                await self.client.request("PATCH", POD.path(namespace, name, "status"),
                                          body={"status": status},
                                          content_type="application/merge-patch+json")
                self._reported[key] = (reason, message)
            except KubeError as err:
                if not err.not_found:
                    raise


class Kubelet:
    """Runs every pod bound to this node and reports its status."""

    def __init__(self, client: KubeClient, config: RunnerConfig, network: PodNetwork,
                 pods: Informer, services: Informer, gpus: int,
                 endpoint_slices: Informer | None = None) -> None:
        self.client = client
        self.endpoint_slices = endpoint_slices
        self.config = config
        self.network = network
        self.pods = pods
        self.services = services
        self.hosts = HostsTable()
        self.mountpoints = MountpointRegistry()
        self.runners: dict[str, PodRunner] = {}   # by pod uid
        self.writers: dict[str, asyncio.Task[None]] = {}
        self.dirty: dict[str, asyncio.Event] = {}
        self.free_gpus = list(range(gpus))
        self.gpu_of: dict[str, list[int]] = {}
        self.hosts.set_services({})
        pods.listeners.append(self._on_pod)
        services.listeners.append(lambda _e, _o: self._refresh_services())
        if endpoint_slices is not None:
            endpoint_slices.listeners.append(lambda _e, _o: self._refresh_services())
        self._stopping = False
        self._finishing: set[str] = set()  # uids of deleted pods whose final DELETE is under way
        # uids of pods whose containers ran here and ended (until the pod is deleted): a pod
        # runs once. The watch can deliver an older version of a pod (still Pending or Running)
        # after its final status was written and its runner let go; that must not run it again.
        self._terminated: set[str] = set()

    def _refresh_services(self) -> None:
        self.hosts.set_services({key_of(s): bool((s.get("spec") or {}).get("publishNotReadyAddresses"))
                                 for s in self.services.items()
                                 if (s.get("spec") or {}).get("clusterIP") == "None"})
        if self.endpoint_slices is not None:
            self.hosts.set_external(external_addresses(self.services.items(), self.endpoint_slices.items()))

    def _on_pod(self, event: str, pod: dict[str, Any]) -> None:
        if self._stopping:
            return
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        if (pod.get("spec") or {}).get("nodeName") != self.config.node_name:
            return
        runner = self.runners.get(uid)
        if event == "DELETED":
            self._terminated.discard(uid)
        if event == "DELETED" or meta.get("deletionTimestamp"):
            if runner is not None and not runner.terminating:
                asyncio.get_running_loop().create_task(self._kill(runner, pod))
            elif runner is None and event != "DELETED" and uid not in self._finishing:
                # Being deleted with no processes here (they did not survive a data plane
                # restart): nothing to wait for.
                self._finishing.add(uid)
                asyncio.get_running_loop().create_task(self._finish_deletion(pod))
            return
        if runner is not None:
            runner.pod = pod if runner.pod.get("metadata", {}).get("uid") == uid else runner.pod
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed") or uid in self._terminated:
            return
        self._start(pod)

    async def _kill(self, runner: PodRunner, pod: dict[str, Any]) -> None:
        """A deleted pod, as the kubelet stops it: a ``Killing`` event per running container,
        SIGTERM, SIGKILL after the deletion's grace period (the pod's
        ``terminationGracePeriodSeconds`` unless the DELETE gave another)."""
        grace = deletion_grace_seconds(pod)
        for name in runner.running_containers():
            await self._record_pod_event(pod, name, "Normal", "Killing", f"Stopping container {name}")
        await runner.terminate(grace)

    async def _record_pod_event(self, pod: dict[str, Any], container: str, event_type: str,
                                reason: str, message: str) -> None:
        """A core/v1 Event on the pod from this node's kubelet (best effort, as the kubelet)."""
        event = build_event({**pod, "apiVersion": "v1", "kind": "Pod"}, event_type, reason, message, "kubelet")
        inits = {c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []}
        field = "initContainers" if container in inits else "containers"
        event["involvedObject"]["fieldPath"] = f"spec.{field}{{{container}}}"
        event["source"]["host"] = self.config.node_name
        event["reportingInstance"] = self.config.node_name
        try:
            await self.client.request("POST", f"/api/v1/namespaces/{event['metadata']['namespace']}/events",
                                      body=event)
        except KubeError as err:
            log.warning("pod %s/%s: event %s not recorded: %s", pod["metadata"].get("namespace"),
                        pod["metadata"].get("name"), reason, err)

    async def _finish_deletion(self, pod: dict[str, Any]) -> None:
        """The kubelet's last word on a deleted pod whose containers have stopped: DELETE it with
        a grace period of 0 (the same pod: uid precondition), ending the graceful deletion."""
        meta = pod["metadata"]
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": meta.get("uid")}}
        try:
            await self.client.request("DELETE", POD.path(meta.get("namespace"), meta.get("name")), body=body)
        except KubeError as err:
            if not (err.not_found or err.conflict):
                log.warning("pod %s/%s: final delete failed: %s", meta.get("namespace"), meta.get("name"), describe(err))
        finally:
            self._finishing.discard(meta.get("uid", ""))

    def _start(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        try:
            wanted = pod_requests(pod).get(GPU, 0)
        except Exception:
            wanted = 0
        gpu_ids = self.free_gpus[:wanted]
        self.free_gpus = self.free_gpus[wanted:]
        self.gpu_of[uid] = gpu_ids
        dirty = asyncio.Event()
        self.dirty[uid] = dirty
        runner = PodRunner(pod, config=self.config, network=self.network, hosts=self.hosts,
                           mountpoints=self.mountpoints, fetch_sources=self._fetch_sources,
                           on_change=dirty.set, gpu_ids=gpu_ids, fetch_token=self._fetch_token)
        self.runners[uid] = runner
        log.info("starting pod %s/%s", runner.namespace, runner.name)
        runner.start()
        self.writers[uid] = asyncio.get_running_loop().create_task(self._write_status(runner, dirty))

    async def _fetch_sources(self, namespace: str, configmaps: set[str], secrets: set[str]):
        found_cm: dict[str, dict[str, Any]] = {}
        found_secret: dict[str, dict[str, Any]] = {}
        for name in configmaps:
            obj = await self.client.get(CONFIGMAP, namespace, name)
            if obj is not None:
                found_cm[name] = obj
        for name in secrets:
            obj = await self.client.get(SECRET, namespace, name)
            if obj is not None:
                found_secret[name] = obj
        return found_cm, found_secret

    async def _fetch_token(self, namespace: str, account: str, pod_name: str, pod_uid: str,
                           projection: TokenProjection) -> str:
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": projection.expiration_seconds,
                     "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid}}}
        if projection.audience:
            body["spec"]["audiences"] = [projection.audience]
        try:
            answer = await self.client.request(
                "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body=body)
        except KubeError as err:
            # As the kubelet: the pod waits in ContainerCreating and the request is retried.
            raise ContainerConfigError(f"failed to fetch token: {err.message}") from err
        return str(answer["status"]["token"])

    async def _write_status(self, runner: PodRunner, dirty: asyncio.Event) -> None:
        last: dict[str, Any] | None = None
        uid = runner.uid
        gone = False  # the pod object is deleted: keep the runner tracked until it has stopped
        while True:
            await dirty.wait()
            dirty.clear()
            finished = runner.finished.is_set()
            current = self.pods.get(runner.namespace, runner.name)
            if current is not None and current["metadata"].get("uid") != uid:
                current = None
            old = (current or {}).get("status") or last
            try:
                status = runner.status(old)
            except Exception:  # keep reporting later changes even if one rendering failed
                log.exception("pod %s/%s: status could not be rendered", runner.namespace, runner.name)
                status = last
            if status:
                self.hosts.set_ready(uid, any(c.get("type") == "Ready" and c.get("status") == "True"
                                              for c in status.get("conditions") or []))
            if status != last and not gone:
                try:
                    await self.client.request(
                        "PATCH", POD.path(runner.namespace, runner.name, "status"),
                        body={"status": status},
                        content_type="application/merge-patch+json")
                    last = status
                except KubeError as err:
                    if not err.not_found:
                        log.warning("pod %s/%s: status write failed: %s", runner.namespace, runner.name, describe(err))
                        await asyncio.sleep(0.2)
                        dirty.set()
                        continue
                    gone = True
            if finished:
                break
        current = self.pods.get(runner.namespace, runner.name)
        if current is not None and current["metadata"].get("uid") == uid:
            self._terminated.add(uid)  # forgotten at its DELETED event
            if current["metadata"].get("deletionTimestamp") and uid not in self._finishing:
                self._finishing.add(uid)
                await self._finish_deletion(current)
        self.free_gpus.extend(self.gpu_of.pop(uid, []))
        self.runners.pop(uid, None)
        self.dirty.pop(uid, None)
        self.writers.pop(uid, None)

    async def stop(self) -> None:
        """Stop every pod (SIGTERM, then SIGKILL after a short grace)."""
        self._stopping = True
        runners = list(self.runners.values())
        await asyncio.gather(*(r.terminate(min(5.0, deletion_grace_seconds(r.pod))) for r in runners),
                             return_exceptions=True)
        writers = list(self.writers.values())
        if writers:
            await asyncio.wait(writers, timeout=1)
        for task in writers:
            task.cancel()

    def adopt_existing(self) -> None:
        """Pods bound here before a restart have lost their processes: start them afresh."""
        for pod in self.pods.items():
            self._on_pod("ADDED", pod)


def deletion_grace_seconds(pod: dict[str, Any]) -> float:
    """How long a stopping pod's containers get between SIGTERM and SIGKILL: the deletion's
    ``deletionGracePeriodSeconds`` when the pod is being deleted, else its
    ``terminationGracePeriodSeconds`` (default 30 s)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds") is not None:
        return float(meta["deletionGracePeriodSeconds"])
    return float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))


def podgroup_informers(client: KubeClient) -> list[tuple[str, Informer]]:
    return [("coscheduling", Informer(client, COSCHEDULING_PODGROUP)),
            ("volcano", Informer(client, VOLCANO_PODGROUP))]


def runner_config(data_dir: Path, node_name: str, time_scale: float, api_url: str, gpus: int) -> RunnerConfig:
    host, port = "", ""
    if api_url.startswith("https://") or api_url.startswith("http://"):
        rest = api_url.split("://", 1)[1].split("/", 1)[0]
        host, _, port = rest.rpartition(":")
    return RunnerConfig(data_dir=data_dir, node_name=node_name, time_scale=time_scale,
                        api_host=host, api_port=port, has_gpus=gpus > 0)
