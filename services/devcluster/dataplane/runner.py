"""The pod runner: one pod's life on this node, as the kubelet leads it.

It sets up the pod's sandbox (:mod:`.sandbox`), runs the init containers one after another,
then the containers side by side (:mod:`.containers`, one process per run, probed by
:mod:`.probes`), restarts them under the pod's ``restartPolicy`` with the crash-loop back-off
(:mod:`.restarts`), enforces ``activeDeadlineSeconds``, stops the pod on request (SIGTERM to
each container's process group, SIGKILL after the grace) and tears the sandbox down. Images are
not pulled: ``command`` + ``args`` run with this machine's programs; ``PATH`` starts with the
directory of the Python interpreter running the data plane, so ``python``, ``python3`` and
``torchrun`` are the virtualenv's.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .containers import ContainerProcesses
from .hosts import HostsTable
from .network import PodNetwork
from .podenv import ContainerConfigError, qos_class, referenced_sources
from .podstatus import ContainerRecord, PodView, now_rfc3339, render_status
from .probes import ContainerProbes
from .restarts import backoff_message, crash_backoff_seconds
from .sandbox import PodSandbox, SourceFetcher, TokenFetcher
from .volumes import MountpointRegistry, VolumeError

log = logging.getLogger(__name__)


@dataclass
class RunnerConfig:
    data_dir: Path
    node_name: str = "devcluster"
    time_scale: float = 0.1
    bin_dir: str = field(default_factory=lambda: os.path.dirname(sys.executable))
    api_host: str = ""
    api_port: str = ""
    has_gpus: bool = False

    def base_env(self) -> dict[str, str]:
        env = {
            "PATH": f"{self.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root" if os.geteuid() == 0 else os.environ.get("HOME", "/"),
            "LANG": "C.UTF-8",
        }
        if self.api_host:
            env["KUBERNETES_SERVICE_HOST"] = self.api_host
            env["KUBERNETES_SERVICE_PORT"] = self.api_port
        return env


class PodRunner:
    """Runs one pod to its end; the owner reads :meth:`status` whenever ``on_change`` fires."""

    def __init__(self, pod: dict[str, Any], *, config: RunnerConfig, network: PodNetwork,
                 hosts: HostsTable, mountpoints: MountpointRegistry,
                 fetch_sources: SourceFetcher, on_change: Callable[[], None],
                 gpu_ids: list[int] | None = None, fetch_token: TokenFetcher | None = None) -> None:
        self.config = config
        self.network = network
        self.on_change = on_change
        metadata = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        self.namespace = metadata.get("namespace", "default")
        self.name = metadata.get("name", "")
        self.uid = metadata.get("uid") or uuid.uuid4().hex
        self.restart_policy = spec.get("restartPolicy") or "Always"
        self.init_specs = list(spec.get("initContainers") or [])
        self.specs = list(spec.get("containers") or [])
        self.init = [ContainerRecord(name=c.get("name", ""), image=c.get("image", ""))
                     for c in self.init_specs]
        self.regular = [ContainerRecord(name=c.get("name", ""), image=c.get("image", ""),
                                        reason="PodInitializing" if self.init_specs else "ContainerCreating")
                        for c in self.specs]
        self.sandbox = PodSandbox(pod, uid=self.uid, data_dir=config.data_dir, node_name=config.node_name,
                                  base_env=config.base_env, network=network, hosts=hosts,
                                  mountpoints=mountpoints, fetch_sources=fetch_sources,
                                  fetch_token=fetch_token)
        self._stop = asyncio.Event()
        self.processes = ContainerProcesses(self.sandbox, data_dir=config.data_dir,
                                            has_gpus=config.has_gpus, gpu_ids=gpu_ids or [],
                                            on_change=self._changed)
        self.probes = ContainerProbes(self.sandbox, self._stop, self._changed)
        self.terminating = False
        self.start_time = now_rfc3339()
        self.reason = ""
        self.message = ""
        self._task: asyncio.Task[None] | None = None
        self._deadline_task: asyncio.Task[None] | None = None
        self.finished = asyncio.Event()

    # -- public face -----------------------------------------------------------------
    @property
    def pod(self) -> dict[str, Any]:
        """The latest pod object (the kubelet replaces it as updates arrive)."""
        return self.sandbox.pod

    @pod.setter
    def pod(self, pod: dict[str, Any]) -> None:
        self.sandbox.pod = pod

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")
        deadline = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is not None:
            self._deadline_task = asyncio.create_task(self._enforce_deadline(float(deadline)))

    async def _enforce_deadline(self, seconds: float) -> None:
        """Pod ``activeDeadlineSeconds``: stop everything and fail the pod (reason DeadlineExceeded)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.finished.wait(), timeout=seconds)
            return
        grace = float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        await self.terminate(grace, "DeadlineExceeded",
                             "Pod was active on the node longer than the specified deadline")

    def status(self, old_status: dict[str, Any] | None = None) -> dict[str, Any]:
        address = self.sandbox.address
        view = PodView(restart_policy=self.restart_policy, init=self.init, regular=self.regular,
                       sandbox_ready=self.sandbox.ready, terminating=self.terminating,
                       pod_ip=address.ip if address else "",
                       host_ip=self.network.host_ip, start_time=self.start_time,
                       qos_class=qos_class(self.pod), reason=self.reason, message=self.message)
        return render_status(view, old_status, now_rfc3339())

    def running_containers(self) -> list[str]:
        """Names of the containers (init ones included) whose process is running now."""
        return [record.name for record in self.init + self.regular if record.state == "running"]

    @property
    def pids(self) -> list[int]:
        return self.processes.pids

    async def terminate(self, grace_seconds: float, reason: str = "", message: str = "") -> None:
        """Stop the pod: SIGTERM each container's process group, SIGKILL after the grace."""
        if reason and not self.reason:
            self.reason, self.message = reason, message
        if not self.terminating:
            self.terminating = True
            self._stop.set()
            self.processes.signal_all(signal.SIGTERM if grace_seconds > 0 else signal.SIGKILL)
        # The grace period bounds the whole pod, not only the processes running when it began
        # (one whose spawn was in flight gets the signal as it starts, and SIGKILL with the rest).
        ended = asyncio.ensure_future(self.finished.wait())
        await asyncio.wait({ended}, timeout=max(grace_seconds, 0))
        if not ended.done():
            self.processes.signal_all(signal.SIGKILL)
        await ended

    # -- lifecycle ---------------------------------------------------------------------
    def _changed(self) -> None:
        try:
            self.on_change()
        except Exception:  # a status consumer's bug must not kill the pod
            log.exception("status callback failed")

    async def _run(self) -> None:
        try:
            await self._lifecycle()
        except Exception as err:  # surface as a pod failure rather than a silent stop
            log.exception("pod %s/%s: runner error", self.namespace, self.name)
            for record in self.init + self.regular:
                if record.state != "terminated":
                    record.state, record.reason, record.message = "terminated", "StartError", str(err)
                    record.exit_code = 128
                    record.finished_at = now_rfc3339()
            self.terminating = True
        finally:
            if self._deadline_task is not None:
                self._deadline_task.cancel()
            self.probes.cancel()
            await self.processes.kill_all()
            await self.sandbox.teardown()
            self.finished.set()
            self._changed()

    async def _lifecycle(self) -> None:
        self._changed()
        if not await self._prepare():
            return
        for spec, record in zip(self.init_specs, self.init):
            if not await self._run_init(spec, record):
                return
        for record in self.regular:
            if record.reason == "PodInitializing":
                record.reason = "ContainerCreating"
        await asyncio.gather(*(self._run_regular(spec, record)
                               for spec, record in zip(self.specs, self.regular)))

    async def _prepare(self) -> bool:
        """Set up the sandbox, retrying (and showing why) while a source or volume is missing."""
        sources = referenced_sources(self.pod)
        while not self._stop.is_set():
            try:
                await self.sandbox.resolve(sources, self.init_specs + self.specs)
                break
            except ContainerConfigError as err:
                self._set_waiting("CreateContainerConfigError", str(err))
            except VolumeError as err:
                self._set_waiting("CreateContainerError", str(err))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
        if self._stop.is_set():
            return False
        self.sandbox.open()
        self._changed()
        return True

    def _set_waiting(self, reason: str, message: str) -> None:
        for record in self.init + self.regular:
            if record.state == "waiting" and (record.reason, record.message) != (reason, message):
                record.reason, record.message = reason, message
                self._changed()

    async def _run_init(self, spec: dict[str, Any], record: ContainerRecord) -> bool:
        while True:
            code = await self._run_once(spec, record)
            if code == 0:
                return True
            if self._stop.is_set() or self.restart_policy == "Never":
                return False
            if not await self._backoff(record):
                return False

    async def _run_regular(self, spec: dict[str, Any], record: ContainerRecord) -> None:
        while True:
            code = await self._run_once(spec, record)
            done = self.restart_policy == "Never" or (code == 0 and self.restart_policy == "OnFailure")
            if self._stop.is_set() or done:
                record.will_restart = False
                self._changed()
                return
            if not await self._backoff(record):
                return

    async def _backoff(self, record: ContainerRecord) -> bool:
        """Wait out the crash-loop back-off before the next restart; False when stopping."""
        record.will_restart = True
        delay = crash_backoff_seconds(record.restart_count + 1, self.config.time_scale)
        if delay > 0:
            record.last_terminated = record.terminated_state()
            record.state, record.reason = "waiting", "CrashLoopBackOff"
            record.message = backoff_message(delay, record.name, self.name, self.namespace, self.uid)
            self._changed()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=delay)
        if self._stop.is_set():
            record.will_restart = False
            if record.state == "waiting" and record.last_terminated:
                # Show the last real run rather than a back-off that never ended.
                record.state = "terminated"
                record.reason = record.last_terminated.get("reason", "Error")
                record.message = record.last_terminated.get("message", "")
            return False
        return True

    async def _run_once(self, spec: dict[str, Any], record: ContainerRecord) -> int:
        """One run of a container, from start to exit; its exit code (128: it could not start)."""
        if self._stop.is_set():
            return 137
        if record.state == "terminated" or record.reason == "CrashLoopBackOff":
            # A restart: the run that just ended becomes lastState.
            if record.state == "terminated":
                record.last_terminated = record.terminated_state()
            record.restart_count += 1
        proc = await self.processes.start(spec, record)
        if proc is None:
            return 128
        self.probes.watch(spec, record, proc)
        self._changed()
        return await self.processes.wait(record, proc)
