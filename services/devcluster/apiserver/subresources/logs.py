"""``pods/{name}/log``: serve container logs the data plane writes.

Layout (shared with the data plane): ``<data-dir>/pods/<namespace>/<pod>/<container>.log`` holds
the current run's stdout+stderr; ``<container>.previous.log`` the run before a restart (what
``previous=true`` serves); ``<container>.<N>.log`` run N (0 is the first) of a restarted
container, kept on disk for reading after several restarts.
``follow`` streams new bytes until the container terminates (or the pod is gone).
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from aiohttp import web

from .. import errors
from ..registry.kinds import ResourceType
from ..registry.store import Api
from ..query import parse_bool

POLL_SECONDS = 0.2
CHUNK = 64 * 1024


def log_path(pods_dir: Path, namespace: str, pod: str, container: str, previous: bool = False) -> Path:
    return pods_dir / namespace / pod / (f"{container}.previous.log" if previous else f"{container}.log")


def _container_names(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    return [c.get("name", "") for c in (spec.get("containers") or [])]


def _all_container_names(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    return [c.get("name", "") for key in ("initContainers", "containers", "ephemeralContainers")
            for c in (spec.get(key) or [])]


def _terminated(pod: dict[str, Any] | None, container: str) -> bool:
    if pod is None:
        return True
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    for key in ("containerStatuses", "initContainerStatuses"):
        for cs in status.get(key) or []:
            if cs.get("name") == container and "terminated" in (cs.get("state") or {}):
                return True
    return False


def _tail(data: bytes, lines: int) -> bytes:
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


class PodLogs:
    def __init__(self, pods_dir: Path) -> None:
        self.pods_dir = pods_dir

    async def serve(self, request: web.Request, api: Api, rt: ResourceType, namespace: str, name: str,
                    query: dict[str, str]) -> web.StreamResponse:
        pod = api.get(rt, namespace, name)
        containers = _container_names(pod)
        container = query.get("container", "")
        if not container:
            if len(containers) != 1:
                raise errors.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(containers)}]")
            container = containers[0]
        elif container not in _all_container_names(pod):
            raise errors.bad_request(f"container {container} is not valid for pod {name}")
        follow = parse_bool(query.get("follow"), "follow")
        previous = parse_bool(query.get("previous"), "previous")
        tail_lines = self._int(query, "tailLines")
        limit_bytes = self._int(query, "limitBytes")
        path = log_path(self.pods_dir, namespace, name, container, previous)
        if not path.exists():
            if previous:
                raise errors.bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
            if (pod.get("status") or {}).get("phase", "Pending") == "Pending" and not _terminated(pod, container):
                raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        response = web.StreamResponse(status=200)
        response.headers["Content-Type"] = "text/plain"
        response.enable_chunked_encoding()
        await response.prepare(request)
        sent = 0
        try:
            offset = 0
            if path.exists():
                data = await asyncio.to_thread(path.read_bytes)
                if tail_lines is not None:
                    data = _tail(data, tail_lines)
                offset = path.stat().st_size
                if limit_bytes is not None:
                    data = data[:limit_bytes]
                if data:
                    await response.write(data)
                    sent += len(data)
            while follow and not previous and (limit_bytes is None or sent < limit_bytes):
                current = self._current_pod(api, rt, namespace, name)
                done = _terminated(current, container)
                chunk = await asyncio.to_thread(self._read_from, path, offset)
                if chunk:
                    offset += len(chunk)
                    if limit_bytes is not None:
                        chunk = chunk[: limit_bytes - sent]
                    await response.write(chunk)
                    sent += len(chunk)
                    continue
                if done:
                    break
                transport = request.transport
                if transport is None or transport.is_closing():
                    break
                await asyncio.sleep(POLL_SECONDS)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        return response

    @staticmethod
    def _int(query: dict[str, str], key: str) -> int | None:
        if key not in query or query[key] == "":
            return None
        try:
            return int(query[key])
        except ValueError as err:
            raise errors.bad_request(f"invalid {key} {query[key]!r}: must be an integer") from err

    @staticmethod
    def _current_pod(api: Api, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        stored = api.store.get(rt.storage_key, namespace, name)
        return stored.load() if stored is not None else None

    @staticmethod
    def _read_from(path: Path, offset: int) -> bytes:
        try:
            with path.open("rb") as handle:
                handle.seek(offset)
                return handle.read(CHUNK)
        except FileNotFoundError:
            return b""
