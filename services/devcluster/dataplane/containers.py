"""The processes of one pod's containers: each run of a container is one process (in its own
process group) started in the pod's sandbox with its log file as stdout and stderr; its exit
becomes the container's terminated state. Every process carries the pod's marker in its
environment, so one that left its group is still found and killed when the pod stops.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any, Callable

from .containerlogs import run_log
from .podenv import container_argv, container_env
from .podstatus import ContainerRecord, now_rfc3339
from .sandbox import PodSandbox
from .volumes import Mount, VolumeError, container_mounts

POD_MARKER_ENV = "TRAINYARD_POD_UID"


class ContainerProcesses:
    """Starts, waits for and signals the container processes of one pod."""

    def __init__(self, sandbox: PodSandbox, *, data_dir: Path, has_gpus: bool, gpu_ids: list[int],
                 on_change: Callable[[], None]) -> None:
        self.sandbox = sandbox
        self.data_dir = data_dir
        self.has_gpus = has_gpus
        self.gpu_ids = gpu_ids
        self.on_change = on_change
        self._procs: dict[str, asyncio.subprocess.Process] = {}
        # The last signal_all's signal: a process whose spawn was in flight then gets it too.
        self._stopping_with: int | None = None

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.running()]

    def running(self) -> list[asyncio.subprocess.Process]:
        return [proc for proc in self._procs.values() if proc.returncode is None]

    async def start(self, spec: dict[str, Any], record: ContainerRecord) -> asyncio.subprocess.Process | None:
        """Start one run of the container and mark it running; None when it could not start
        (the record then holds the StartError, exit code 128)."""
        sandbox = self.sandbox
        assert sandbox.context is not None
        env = container_env(sandbox.pod, spec, sandbox.context)
        env[POD_MARKER_ENV] = sandbox.uid
        if self.has_gpus or self.gpu_ids:
            env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in self.gpu_ids))
        argv = container_argv(spec, env)
        if not spec.get("command"):
            return self._start_error(record, (
                f"container {record.name!r} has no command: the devcluster runs host programs "
                "and has no image entrypoint to fall back on"))
        try:
            mounts = container_mounts(spec, sandbox.volume_paths)
        except VolumeError as err:
            return self._start_error(record, str(err))
        executable = find_executable(argv[0], env.get("PATH", ""), mounts)
        if executable is None:
            return self._start_error(
                record, f'exec: "{argv[0]}": executable file not found in $PATH')
        log_path = run_log(self.data_dir, sandbox.namespace, sandbox.name, record.name, record.restart_count)
        working_dir = spec.get("workingDir") or ""
        try:
            command = sandbox.container_command(record.name, argv, mounts, working_dir)
        except VolumeError as err:
            return self._start_error(record, str(err))
        cwd = sandbox.container_cwd(record.name, working_dir)
        with open(log_path, "ab", buffering=0) as log_file:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                    stderr=log_file, env=env, cwd=cwd, start_new_session=True)
            except OSError as err:
                return self._start_error(record, str(err))
        self._procs[record.name] = proc
        if self._stopping_with is not None:
            # The pod was told to stop while this process was being spawned: signal_all missed it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, self._stopping_with)
        record.state, record.reason, record.message = "running", "", ""
        record.started_at, record.finished_at = now_rfc3339(), None
        record.exit_code = record.signal = None
        record.container_id = f"local://{uuid.uuid4().hex}"
        record.ever_started = True
        record.will_restart = False
        return proc

    async def wait(self, record: ContainerRecord, proc: asyncio.subprocess.Process) -> int:
        """Wait for the run to end and record how: its exit code (128 + N for signal N)."""
        returncode = await proc.wait()
        self._procs.pop(record.name, None)
        code = returncode if returncode >= 0 else 128 - returncode
        record.state, record.exit_code = "terminated", code
        record.signal = -returncode if returncode < 0 else None
        record.reason = "Completed" if code == 0 else "Error"
        record.message = ""
        record.finished_at = now_rfc3339()
        record.ready = False
        self.on_change()
        return code

    def _start_error(self, record: ContainerRecord, message: str) -> None:
        record.state, record.reason, record.message = "terminated", "StartError", message
        record.exit_code, record.signal = 128, None
        record.started_at = record.finished_at = now_rfc3339()
        record.ready = False
        self.on_change()
        return None

    def signal_all(self, signum: int) -> None:
        """Signal the process group of every container still running, and of any whose spawn
        is in flight once it exists."""
        self._stopping_with = signum
        for proc in list(self._procs.values()):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)

    async def kill_all(self) -> None:
        """SIGKILL every container and whatever process still carries the pod's marker."""
        self.signal_all(signal.SIGKILL)
        for proc in list(self._procs.values()):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), timeout=5)
        sweep_marked_processes(self.sandbox.uid)


def find_executable(program: str, path: str, mounts: list[Mount]) -> str | None:
    """The file ``program`` names: looked up on ``path``, or inside the volume it lies under."""
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
