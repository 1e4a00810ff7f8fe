"""One supervised child process: start with its log file, probe readiness, restart with backoff,
stop its whole process group."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable

from trainyard.supervisor.proctable import ProcessId, die_with_parent, signal_group

ReadinessProbe = Callable[[], Awaitable[bool]]
StartedHook = Callable[["ManagedChild"], None]


@dataclass(frozen=True)
class ChildSpec:
    name: str
    argv: list[str]
    log_file: Path
    env: dict[str, str] = field(default_factory=dict)
    # How long SIGTERM gets before SIGKILL: devcluster stops its pods first, so it gets longer.
    stop_timeout_s: float = 10.0


@dataclass
class Backoff:
    """Restart delays that double up to a ceiling, and start over once a child has stayed up."""

    initial_s: float = 0.5
    maximum_s: float = 30.0
    stable_after_s: float = 30.0
    _next_s: float = 0.0

    def delay_after(self, uptime_s: float) -> float:
        if uptime_s >= self.stable_after_s or self._next_s == 0.0:
            self._next_s = self.initial_s
        delay = self._next_s
        self._next_s = min(self._next_s * 2, self.maximum_s)
        return delay


class ChildStartupError(Exception):
    """A child exited, or did not become ready, while the stack was starting."""


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 16384))
            text = log.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join("    " + line for line in text.splitlines()[-lines:])


class ManagedChild:
    def __init__(self, spec: ChildSpec, on_started: StartedHook | None = None) -> None:
        self.spec = spec
        self.identity: ProcessId | None = None
        self.restarts = 0
        self._process: asyncio.subprocess.Process | None = None
        self._started_at = 0.0
        self._on_started = on_started
        self._backoff = Backoff()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def start(self) -> None:
        self.spec.log_file.parent.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        with self.spec.log_file.open("ab") as log:
            header = f"--- trainyard up: starting {self.name} at {stamp}: {' '.join(self.spec.argv)}\n"
            log.write(header.encode())
            log.flush()
            self._process = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.spec.env},
                # Own process group: Ctrl-C reaches only the supervisor, which stops children in
                # order, and a stop signal reaches everything a child started in its group.
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        self._started_at = time.monotonic()
        self.identity = ProcessId.of(self._process.pid)
        if self._on_started:
            self._on_started(self)

    async def wait_ready(self, probe: ReadinessProbe, timeout_s: float,
                         waiting: Callable[[str], None] | None = None, say_every_s: float = 10.0) -> None:
        """Poll `probe` until it says ready; fail with the log's tail if the child exits or times out.
        ``waiting`` hears every ``say_every_s`` what is still awaited (a slow start on a loaded
        machine is not silent)."""
        began = time.monotonic()
        deadline = began + timeout_s
        next_say = began + say_every_s
        while True:
            if self._process is None or self._process.returncode is not None:
                code = None if self._process is None else self._process.returncode
                raise ChildStartupError(
                    f"{self.name} exited with code {code} while starting; last lines of "
                    f"{self.spec.log_file}:\n{log_tail(self.spec.log_file)}"
                )
            try:
                if await probe():
                    return
            except Exception:  # noqa: BLE001 - a probe failing just means "not ready yet"
                pass
            now = time.monotonic()
            if now > deadline:
                raise ChildStartupError(
                    f"{self.name} did not become ready within {timeout_s:.0f}s; last lines of "
                    f"{self.spec.log_file}:\n{log_tail(self.spec.log_file)}"
                )
            if waiting is not None and now >= next_say:
                waiting(f"  {self.name:<11} waiting {now - began:.0f}s of {timeout_s:.0f}s for it to be ready "
                        f"(log: {self.spec.log_file})")
                next_say = now + say_every_s
            await asyncio.sleep(0.2)

    async def supervise(self, stopping: asyncio.Event, report: Callable[[str], None]) -> None:
        """Restart the child whenever it exits, with backoff, until `stopping` is set."""
        while not stopping.is_set():
            assert self._process is not None
            exit_wait = asyncio.ensure_future(self._process.wait())
            stop_wait = asyncio.ensure_future(stopping.wait())
            await asyncio.wait({exit_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            stop_wait.cancel()
            if stopping.is_set():
                exit_wait.cancel()
                return
            uptime = time.monotonic() - self._started_at
            delay = self._backoff.delay_after(uptime)
            report(f"{self.name} exited with code {self._process.returncode}; restarting in {delay:.1f}s "
                   f"(log: {self.spec.log_file})")
            try:
                await asyncio.wait_for(stopping.wait(), timeout=delay)
                return
            except asyncio.TimeoutError:
                pass
            self.restarts += 1
            try:
                await self.start()
            except OSError as err:
                # e.g. the binary vanished: the old (exited) process stays current, so the loop
                # comes straight back here after the next, longer delay.
                self._started_at = time.monotonic()
                report(f"{self.name} could not be restarted: {err}")

    async def stop(self) -> None:
        """SIGTERM the child's process group, SIGKILL it after the stop timeout, reap the child."""
        process, identity = self._process, self.identity
        if process is None or identity is None:
            return
        if process.returncode is None:
            signal_group(identity, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout=self.spec.stop_timeout_s)
            except asyncio.TimeoutError:
                signal_group(identity, signal.SIGKILL)
                await process.wait()
        # The leader is gone; anything left in its group (a child that ignored SIGTERM) goes too.
        try:
            os.killpg(identity.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
