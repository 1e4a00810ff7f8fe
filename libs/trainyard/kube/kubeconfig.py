"""Which cluster to talk to, decided the way kubectl decides it. One resolver for every service
and CLI command.

Order (the first that applies wins):

1. ``--kubeconfig PATH`` (or ``TRAINYARD_KUBECONFIG``, its environment form): that one file,
   which must exist.
2. ``KUBECONFIG``: a list of files separated by ``os.pathsep`` (``:``), merged as kubectl merges
   them: missing files and empty entries are skipped; for each cluster, user and context name the
   first file that defines it wins; ``current-context`` comes from the first file that sets it.
3. ``~/.kube/config`` when it exists.
4. In-cluster: the pod's ServiceAccount (``KUBERNETES_SERVICE_HOST`` and the mounted token).

``--context NAME`` then picks a context of the merged configuration instead of its
``current-context`` (an error if it has no such context). Relative file references in a
kubeconfig (``certificate-authority``, ``client-certificate``, ``client-key``, ``tokenFile``)
are relative to the file that holds them, as in kubectl.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

KUBECONFIG_ENV = "KUBECONFIG"
TRAINYARD_KUBECONFIG_ENV = "TRAINYARD_KUBECONFIG"
SERVICE_HOST_ENV = "KUBERNETES_SERVICE_HOST"
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")

_NAMED_LISTS = ("clusters", "users", "contexts")
_FILE_FIELDS = {
    "clusters": ("cluster", ("certificate-authority",)),
    "users": ("user", ("client-certificate", "client-key", "tokenFile")),
}


class KubeconfigError(ValueError):
    """No usable cluster configuration: the message says what was looked at."""


@dataclass(frozen=True)
class KubeconfigSource:
    """Where the configuration comes from: ``kind`` is ``flag``, ``env`` (TRAINYARD_KUBECONFIG),
    ``KUBECONFIG``, ``home`` or ``in-cluster``; ``paths`` the files read, in merge order."""

    kind: str
    paths: tuple[Path, ...] = ()
    context: str | None = None

    def describe(self) -> str:
        if self.kind == "in-cluster":
            return "in-cluster service account"
        if self.kind == "memory":
            return "kubeconfig in memory" + (f", context {self.context}" if self.context else "")
        where = ", ".join(str(p) for p in self.paths)
        return f"{where} ({self.kind})" + (f", context {self.context}" if self.context else "")


@dataclass
class ResolvedKubeconfig:
    source: KubeconfigSource
    config: dict[str, Any] = field(default_factory=dict)  # merged kubeconfig; empty in-cluster

    @property
    def in_cluster(self) -> bool:
        return self.source.kind == "in-cluster"

    @property
    def context_name(self) -> str | None:
        return None if self.in_cluster else self.config.get("current-context")

    def context(self) -> dict[str, Any]:
        return _named(self.config, "contexts", self.context_name or "") or {}

    def server(self) -> str | None:
        if self.in_cluster:
            host, port = os.environ.get(SERVICE_HOST_ENV, ""), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            return f"https://{host}:{port}" if host else None
        return self.cluster().get("server")

    def cluster(self) -> dict[str, Any]:
        """The current context's cluster entry (server, certificate authority...)."""
        return _named(self.config, "clusters", str(self.context().get("cluster", ""))) or {}

    def user(self) -> dict[str, Any]:
        """The current context's user entry (token, certificates, exec...)."""
        return _named(self.config, "users", str(self.context().get("user", ""))) or {}

    def namespace(self) -> str:
        return self.context().get("namespace") or "default"


def _split(value: str) -> list[str]:
    return [part for part in value.split(os.pathsep) if part.strip()]


