"""Readiness and liveness probes of a pod's containers (exec, tcpSocket, httpGet), as the
kubelet runs them: readiness flips the container's ``ready`` after ``successThreshold`` /
``failureThreshold`` results; liveness kills the container after ``failureThreshold``
failures and leaves the restart to the pod's restart policy.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any, Callable

from .podenv import container_env
from .podstatus import ContainerRecord
from .sandbox import PodSandbox

log = logging.getLogger(__name__)


class ContainerProbes:
    """The probes of one pod's running containers; they stop with the pod (``stop``)."""

    def __init__(self, sandbox: PodSandbox, stop: asyncio.Event, on_change: Callable[[], None]) -> None:
        self.sandbox = sandbox
        self.stop = stop
        self.on_change = on_change
        self._tasks: list[asyncio.Task[None]] = []

    def watch(self, spec: dict[str, Any], record: ContainerRecord, proc: asyncio.subprocess.Process) -> None:
        """Probe a run that just started; without a readiness probe it is ready at once."""
        probe = spec.get("readinessProbe")
        record.ready = probe is None
        if probe is not None:
            self._tasks.append(asyncio.create_task(self._readiness(spec, record, probe, proc)))
        if spec.get("livenessProbe"):
            self._tasks.append(asyncio.create_task(self._liveness(spec, spec["livenessProbe"], proc)))

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def _readiness(self, spec: dict[str, Any], record: ContainerRecord,
                         probe: dict[str, Any], proc: asyncio.subprocess.Process) -> None:
        period = float(probe.get("periodSeconds") or 10)
        timeout = float(probe.get("timeoutSeconds") or 1)
        success_needed = int(probe.get("successThreshold") or 1)
        failure_needed = int(probe.get("failureThreshold") or 3)
        successes = failures = 0
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        while proc.returncode is None and not self.stop.is_set():
            ok = await self._probe_once(spec, probe, timeout)
            if proc.returncode is not None:
                return
            successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
            if ok and not record.ready and successes >= success_needed:
                record.ready = True
                self.on_change()
            elif not ok and record.ready and failures >= failure_needed:
                record.ready = False
                self.on_change()
            await asyncio.sleep(period)

    async def _liveness(self, spec: dict[str, Any], probe: dict[str, Any],
                        proc: asyncio.subprocess.Process) -> None:
        """Kill the container after ``failureThreshold`` failed probes; its restart policy decides."""
        period = float(probe.get("periodSeconds") or 10)
        timeout = float(probe.get("timeoutSeconds") or 1)
        failure_needed = int(probe.get("failureThreshold") or 3)
        failures = 0
        await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
        while proc.returncode is None and not self.stop.is_set():
            ok = await self._probe_once(spec, probe, timeout)
            failures = 0 if ok else failures + 1
            if failures >= failure_needed and proc.returncode is None:
                log.info("pod %s/%s: container %s failed liveness probe, will be restarted",
                         self.sandbox.namespace, self.sandbox.name, spec.get("name"))
                grace = float(probe.get("terminationGracePeriodSeconds") or
                              (self.sandbox.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
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
        sandbox = self.sandbox
        ip = sandbox.address.ip if sandbox.address else "127.0.0.1"
        try:
            if "exec" in probe:
                assert sandbox.context is not None
                argv = [str(a) for a in (probe["exec"] or {}).get("command") or []]
                if not argv:
                    return False
                env = container_env(sandbox.pod, spec, sandbox.context)
                command = sandbox.probe_command(spec, argv)
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


def _port(spec: dict[str, Any], port: Any) -> int:
    """A probe's port: a number, or the name of one of the container's declared ports."""
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for declared in spec.get("ports") or []:
        if declared.get("name") == port:
            return int(declared.get("containerPort"))
    raise ValueError(f"unknown named port {port!r}")
