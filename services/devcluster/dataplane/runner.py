"""The pod runner: one pod's init containers, then its containers, as local processes.

Images are not pulled. ``command`` + ``args`` run with this machine's programs; ``PATH``
starts with the directory of the Python interpreter running the data plane, so ``python``,
``python3`` and ``torchrun`` are the virtualenv's. In isolated mode each container process
is started inside the pod's network namespace and in a private mount + UTS namespace where
volumes are bind-mounted at their ``mountPath``, a per-pod hosts file covers ``/etc/hosts``
and the hostname is the pod's. Every container runs in its own process group; stopping a
pod signals the groups, then kills whatever is left in the pod's network namespace.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from .hosts import HostsTable
from .network import PodAddress, PodNetwork, kill_netns_processes
from .podenv import (ContainerConfigError, PodContext, TokenProjection, container_argv, container_env,
                     pod_hostname, qos_class, referenced_sources, token_projections)
from .podstatus import ContainerRecord, PodView, now_rfc3339, render_status
from .volumes import (Mount, MountpointRegistry, VolumeError, container_mounts,
                      materialize_volumes, remove_tree)

log = logging.getLogger(__name__)

SourceFetcher = Callable[[str, set[str], set[str]],
                         Awaitable[tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]]]
# (namespace, service account, pod name, pod uid, projection) -> token; raises
# ContainerConfigError when the API server refuses.
TokenFetcher = Callable[[str, str, str, str, TokenProjection], Awaitable[str]]
POD_MARKER_ENV = "TRAINYARD_POD_UID"
CRASH_BACKOFF_BASE_S = 10.0
CRASH_BACKOFF_MAX_S = 300.0


def crash_backoff_seconds(restart_number: int, scale: float) -> float:
    """Delay before restart N (1-based): the first is immediate, then 10 s doubling, max 300 s."""
    if restart_number <= 1:
        return 0.0
    return min(CRASH_BACKOFF_BASE_S * 2 ** (restart_number - 2), CRASH_BACKOFF_MAX_S) * scale


def log_paths(data_dir: Path, namespace: str, pod: str, container: str) -> tuple[Path, Path]:
    """Current and previous instance log files of one container (read by pods/log)."""
    directory = data_dir / "pods" / namespace / pod
    return directory / f"{container}.log", directory / f"{container}.previous.log"


def attempt_log_path(data_dir: Path, namespace: str, pod: str, container: str, attempt: int) -> Path:
    """The log of one run of a container, 0 for the first (container names have no dots)."""
    return data_dir / "pods" / namespace / pod / f"{container}.{attempt}.log"


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


def resolv_conf(namespace: str) -> str:
    """The pod resolver: the cluster search list, and a local nameserver that fails fast.

    Names are answered from the per-pod hosts file; the nameserver entry only makes lookups
    that miss it (e.g. IPv6 queries) fail at once instead of timing out.
    """
    return (f"search {namespace}.svc.cluster.local svc.cluster.local cluster.local\n"
            "nameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n")


def wrapper_script(hosts_file: Path | None, hostname: str, mounts: list[Mount],
                   working_dir: str, resolv_file: Path | None = None) -> str:
    """Shell run inside the new mount/UTS namespace before exec'ing the container command."""
    q = shlex.quote
    lines = ["set -e"]
    if hosts_file is not None:
        lines.append(f"mount --bind {q(str(hosts_file))} /etc/hosts")
    if resolv_file is not None and os.path.exists("/etc/resolv.conf"):
        lines.append(f"mount --bind {q(str(resolv_file))} /etc/resolv.conf")
    lines.append(f"hostname {q(hostname[:63])}")
    for mount in mounts:
        lines.append(f"mount --bind {q(mount.source)} {q(mount.target)}")
        if mount.read_only:
            lines.append(f"mount -o remount,bind,ro {q(mount.target)}")
    lines.append(f"cd {q(working_dir)}")
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


