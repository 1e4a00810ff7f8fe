"""The environment a container process sees, built from the pod object (pure).

Order (later wins): ``KUBERNETES_SERVICE_*``, ``envFrom[]``, ``env[]`` (with ``$(VAR)``
expansion against the variables defined before each entry), then ``HOSTNAME``. Missing
ConfigMaps/Secrets/keys raise :class:`ContainerConfigError` carrying the kubelet's message
(the container then waits with reason ``CreateContainerConfigError``).
"""
from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Mapping

from .envexpand import expand
from trainyard.apimachinery.quantity import QuantityError, parse_quantity

_KEYED_FIELD = re.compile(r"""^metadata\.(labels|annotations)\[['"](.+)['"]\]$""")


class ContainerConfigError(Exception):
    """A source the container needs is missing (kubelet reason CreateContainerConfigError)."""


@dataclass(frozen=True)
class PodContext:
    """What a container can read besides its pod: addresses, node, and API sources."""

    pod_ip: str = ""
    host_ip: str = ""
    node_name: str = ""
    configmaps: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    secrets: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    node_allocatable: Mapping[str, str] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=dict)
    # Projected ServiceAccount tokens, by "<volume>/<path>" (see token_projections).
    tokens: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TokenProjection:
    """A ``serviceAccountToken`` source of a projected volume: what the kubelet requests."""

    volume: str
    path: str
    audience: str
    expiration_seconds: int

    @property
    def key(self) -> str:
        return f"{self.volume}/{self.path}"


def token_projections(pod: dict[str, Any]) -> list[TokenProjection]:
    found = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        for source in ((volume.get("projected") or {}).get("sources") or []):
            projection = source.get("serviceAccountToken")
            if isinstance(projection, dict):
                found.append(TokenProjection(volume.get("name", ""), projection.get("path", ""),
                                             projection.get("audience") or "",
                                             int(projection.get("expirationSeconds") or 3600)))
    return found


def referenced_sources(pod: dict[str, Any]) -> tuple[set[str], set[str]]:
    """The ConfigMap and Secret names a pod reads (env, envFrom, volumes)."""
    configmaps: set[str] = set()
    secrets: set[str] = set()
    spec = pod.get("spec") or {}
    for container in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
        for source in container.get("envFrom") or []:
            if (source.get("configMapRef") or {}).get("name"):
                configmaps.add(source["configMapRef"]["name"])
            if (source.get("secretRef") or {}).get("name"):
                secrets.add(source["secretRef"]["name"])
        for var in container.get("env") or []:
            value_from = var.get("valueFrom") or {}
            if (value_from.get("configMapKeyRef") or {}).get("name"):
                configmaps.add(value_from["configMapKeyRef"]["name"])
            if (value_from.get("secretKeyRef") or {}).get("name"):
                secrets.add(value_from["secretKeyRef"]["name"])
    for volume in spec.get("volumes") or []:
        if (volume.get("configMap") or {}).get("name"):
            configmaps.add(volume["configMap"]["name"])
        if (volume.get("secret") or {}).get("secretName"):
            secrets.add(volume["secret"]["secretName"])
        for projection in (volume.get("projected") or {}).get("sources") or []:
            if (projection.get("configMap") or {}).get("name"):
                configmaps.add(projection["configMap"]["name"])
            if (projection.get("secret") or {}).get("name"):
                secrets.add(projection["secret"]["name"])
    return configmaps, secrets


def configmap_items(configmap: dict[str, Any]) -> dict[str, bytes]:
    items = {key: str(value).encode() for key, value in (configmap.get("data") or {}).items()}
    for key, value in (configmap.get("binaryData") or {}).items():
        items[key] = base64.b64decode(value)
    return items


def secret_items(secret: dict[str, Any]) -> dict[str, bytes]:
    items = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
    for key, value in (secret.get("stringData") or {}).items():
        items[key] = str(value).encode()
    return items