def find_source(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None, *,
                env: Mapping[str, str] | None = None, home: Path | None = None) -> KubeconfigSource:
    """Which configuration the order above picks (reads no file contents)."""
    env = os.environ if env is None else env
    home = Path(env.get("HOME") or Path.home()) if home is None else home
    if kubeconfig:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig: file not found: {path}")
        return KubeconfigSource("flag", (path,), context)
    if env.get(TRAINYARD_KUBECONFIG_ENV):
        path = Path(env[TRAINYARD_KUBECONFIG_ENV]).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"${TRAINYARD_KUBECONFIG_ENV}: file not found: {path}")
        return KubeconfigSource("env", (path,), context)
    if env.get(KUBECONFIG_ENV, "").strip():
        listed = [Path(p).expanduser() for p in _split(env[KUBECONFIG_ENV])]
        present = tuple(p for p in listed if p.is_file())
        if not present:
            raise KubeconfigError(f"${KUBECONFIG_ENV}: none of its files exists: {env[KUBECONFIG_ENV]}")
        return KubeconfigSource("KUBECONFIG", present, context)
    default = home / ".kube" / "config"
    if default.is_file():
        return KubeconfigSource("home", (default,), context)
    if env.get(SERVICE_HOST_ENV) and SERVICE_ACCOUNT_TOKEN.is_file():
        if context:
            raise KubeconfigError(f"--context {context}: no kubeconfig found to pick it from (in-cluster config)")
        return KubeconfigSource("in-cluster")
    raise KubeconfigError(
        "no cluster configuration: give --kubeconfig, set KUBECONFIG, create ~/.kube/config "
        f"({default} does not exist), or run in a pod with a service account")


def _named(config: Mapping[str, Any], section: str, name: str) -> dict[str, Any] | None:
    inner = section[:-1]
    for item in config.get(section) or []:
        if isinstance(item, dict) and item.get("name") == name:
            return item.get(inner) or {}
    return None


def _absolutise(document: dict[str, Any], base: Path) -> None:
    for section, (inner, keys) in _FILE_FIELDS.items():
        for item in document.get(section) or []:
            body = item.get(inner) if isinstance(item, dict) else None
            if not isinstance(body, dict):
                continue
            for key in keys:
                value = body.get(key)
                if isinstance(value, str) and value and not os.path.isabs(value):
                    body[key] = str((base / value).resolve())


def read_file(path: Path) -> dict[str, Any]:
    try:
        document = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise KubeconfigError(f"{path}: not a readable kubeconfig: {err}") from err
    if not isinstance(document, dict):
        raise KubeconfigError(f"{path}: not a kubeconfig (expected a mapping)")
    _absolutise(document, path.parent.resolve())
    return document


def merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """kubectl's merge of several kubeconfigs: first definition of each name wins, and the first
    ``current-context`` set wins."""
    merged: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "preferences": {}}
    for section in _NAMED_LISTS:
        seen: set[str] = set()
        items = []
        for document in documents:
            for item in document.get(section) or []:
                if isinstance(item, dict) and item.get("name") not in seen:
                    seen.add(item.get("name"))
                    items.append(item)
        merged[section] = items
    for document in documents:
        if document.get("current-context"):
            merged["current-context"] = document["current-context"]
            break
    return merged


def resolve(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None, *,
            env: Mapping[str, str] | None = None, home: Path | None = None) -> ResolvedKubeconfig:
    """The configuration the order above picks, merged, with ``context`` applied and checked."""
    source = find_source(kubeconfig, context, env=env, home=home)
    if source.kind == "in-cluster":
        return ResolvedKubeconfig(source)
    return _with_context(source, merge([read_file(path) for path in source.paths]), context)


def _with_context(source: KubeconfigSource, config: dict[str, Any], context: str | None) -> ResolvedKubeconfig:
    if context:
        if _named(config, "contexts", context) is None:
            names = sorted(c.get("name", "") for c in config.get("contexts") or [])
            raise KubeconfigError(f"--context {context}: no such context in {source.describe()} "
                                  f"(contexts: {', '.join(names) or 'none'})")
        config["current-context"] = context
    name = config.get("current-context")
    if not name:
        raise KubeconfigError(f"{source.describe()}: no current-context; pick one with --context")
    if _named(config, "contexts", name) is None:
        raise KubeconfigError(f"{source.describe()}: current-context {name!r} is not defined")
    return ResolvedKubeconfig(source, config)


def resolve_document(config: Mapping[str, Any], context: str | None = None) -> ResolvedKubeconfig:
    """A kubeconfig held in memory (e.g. read from a Secret), with ``context`` applied and
    checked as :func:`resolve` does; no file is read."""
    if not isinstance(config, Mapping):
        raise KubeconfigError("kubeconfig: not a kubeconfig (expected a mapping)")
    return _with_context(KubeconfigSource("memory", (), context), dict(config), context)
