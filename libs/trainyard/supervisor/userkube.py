"""`trainyard up --merge-kubeconfig`: the stack's cluster as one context of the user's kubeconfig.

As kind and k3d do: the file is the first entry of ``$KUBECONFIG`` if set, else
``~/.kube/config``; a cluster, a user and a context all named ``trainyard-<data dir name>-<hash>``
(unique per data dir, the same on every `up` of it) are added or replaced, and become the current
context. `down` (or the end of `up`) removes exactly those three entries again, and the current
context if it is still ours. What was merged where is recorded in the data dir, so a `down` from
another shell, or after the supervisor was killed, still cleans up. Writes are atomic (temp file
and rename, mode 0600) under a lock file beside the kubeconfig.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

RECORD_NAME = "merged-kubeconfig.json"


@dataclass(frozen=True)
class MergedContext:
    path: Path
    name: str


def user_kubeconfig_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    for entry in (env.get("KUBECONFIG") or "").split(os.pathsep):
        if entry.strip():
            return Path(entry).expanduser()
    return Path(env.get("HOME") or Path.home()) / ".kube" / "config"


def context_name(data_dir: Path) -> str:
    """``trainyard-<data dir name>-<6 hex of its absolute path>``: readable and unique."""
    resolved = data_dir.expanduser().resolve()
    label = re.sub(r"[^a-z0-9-]+", "-", resolved.name.lower()).strip("-")[:30] or "stack"
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:6]
    return f"trainyard-{label}-{digest}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path) + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with contextlib.suppress(OSError):
        os.unlink(str(path) + ".lock")


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"apiVersion": "v1", "kind": "Config", "preferences": {}, "clusters": [], "users": [], "contexts": []}
    document = yaml.safe_load(path.read_text()) or {}
    if not isinstance(document, dict):
        raise ValueError(f"{path}: not a kubeconfig (expected a mapping)")
    return document


def _write(path: Path, document: dict[str, Any]) -> None:
    fd, temp = tempfile.mkstemp(prefix=".trainyard-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            yaml.safe_dump(document, handle, sort_keys=False)
        os.chmod(temp, 0o600)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _without(items: list[Any] | None, name: str) -> list[Any]:
    return [item for item in items or [] if not (isinstance(item, dict) and item.get("name") == name)]


def merge_into_user_kubeconfig(stack_kubeconfig: Path, data_dir: Path,
                               env: Mapping[str, str] | None = None) -> MergedContext:
    """Adds (or replaces) the stack's cluster as the current context of the user's kubeconfig."""
    from trainyard.kube.kubeconfig import resolve

    source = resolve(stack_kubeconfig)
    context = source.context()
    cluster = next(c["cluster"] for c in source.config["clusters"] if c.get("name") == context.get("cluster"))
    user = next((u["user"] for u in source.config["users"] if u.get("name") == context.get("user")), {})
    target = user_kubeconfig_path(env)
    name = context_name(data_dir)
    with _locked(target):
        document = _read(target)
        document["clusters"] = _without(document.get("clusters"), name) + [{"name": name, "cluster": cluster}]
        document["users"] = _without(document.get("users"), name) + [{"name": name, "user": user}]
        document["contexts"] = _without(document.get("contexts"), name) + [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": context.get("namespace") or "default"}}]
        document["current-context"] = name
        _write(target, document)
    (data_dir / RECORD_NAME).write_text(json.dumps({"path": str(target.resolve()), "context": name}))
    return MergedContext(target, name)


def remove_from_user_kubeconfig(data_dir: Path) -> MergedContext | None:
    """Undoes :func:`merge_into_user_kubeconfig` for this data dir; None when nothing was merged."""
    record_file = data_dir / RECORD_NAME
    try:
        record = json.loads(record_file.read_text())
    except (OSError, ValueError):
        return None
    target, name = Path(record["path"]), record["context"]
    if target.is_file():
        with _locked(target):
            document = _read(target)
            for section in ("clusters", "users", "contexts"):
                document[section] = _without(document.get(section), name)
            if document.get("current-context") == name:
                document.pop("current-context")
            _write(target, document)
    record_file.unlink(missing_ok=True)
    return MergedContext(target, name)