def field_value(pod: dict[str, Any], path: str, ctx: PodContext) -> str:
    """A ``fieldRef.fieldPath`` value read from the pod object (unknown keys give "")."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName") or ctx.node_name,
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": ctx.pod_ip,
        "status.podIPs": ctx.pod_ip,
        "status.hostIP": ctx.host_ip,
        "status.hostIPs": ctx.host_ip,
    }
    if path in simple:
        return str(simple[path])
    keyed = _KEYED_FIELD.match(path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(values.items()))
    raise ContainerConfigError(f"unsupported fieldRef fieldPath {path!r}")


def resource_value(container: dict[str, Any], ref: dict[str, Any], ctx: PodContext) -> str:
    resource = ref.get("resource", "")
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = ctx.node_allocatable.get(name, "0")
    try:
        amount = parse_quantity(raw).value
        divisor = parse_quantity(ref.get("divisor") or "1").value
    except QuantityError as err:
        raise ContainerConfigError(f"resourceFieldRef {resource}: {err}") from err
    if divisor == 0:
        raise ContainerConfigError(f"resourceFieldRef {resource}: divisor must not be 0")
    return str(math.ceil(amount / divisor) if name == "cpu" else int(amount / divisor))


def _key_from(kind: str, namespace: str, name: str, key: str, items: dict[str, bytes] | None,
              optional: bool) -> str | None:
    if items is None:
        if optional:
            return None
        raise ContainerConfigError(f'{kind.lower()} "{name}" not found')
    if key not in items:
        if optional:
            return None
        raise ContainerConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return items[key].decode(errors="replace")


def container_env(pod: dict[str, Any], container: dict[str, Any], ctx: PodContext) -> dict[str, str]:
    """The full environment of one container process (an ordered dict, later entries win)."""
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    env: dict[str, str] = dict(ctx.base_env)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix") or ""
        if "configMapRef" in source:
            ref = source["configMapRef"] or {}
            found = ctx.configmaps.get(ref.get("name", ""))
            items = configmap_items(found) if found is not None else None
            kind = "ConfigMap"
        elif "secretRef" in source:
            ref = source["secretRef"] or {}
            found = ctx.secrets.get(ref.get("name", ""))
            items = secret_items(found) if found is not None else None
            kind = "Secret"
        else:
            continue
        if items is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f'{kind.lower()} "{ref.get("name", "")}" not found')
        for key, value in items.items():
            env[prefix + key] = value.decode(errors="replace")
    for var in container.get("env") or []:
        name = var.get("name", "")
        if "valueFrom" not in var or var.get("value") is not None:
            env[name] = expand(str(var.get("value") or ""), env)
            continue
        value_from = var.get("valueFrom") or {}
        value: str | None
        if "fieldRef" in value_from:
            value = field_value(pod, (value_from["fieldRef"] or {}).get("fieldPath", ""), ctx)
        elif "resourceFieldRef" in value_from:
            value = resource_value(container, value_from["resourceFieldRef"] or {}, ctx)
        elif "configMapKeyRef" in value_from:
            ref = value_from["configMapKeyRef"] or {}
            found = ctx.configmaps.get(ref.get("name", ""))
            value = _key_from("ConfigMap", namespace, ref.get("name", ""), ref.get("key", ""),
                              configmap_items(found) if found is not None else None,
                              bool(ref.get("optional")))
        elif "secretKeyRef" in value_from:
            ref = value_from["secretKeyRef"] or {}
            found = ctx.secrets.get(ref.get("name", ""))
            value = _key_from("Secret", namespace, ref.get("name", ""), ref.get("key", ""),
                              secret_items(found) if found is not None else None,
                              bool(ref.get("optional")))
        else:
            value = ""
        if value is not None:
            env[name] = value
    spec = pod.get("spec") or {}
    env["HOSTNAME"] = spec.get("hostname") or (pod.get("metadata") or {}).get("name", "")
    return env


def container_argv(container: dict[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expansion (no image entrypoint exists locally)."""
    command = [expand(str(part), env) for part in container.get("command") or []]
    args = [expand(str(part), env) for part in container.get("args") or []]
    return command + args


def pod_hostname(pod: dict[str, Any]) -> str:
    spec = pod.get("spec") or {}
    return spec.get("hostname") or (pod.get("metadata") or {}).get("name", "")


def qos_class(pod: dict[str, Any]) -> str:
    """``Guaranteed`` / ``Burstable`` / ``BestEffort`` from the containers' cpu/memory."""
    containers = list((pod.get("spec") or {}).get("containers") or [])
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                any_set = True
            limit = limits.get(name)
            request = requests.get(name, limit)
            if limit is None or request is None or _quantity_or_none(request) != _quantity_or_none(limit):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _quantity_or_none(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value).value
    except QuantityError:
        return None
