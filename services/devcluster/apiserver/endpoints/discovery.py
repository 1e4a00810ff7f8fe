"""Discovery documents: aggregated (apidiscovery.k8s.io/v2) and the legacy lists."""
from __future__ import annotations

import hashlib
from typing import Any

from ..registry.kinds import SUBRESOURCE_VERBS, Registry, ResourceType

AGGREGATED_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
AGGREGATED_V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"


def wants_aggregated(accept: str) -> str | None:
    """The aggregated media type the client accepts (v2 preferred), if any."""
    compact = accept.replace(" ", "")
    if "g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList" in compact:
        return AGGREGATED_V2
    if "g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList" in compact:
        return AGGREGATED_V2BETA1
    return None


def _subresource_kind(rt: ResourceType, sub: str) -> dict[str, str]:
    if sub == "log":
        return {"group": "", "version": "", "kind": "Pod"}
    if sub == "binding":
        return {"group": "", "version": "v1", "kind": "Binding"}
    if sub == "token":
        return {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"}
    if sub == "scale":
        return {"group": "autoscaling", "version": "v1", "kind": "Scale"}
    return {"group": rt.group, "version": rt.version, "kind": rt.kind}


def _aggregated_resource(rt: ResourceType) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "resource": rt.resource,
        "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "scope": "Namespaced" if rt.namespaced else "Cluster",
        "singularResource": rt.singular,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        entry["shortNames"] = list(rt.short_names)
    if rt.categories:
        entry["categories"] = list(rt.categories)
    subs = [{"subresource": s, "responseKind": _subresource_kind(rt, s), "verbs": list(SUBRESOURCE_VERBS.get(s, ("get",)))}
            for s in sorted(rt.subresources)]
    if subs:
        entry["subresources"] = subs
    return entry


def aggregated(registry: Registry, core: bool) -> dict[str, Any]:
    items = []
    for group, versions in registry.groups().items():
        if (group == "") != core:
            continue
        version_entries = []
        for version in versions:
            resources = sorted((_aggregated_resource(t) for t in registry.all()
                                if t.group == group and t.version == version), key=lambda r: r["resource"])
            version_entries.append({"version": version, "resources": resources, "freshness": "Current"})
        items.append({"metadata": {"name": group, "creationTimestamp": None}, "versions": version_entries})
    if not core:
        items.sort(key=lambda i: (not i["metadata"]["name"].endswith("k8s.io"), i["metadata"]["name"]))
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def api_versions(server_address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    vs = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"name": group, "versions": vs, "preferredVersion": vs[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group_entry(g, vs) for g, vs in registry.groups().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.groups().get(group)
    if not versions or not group:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = [t for t in registry.all() if t.group == group and t.version == version]
    if not types:
        return None
    resources = []
    for t in sorted(types, key=lambda t: t.resource):
        entry: dict[str, Any] = {
            "name": t.resource, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "verbs": list(t.verbs),
            "storageVersionHash": hashlib.sha256(f"{t.group}/{t.version}/{t.kind}".encode()).digest()[:8].hex(),
        }
        if t.short_names:
            entry["shortNames"] = list(t.short_names)
        if t.categories:
            entry["categories"] = list(t.categories)
        resources.append(entry)
        for sub in sorted(t.subresources):
            sub_kind = _subresource_kind(t, sub)
            entry = {"name": f"{t.resource}/{sub}", "singularName": "", "namespaced": t.namespaced,
                     "kind": sub_kind["kind"], "verbs": list(SUBRESOURCE_VERBS.get(sub, ("get",)))}
            if sub_kind["group"] and sub_kind["group"] != t.group:
                # A subresource of another group's kind names it, as kube-apiserver does.
                entry.update(group=sub_kind["group"], version=sub_kind["version"])
            resources.append(entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources}
