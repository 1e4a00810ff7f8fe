"""Pod volumes as host directories, and the mount plan that makes them appear at mountPath."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .podenv import ContainerConfigError, PodContext, configmap_items, field_value, secret_items


class VolumeError(Exception):
    """A volume type or mount the local runner cannot provide (CreateContainerError)."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


def _write_items(directory: Path, items: dict[str, bytes], selection: list[dict[str, Any]] | None,
                 mode: int, what: str, optional: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    chosen: list[tuple[str, bytes, int]] = []
    if selection:
        for item in selection:
            key = item.get("key", "")
            if key not in items:
                if optional:
                    continue
                raise ContainerConfigError(f"couldn't find key {key} in {what}")
            chosen.append((item.get("path") or key, items[key], int(item.get("mode") or mode)))
    else:
        chosen = [(key, value, mode) for key, value in items.items()]
    for path, value, file_mode in chosen:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(value)
        os.chmod(target, file_mode)


def materialize_volumes(pod: dict[str, Any], ctx: PodContext, volumes_dir: Path,
                        claims_dir: Path) -> dict[str, Path]:
    """Create every pod volume as a directory (or host path); name -> host path."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    made: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume.get("name", "")
        directory = volumes_dir / name
        if "emptyDir" in volume:
            directory.mkdir(parents=True, exist_ok=True)
        elif "configMap" in volume:
            source = volume["configMap"] or {}
            found = ctx.configmaps.get(source.get("name", ""))
            if found is None and not source.get("optional"):
                raise ContainerConfigError(f'configmap "{source.get("name", "")}" not found')
            _write_items(directory, configmap_items(found or {}), source.get("items"),
                         int(source.get("defaultMode") or 0o644),
                         f"ConfigMap {namespace}/{source.get('name', '')}", bool(source.get("optional")))
        elif "secret" in volume:
            source = volume["secret"] or {}
            found = ctx.secrets.get(source.get("secretName", ""))
            if found is None and not source.get("optional"):
                raise ContainerConfigError(f'secret "{source.get("secretName", "")}" not found')
            _write_items(directory, secret_items(found or {}), source.get("items"),
                         int(source.get("defaultMode") or 0o644),
                         f"Secret {namespace}/{source.get('secretName', '')}", bool(source.get("optional")))
        elif "downwardAPI" in volume:
            items = {item.get("path", ""): field_value(pod, (item.get("fieldRef") or {}).get("fieldPath", ""), ctx).encode()
                     for item in (volume["downwardAPI"] or {}).get("items") or [] if item.get("fieldRef")}
            _write_items(directory, items, None, 0o644, "downwardAPI", True)
        elif "projected" in volume:
            directory.mkdir(parents=True, exist_ok=True)
            for projection in (volume["projected"] or {}).get("sources") or []:
                if "configMap" in projection:
                    source = projection["configMap"] or {}
                    found = ctx.configmaps.get(source.get("name", ""))
                    if found is None and not source.get("optional"):
                        raise ContainerConfigError(f'configmap "{source.get("name", "")}" not found')
                    _write_items(directory, configmap_items(found or {}), source.get("items"), 0o644,
                                 f"ConfigMap {namespace}/{source.get('name', '')}", bool(source.get("optional")))
                elif "secret" in projection:
                    source = projection["secret"] or {}
                    found = ctx.secrets.get(source.get("name", ""))
                    if found is None and not source.get("optional"):
                        raise ContainerConfigError(f'secret "{source.get("name", "")}" not found')
                    _write_items(directory, secret_items(found or {}), source.get("items"), 0o644,
                                 f"Secret {namespace}/{source.get('name', '')}", bool(source.get("optional")))
                elif "downwardAPI" in projection:
                    items = {item.get("path", ""): field_value(pod, (item.get("fieldRef") or {}).get("fieldPath", ""), ctx).encode()
                             for item in projection["downwardAPI"].get("items") or [] if item.get("fieldRef")}
                    _write_items(directory, items, None, 0o644, "downwardAPI", True)
                elif "serviceAccountToken" in projection:
                    path = (projection["serviceAccountToken"] or {}).get("path", "")
                    token = ctx.tokens.get(f"{name}/{path}")
                    if token is None:
                        raise ContainerConfigError(f"no ServiceAccount token for volume {name!r} path {path!r}")
                    # 0600: a credential, readable by the pod's processes only.
                    _write_items(directory, {path: token.encode()}, None, 0o600, "serviceAccountToken", False)
        elif "hostPath" in volume:
            directory = Path((volume["hostPath"] or {}).get("path", "/"))
            if (volume["hostPath"] or {}).get("type") in ("DirectoryOrCreate",):
                directory.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in volume:
            claim = (volume["persistentVolumeClaim"] or {}).get("claimName", "")
            directory = claims_dir / namespace / claim
            directory.mkdir(parents=True, exist_ok=True)
        else:
            kinds = sorted(set(volume) - {"name"})
            raise VolumeError(f"volume {name!r}: type {kinds[0] if kinds else '?'} is not supported "
                              "by the devcluster pod runner")
        made[name] = directory
    return made


def container_mounts(container: dict[str, Any], volume_paths: dict[str, Path]) -> list[Mount]:
    mounts = []
    for mount in container.get("volumeMounts") or []:
        name = mount.get("name", "")
        if name not in volume_paths:
            raise VolumeError(f"volumeMount {name!r} of container {container.get('name')!r} "
                              "names no pod volume")
        source = volume_paths[name]
        if mount.get("subPath"):
            source = source / mount["subPath"]
            if not source.exists():
                source.mkdir(parents=True, exist_ok=True)
        mounts.append(Mount(source=str(source), target=mount.get("mountPath", ""),
                            read_only=bool(mount.get("readOnly"))))
    return mounts


# Where the kubelets of one machine keep their shared count of mount targets (see below).
MOUNTPOINTS_DIR = Path(tempfile.gettempdir()) / f"trainyard-mountpoints-{os.getuid()}"


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (field 22 of /proc/<pid>/stat), which tells a live
    holder from a later process that got its pid; None when no such process runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


class MountpointRegistry:
    """Mount targets the runner had to create on the host filesystem, reference counted across
    every kubelet of the machine.

    A bind mount needs an existing target; a target created for a pod is removed when the last
    pod using it stops, so nothing is left behind in the host's tree. The host's tree is shared
    by every devcluster on the machine (a manager and its workers, two test processes), so the
    count is too: one record per target in ``state_dir``, changed under a file lock, naming each
    holder (process, start time, registry) with its count. A kubelet that counted alone removed
    /var/run/secrets/kubeflow/trainer when its own last pod stopped while another kubelet's pod
    was about to bind it ("mount point does not exist": the pod failed). Holders whose process
    is gone (a killed devcluster) are dropped the next time the target is counted.
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir or MOUNTPOINTS_DIR
        pid = os.getpid()
        self._me = f"{pid}:{_process_start(pid)}:{uuid.uuid4().hex[:12]}"

    def _record(self, target: str) -> Path:
        return self.state_dir / (hashlib.sha256(target.encode()).hexdigest()[:32] + ".json")

    def _locked(self):
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = open(self.state_dir / "lock", "a+")
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        return lock

    def _read(self, target: str) -> dict[str, Any]:
        try:
            record = json.loads(self._record(target).read_text())
        except (OSError, ValueError):
            return {"target": target, "created": [], "holders": {}}
        holders = {holder: count for holder, count in (record.get("holders") or {}).items()
                   if _live(holder)}
        return {"target": target, "created": list(record.get("created") or []), "holders": holders}

    def _write(self, target: str, record: dict[str, Any]) -> None:
        path = self._record(target)
        if not record["holders"]:
            path.unlink(missing_ok=True)
            return
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(record))
        temporary.replace(path)

    def acquire(self, target: str, is_file: bool) -> None:
        with self._locked():
            record = self._read(target)
            if not record["holders"]:
                # Nobody holds it: what a dead holder created and left is ours to remove later.
                record["created"] = [str(part) for part in _create_target(Path(target), is_file)] \
                    if not Path(target).exists() else [part for part in record["created"] if Path(part).exists()]
            record["holders"][self._me] = record["holders"].get(self._me, 0) + 1
            self._write(target, record)

    def release(self, target: str) -> None:
        with self._locked():
            record = self._read(target)
            count = record["holders"].pop(self._me, 0) - 1
            if count > 0:
                record["holders"][self._me] = count
            if not record["holders"]:
                for part in reversed(record["created"]):
                    path = Path(part)
                    try:
                        if path.is_dir():
                            path.rmdir()
                        else:
                            path.unlink()
                    except OSError:
                        pass
            self._write(target, record)


def _live(holder: str) -> bool:
    pid, _, rest = holder.partition(":")
    start = rest.split(":", 1)[0]
    return pid.isdigit() and _process_start(int(pid)) == start


def _create_target(path: Path, is_file: bool) -> list[Path]:
    """Creates ``path`` and its missing parents; the paths created, outermost first."""
    chain = []
    missing = path
    while not missing.exists():
        chain.append(missing)
        missing = missing.parent
    created: list[Path] = []
    for part in reversed(chain[1:]):
        part.mkdir()
        created.append(part)
    if is_file:
        path.touch()
    else:
        path.mkdir()
    created.append(path)
    return created


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
