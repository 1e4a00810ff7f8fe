"""The store process of ``trainyard devcluster up --api-workers N`` (N > 1).

It owns the data dir's ``Store`` (resourceVersions, change history, SQLite), bootstraps it
(default namespaces, RBAC) through an ``ApiServer`` that serves no HTTP, serves the workers
on ``<data-dir>/store.sock`` (``StoreServer``), reserves the HTTPS port, starts the N API
workers on it and waits until each serves; then the devcluster is ready. Stopping it stops
the workers (SIGTERM, then SIGKILL) before the store; a worker that dies stops the
devcluster (nothing serves half the port silently); a worker whose store process died
finds its stream ended and exits (no orphans).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable

from ..apiserver.endpoints.metrics import MULTIPROCESS_DIR_ENV
from ..storage.datadir import METRICS_DIR_NAME, PIDS_NAME, SOCKET_NAME
from ..apiserver.server import ApiServer
from ..tls import ensure_credentials
from ..storage.storeserver import StoreServer

log = logging.getLogger("trainyard.devcluster.supervisor")
WORKER_READY_TIMEOUT = 60.0
WORKER_STOP_TIMEOUT = 10.0


class WorkerFailed(Exception):
    """An API worker exited on its own (at start or while serving): the devcluster stops."""


@dataclass(frozen=True)
class WorkerSettings:
    host: str
    port: int
    workers: int
    watch_history: int
    authorization_mode: str
    audit_log_path: str | None
    log_level: str


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind (not listen) with SO_REUSEPORT: the port is this devcluster's while the workers
    start, and each worker can bind it too.

    SO_REUSEPORT alone would also let this devcluster join a port that another one's workers
    serve (any socket of the same user that sets it may): then two devclusters would answer on
    one port, each a share of the connections. So the port is first claimed the way the
    one-process server does, by a listening socket without SO_REUSEPORT, which anything else
    listening there refuses (EADDRINUSE: "--port ... is already in use")."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        probe.listen(1)
        port = probe.getsockname()[1]  # the port --port 0 was given
    finally:
        probe.close()
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Workers:
    """The API worker processes, started and stopped by pid."""

    def __init__(self, data_dir: Path, socket_path: Path, settings: WorkerSettings) -> None:
        self.data_dir = data_dir
        self.socket_path = socket_path
        self.settings = settings
        self.processes: list[asyncio.subprocess.Process] = []
        self.stopping = False

    async def start(self, port: int) -> None:
        s = self.settings
        # Each worker counts what it serves in files here, summed by whichever worker is scraped
        # (metrics.py); what an earlier run of this data dir counted is not this run's.
        metrics_dir = self.data_dir / METRICS_DIR_NAME
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(mode=0o700)
        env = {**os.environ, MULTIPROCESS_DIR_ENV: str(metrics_dir)}
        for index in range(s.workers):
            cmd = [sys.executable, "-m", "trainyard_services.devcluster.process.worker",
                   "--data-dir", str(self.data_dir), "--socket", str(self.socket_path), "--host", s.host,
                   "--port", str(port), "--watch-history", str(s.watch_history),
                   "--authorization-mode", s.authorization_mode, "--log-level", s.log_level,
                   "--audit-log-path", s.audit_log_path or "", "--index", str(index), "--count", str(s.workers)]
            self.processes.append(await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, env=env))

    async def first_exit(self) -> asyncio.subprocess.Process:
        """The first worker to exit (a crash unless we are stopping them)."""
        waits = {asyncio.ensure_future(p.wait()): p for p in self.processes}
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return waits[next(iter(done))]
        finally:
            for task in waits:
                task.cancel()

    async def stop(self) -> None:
        self.stopping = True
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.terminate()
        for process in self.processes:
            try:
                await asyncio.wait_for(process.wait(), WORKER_STOP_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("API worker %d did not stop in %.0f s: killed", process.pid, WORKER_STOP_TIMEOUT)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]


@contextlib.asynccontextmanager
async def store_process(data_dir: Path, settings: WorkerSettings, history_size: int
                        ) -> AsyncIterator[tuple[int, Workers]]:
    """The store and its workers, serving on the yielded port until the context ends."""
    credentials = ensure_credentials(data_dir)
    owner = ApiServer(data_dir, credentials, history_size=history_size,
                      authorization_mode=settings.authorization_mode)
    await owner.start()  # the store's writer, the default namespaces, RBAC's bootstrap objects
    server = StoreServer(owner.store, data_dir / SOCKET_NAME)
    workers = Workers(data_dir, server.socket_path, settings)
    reservation: socket.socket | None = None
    try:
        await server.start()
        reservation = reserve_port(settings.host, settings.port)
        port = reservation.getsockname()[1]
        await workers.start(port)
        await _wait_ready(server, workers)
        reservation.close()
        reservation = None
        log.info("%d API workers serving on port %d: pids %s", settings.workers, port, workers.pids)
        yield port, workers
    finally:
        if reservation is not None:
            reservation.close()
        await workers.stop()
        await server.close()
        await owner.stop()


async def _wait_ready(server: StoreServer, workers: Workers) -> None:
    ready: set[int] = set()
    exited = asyncio.ensure_future(workers.first_exit())
    try:
        while len(ready) < len(workers.processes):
            pid = asyncio.ensure_future(server.ready.get())
            done, _ = await asyncio.wait({pid, exited}, timeout=WORKER_READY_TIMEOUT,
                                         return_when=asyncio.FIRST_COMPLETED)
            if exited in done:
                pid.cancel()
                process = exited.result()
                raise WorkerFailed(f"API worker {process.pid} exited with {process.returncode} before it was ready")
            if not done:
                pid.cancel()
                raise WorkerFailed(f"API workers not ready in {WORKER_READY_TIMEOUT:.0f} s")
            ready.add(pid.result())
    finally:
        exited.cancel()


async def run_workers(data_dir: Path, settings: WorkerSettings, on_ready: Callable[[str, int], None],
                      server_stop: asyncio.Event, stop: asyncio.Event) -> None:
    """``devcluster up`` with workers: ready once all serve; ``stop`` is set when a worker dies
    (the data plane winds down, then ``server_stop`` ends this, with ``WorkerFailed``)."""
    async with store_process(data_dir, settings, settings.watch_history) as (port, workers):
        # the pids first: whoever sees the ready line may look for the workers at once
        (data_dir / PIDS_NAME).write_text("".join(f"{pid}\n" for pid in workers.pids))
        on_ready(f"https://{settings.host}:{port}", port)
        crashed = asyncio.ensure_future(workers.first_exit())
        stopped = asyncio.ensure_future(server_stop.wait())
        try:
            done, _ = await asyncio.wait({crashed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if crashed in done:
                process = crashed.result()
                log.error("API worker %d exited with %s: stopping the devcluster", process.pid, process.returncode)
                stop.set()
                await server_stop.wait()
                raise WorkerFailed(f"API worker {process.pid} exited with {process.returncode}")
        finally:
            crashed.cancel()
            stopped.cancel()
            (data_dir / PIDS_NAME).unlink(missing_ok=True)


def default_api_workers(cores: int | None = None) -> int:
    """One process where the cores would be shared with the load: up to 4 cores one process is
    fastest (measured on 2: docs/performance.md); beyond, half the cores, at most 8."""
    cores = cores or os.cpu_count() or 1
    return 1 if cores <= 4 else min(8, cores // 2)