class PodRunner:
    """Runs one pod to its end; the owner reads :meth:`status` whenever ``on_change`` fires."""

    def __init__(self, pod: dict[str, Any], *, config: RunnerConfig, network: PodNetwork,
                 hosts: HostsTable, mountpoints: MountpointRegistry,
                 fetch_sources: SourceFetcher, on_change: Callable[[], None],
                 gpu_ids: list[int] | None = None, fetch_token: TokenFetcher | None = None) -> None:
        self.pod = pod
        self.fetch_token = fetch_token
        self.config = config
        self.network = network
        self.hosts = hosts
        self.mountpoints = mountpoints
        self.fetch_sources = fetch_sources
        self.on_change = on_change
        self.gpu_ids = gpu_ids or []
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
        self.sandbox = config.data_dir / "sandboxes" / self.uid
        self.address: PodAddress | None = None
        self.sandbox_ready = False
        self.terminating = False
        self.start_time = now_rfc3339()
        self.reason = ""
        self.message = ""
        self._stop = asyncio.Event()
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        self._acquired: list[str] = []
        self._context: PodContext | None = None
        self._volume_paths: dict[str, Path] = {}
        self._task: asyncio.Task[None] | None = None
        self._probe_tasks: list[asyncio.Task[None]] = []
        self.finished = asyncio.Event()

    # -- public face -----------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")
        deadline = (self.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is not None:
            self._probe_tasks.append(asyncio.create_task(self._enforce_deadline(float(deadline))))

    async def _enforce_deadline(self, seconds: float) -> None:
        """Pod ``activeDeadlineSeconds``: stop everything and fail the pod (reason DeadlineExceeded)."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.finished.wait(), timeout=seconds)
            return
        grace = float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        await self.terminate(grace, "DeadlineExceeded",
                             "Pod was active on the node longer than the specified deadline")

    def status(self, old_status: dict[str, Any] | None = None) -> dict[str, Any]:
        view = PodView(restart_policy=self.restart_policy, init=self.init, regular=self.regular,
                       sandbox_ready=self.sandbox_ready, terminating=self.terminating,
                       pod_ip=self.address.ip if self.address else "",
                       host_ip=self.network.host_ip, start_time=self.start_time,
                       qos_class=qos_class(self.pod), reason=self.reason, message=self.message)
        return render_status(view, old_status, now_rfc3339())

    def running_containers(self) -> list[str]:
        """Names of the containers (init ones included) whose process is running now."""
        return [record.name for record in self.init + self.regular if record.state == "running"]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs.values() if proc.returncode is None]

    async def terminate(self, grace_seconds: float, reason: str = "", message: str = "") -> None:
        """Stop the pod: SIGTERM each container's process group, SIGKILL after the grace."""
        if reason and not self.reason:
            self.reason, self.message = reason, message
        if not self.terminating:
            self.terminating = True
            self._stop.set()
            self._signal_all(signal.SIGTERM if grace_seconds > 0 else signal.SIGKILL)
        running = [proc for proc in self._procs.values() if proc.returncode is None]
        if running:
            _, pending = await asyncio.wait([asyncio.ensure_future(p.wait()) for p in running],
                                            timeout=max(grace_seconds, 0))
            if pending:
                self._signal_all(signal.SIGKILL)
        await self.finished.wait()

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
            for task in self._probe_tasks:
                task.cancel()
            await self._cleanup()
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
        """Fetch sources and build volumes, retrying while a source is missing."""
        configmap_names, secret_names = referenced_sources(self.pod)
        while not self._stop.is_set():
            try:
                configmaps, secrets = await self.fetch_sources(self.namespace, configmap_names,
                                                               secret_names)
                tokens = await self._tokens()
                if self.address is None:
                    self.address = await self.network.attach()
                self._context = PodContext(
                    pod_ip=self.address.ip, host_ip=self.network.host_ip,
                    node_name=self.config.node_name, configmaps=configmaps, secrets=secrets,
                    base_env=self.config.base_env(), tokens=tokens)
                self._volume_paths = materialize_volumes(
                    self.pod, self._context, self.sandbox / "volumes",
                    self.config.data_dir / "claims")
                for spec in self.init_specs + self.specs:
                    container_env(self.pod, spec, self._context)  # validates every source now
                break
            except ContainerConfigError as err:
                self._set_waiting("CreateContainerConfigError", str(err))
            except VolumeError as err:
                self._set_waiting("CreateContainerError", str(err))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=1.0)
        if self._stop.is_set():
            return False
        self.sandbox.mkdir(parents=True, exist_ok=True)
        assert self.address is not None
        spec = self.pod.get("spec") or {}
        hosts_file = self.sandbox / "hosts"
        hosts_file.touch()
        self.hosts.add_pod(self.uid, hosts_file, self.address.ip, pod_hostname(self.pod),
                           self.namespace, spec.get("subdomain"))
        self.sandbox_ready = True
        self._changed()
        return True

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
            record.message = (f"back-off {_duration(delay)} restarting failed container="
                              f"{record.name} pod={self.name}_{self.namespace}({self.uid})")
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

    def _start_error(self, record: ContainerRecord, message: str) -> int:
        record.state, record.reason, record.message = "terminated", "StartError", message
        record.exit_code, record.signal = 128, None
        record.started_at = record.finished_at = now_rfc3339()
        record.ready = False
        self._changed()
        return 128

    async def _run_once(self, spec: dict[str, Any], record: ContainerRecord) -> int:
        if self._stop.is_set():
            return 137
        if record.state == "terminated" or record.reason == "CrashLoopBackOff":
            # A restart: the run that just ended becomes lastState.
            if record.state == "terminated":
                record.last_terminated = record.terminated_state()
            record.restart_count += 1
        assert self._context is not None
        env = container_env(self.pod, spec, self._context)
        env[POD_MARKER_ENV] = self.uid
        if self.config.has_gpus or self.gpu_ids:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in self.gpu_ids))
        argv = container_argv(spec, env)
        if not spec.get("command"):
            return self._start_error(record, (
                f"container {record.name!r} has no command: the devcluster runs host programs "
                "and has no image entrypoint to fall back on"))
        try:
            mounts = container_mounts(spec, self._volume_paths)
        except VolumeError as err:
            return self._start_error(record, str(err))
        executable = _find_executable(argv[0], env.get("PATH", ""), mounts)
        if executable is None:
            return self._start_error(
                record, f'exec: "{argv[0]}": executable file not found in $PATH')
        current, previous = log_paths(self.config.data_dir, self.namespace, self.name, record.name)
        current.parent.mkdir(parents=True, exist_ok=True)
        if record.restart_count > 0 and current.exists():
            # `kubectl logs --previous` shows the run before this one, as on a kubelet; every
            # earlier run also stays beside it as <container>.<attempt>.log (a hard link, no
            # copy), so the run that set off a series of restarts can still be read.
            os.replace(current, previous)
            with contextlib.suppress(FileExistsError):
                os.link(previous, attempt_log_path(self.config.data_dir, self.namespace, self.name,
                                                   record.name, record.restart_count - 1))
        working_dir = spec.get("workingDir") or ""
        try:
            command = self._wrap(spec, record, argv, mounts, working_dir)
        except VolumeError as err:
            return self._start_error(record, str(err))
        cwd = None if self._isolated_mounts() else (working_dir or str(self._scratch(record)))
        with open(current, "ab", buffering=0) as log_file:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                    stderr=log_file, env=env, cwd=cwd, start_new_session=True)
            except OSError as err:
                return self._start_error(record, str(err))
        self._procs[record.name] = proc
        record.state, record.reason, record.message = "running", "", ""
        record.started_at, record.finished_at = now_rfc3339(), None
        record.exit_code = record.signal = None
        record.container_id = f"local://{uuid.uuid4().hex}"
        record.ever_started = True
        record.will_restart = False
        probe = spec.get("readinessProbe")
        record.ready = probe is None
        if probe is not None:
            self._probe_tasks.append(asyncio.create_task(self._readiness(spec, record, probe, proc)))
        if spec.get("livenessProbe"):
            self._probe_tasks.append(asyncio.create_task(self._liveness(spec, spec["livenessProbe"], proc)))
        self._changed()
        returncode = await proc.wait()
        self._procs.pop(record.name, None)
        code = returncode if returncode >= 0 else 128 - returncode
        record.state, record.exit_code = "terminated", code
        record.signal = -returncode if returncode < 0 else None
        record.reason = "Completed" if code == 0 else "Error"
        record.message = ""
        record.finished_at = now_rfc3339()
        record.ready = False
        self._changed()
        return code

    # -- process wrapping --------------------------------------------------------------
    def _isolated_mounts(self) -> bool:
        return os.geteuid() == 0 and shutil.which("unshare") is not None

    def _scratch(self, record: ContainerRecord) -> Path:
        path = self.sandbox / "work" / record.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _wrap(self, spec: dict[str, Any], record: ContainerRecord, argv: list[str],
              mounts: list[Mount], working_dir: str) -> list[str]:
        if not self._isolated_mounts():
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
        script = self.sandbox / f"enter-{record.name}.sh"
        resolv = self.sandbox / "resolv.conf"
        if self.address is not None and self.address.netns and not resolv.exists():
            resolv.write_text(resolv_conf(self.namespace))
        script.write_text(wrapper_script(self.sandbox / "hosts", pod_hostname(self.pod), mounts,
                                         working_dir or str(self._scratch(record)),
                                         resolv if resolv.exists() else None))
        command = ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                   "/bin/sh", str(script), *argv]
        if self.address is not None and self.address.netns_path:
            command = ["nsenter", f"--net={self.address.netns_path}", "--", *command]
        return command

    def _signal_all(self, signum: int) -> None:
        for proc in list(self._procs.values()):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)

    # -- readiness ---------------------------------------------------------------------
    async def _readiness(self, spec: dict[str, Any], record: ContainerRecord,
                         probe: dict[str, Any], proc: asyncio.subprocess.Process) -> None:
        period = float(probe.get("periodSeconds") or 10)
        timeout = float(probe.get("timeoutSeconds") or 1)
        success_needed = int(probe.get("successThreshold") or 1)
        failure_needed = int(probe.get("failureThreshold") or 3)
        successes = failures = 0
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        while proc.returncode is None and not self._stop.is_set():
            ok = await self._probe_once(spec, probe, timeout)
            if proc.returncode is not None:
                return
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if ok and not record.ready and successes >= success_needed:
                record.ready = True
                self._changed()
            elif not ok and record.ready and failures >= failure_needed:
                record.ready = False
                self._changed()
            await asyncio.sleep(period)

    async def _liveness(self, spec: dict[str, Any], probe: dict[str, Any],
                        proc: asyncio.subprocess.Process) -> None:
        """Kill the container after ``failureThreshold`` failed probes; its restart policy decides."""
        period = float(probe.get("periodSeconds") or 10)
        timeout = float(probe.get("timeoutSeconds") or 1)
        failure_needed = int(probe.get("failureThreshold") or 3)
        failures = 0
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        while proc.returncode is None and not self._stop.is_set():
            ok = await self._probe_once(spec, probe, timeout)
            failures = 0 if ok else failures + 1
            if failures >= failure_needed and proc.returncode is None:
                log.info("pod %s/%s: container %s failed liveness probe, will be restarted",
                         self.namespace, self.name, spec.get("name"))
                grace = float(probe.get("terminationGracePeriodSeconds") or
                              (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), timeout=grace)
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                return
            await asyncio.sleep(period)

    async def _probe_once(self, spec: dict[str, Any], probe: dict[str, Any], timeout: float) -> bool:
        ip = self.address.ip if self.address else "127.0.0.1"
        try:
            if "exec" in probe:
                assert self._context is not None
                argv = [str(a) for a in (probe["exec"] or {}).get("command") or []]
                if not argv:
                    return False
                env = container_env(self.pod, spec, self._context)
                mounts = container_mounts(spec, self._volume_paths)
                command = argv
                if self._isolated_mounts():
                    script = self.sandbox / f"probe-{spec.get('name', '')}.sh"
                    script.write_text(wrapper_script(self.sandbox / "hosts", pod_hostname(self.pod),
                                                     mounts, spec.get("workingDir") or "/"))
                    command = ["unshare", "--mount", "--uts", "--propagation", "private", "--",
                               "/bin/sh", str(script), *argv]
                    if self.address is not None and self.address.netns_path:
                        command = ["nsenter", f"--net={self.address.netns_path}", "--", *command]
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL, env=env, start_new_session=True)
                try:
                    return await asyncio.wait_for(proc.wait(), timeout=timeout) == 0
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    return False
            if "tcpSocket" in probe:
                port = _port(spec, (probe["tcpSocket"] or {}).get("port"))
                _, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
                writer.close()
                return True
            if "httpGet" in probe:
                get = probe["httpGet"] or {}
                port = _port(spec, get.get("port"))
                reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout)
                writer.write(f"GET {get.get('path') or '/'} HTTP/1.0\r\nHost: {ip}\r\n\r\n".encode())
                line = await asyncio.wait_for(reader.readline(), timeout)
                writer.close()
                parts = line.split()
                return len(parts) >= 2 and 200 <= int(parts[1]) < 400
        except (OSError, asyncio.TimeoutError, ValueError):
            return False
        return False

    # -- cleanup -----------------------------------------------------------------------
    async def _cleanup(self) -> None:
        self._signal_all(signal.SIGKILL)
        for proc in list(self._procs.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=5)
        sweep_marked_processes(self.uid)
        self.hosts.remove_pod(self.uid)
        if self.address is not None:
            if self.address.netns:
                kill_netns_processes(self.address.netns)
            await self.network.release(self.address)
        for target in self._acquired:
            self.mountpoints.release(target)
        self._acquired.clear()
        self.sandbox_ready = False
        remove_tree(self.sandbox)


def _duration(seconds: float) -> str:
    if seconds >= 60:
        minutes, rest = divmod(int(seconds), 60)
        return f"{minutes}m{rest}s"
    return f"{seconds:g}s"


def _port(spec: dict[str, Any], port: Any) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for declared in spec.get("ports") or []:
        if declared.get("name") == port:
            return int(declared.get("containerPort"))
    raise ValueError(f"unknown named port {port!r}")


def _find_executable(program: str, path: str, mounts: list[Mount]) -> str | None:
    if "/" not in program:
        return shutil.which(program, path=path)
    for mount in mounts:
        target = mount.target.rstrip("/") + "/"
        if program.startswith(target):
            candidate = os.path.join(mount.source, program[len(target):])
            return candidate if os.path.exists(candidate) else None
    return program if os.path.exists(program) else None


def sweep_marked_processes(pod_uid: str) -> int:
    """SIGKILL any process that still carries this pod's marker (e.g. one that left its group)."""
    needle = f"{POD_MARKER_ENV}={pod_uid}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
                    killed += 1
        except OSError:
            continue
    return killed
