"""Pod DNS names as hosts-file entries (pure rendering) and the per-pod files kept current.

For a pod with hostname ``h`` and subdomain ``s`` in namespace ``ns`` (a headless Service
``s`` exists), ``h.s.ns.svc.cluster.local`` and its short forms ``h.s.ns.svc``, ``h.s.ns``,
``h.s`` name the pod's address; ``s.ns.svc.cluster.local`` (and short forms) names every
such pod; a headless Service without a selector names the addresses of its EndpointSlices (how
pods reach a process outside the cluster by Service name). Each pod's own file also maps its
bare hostname. The files are rewritten in place
(same inode) so a bind mount over /etc/hosts sees every update.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"
HEADER = ("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
          "# Kubernetes-managed hosts file (trainyard devcluster).\n")


@dataclass(frozen=True)
class PodRecord:
    namespace: str
    hostname: str
    subdomain: str
    ip: str


def pod_names(record: PodRecord) -> list[str]:
    fqdn = f"{record.hostname}.{record.subdomain}.{record.namespace}.svc.{CLUSTER_DOMAIN}"
    base = f"{record.hostname}.{record.subdomain}"
    return [fqdn, f"{base}.{record.namespace}.svc", f"{base}.{record.namespace}", base]


def service_names(namespace: str, service: str) -> list[str]:
    return [f"{service}.{namespace}.svc.{CLUSTER_DOMAIN}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}"]


SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def external_addresses(services: list[dict], slices: list[dict]) -> dict[tuple[str, str], list[str]]:
    """(namespace, Service) -> addresses, for headless Services without a selector: their
    EndpointSlices' endpoints that are not marked not-ready, as cluster DNS answers for them."""
    wanted = {((s.get("metadata") or {}).get("namespace", ""), (s.get("metadata") or {}).get("name", ""))
              for s in services
              if (s.get("spec") or {}).get("clusterIP") == "None" and not (s.get("spec") or {}).get("selector")}
    found: dict[tuple[str, str], list[str]] = {}
    for endpoint_slice in slices:
        meta = endpoint_slice.get("metadata") or {}
        key = (meta.get("namespace", ""), (meta.get("labels") or {}).get(SERVICE_NAME_LABEL, ""))
        if key not in wanted:
            continue
        for endpoint in endpoint_slice.get("endpoints") or []:
            if ((endpoint.get("conditions") or {}).get("ready")) is False:
                continue
            for address in endpoint.get("addresses") or []:
                if address not in found.setdefault(key, []):
                    found[key].append(address)
    return found


def render_hosts(own_ip: str, own_hostname: str, own_fqdn: str | None,
                 records: list[PodRecord], own_namespace: str = "",
                 external: dict[tuple[str, str], list[str]] | None = None) -> str:
    """One pod's hosts file: its own names first, then every published pod and service.

    The relative form ``h.s`` is namespace-local (the resolver's search list starts with the
    pod's namespace), so it is listed only for pods of the same namespace.
    """
    lines = [HEADER]
    own = [own_fqdn] if own_fqdn else []
    lines.append(f"{own_ip}\t{' '.join(own + [own_hostname])}\n")
    services: dict[tuple[str, str], list[str]] = {}
    for record in sorted(records, key=lambda r: (r.namespace, r.subdomain, r.hostname)):
        names = pod_names(record)
        if own_namespace and record.namespace != own_namespace:
            names = names[:-1]
        lines.append(f"{record.ip}\t{' '.join(names)}\n")
        services.setdefault((record.namespace, record.subdomain), []).append(record.ip)
    # Selector-less headless Services: the addresses of their EndpointSlices.
    for (namespace, service), ips in sorted((external or {}).items()):
        services.setdefault((namespace, service), []).extend(ips)
    for (namespace, service), ips in sorted(services.items()):
        for ip in ips:
            lines.append(f"{ip}\t{' '.join(service_names(namespace, service))}\n")
    return "".join(lines)


def write_in_place(path: Path, content: str) -> None:
    """Rewrite a file keeping its inode (bind mounts of it see the new content)."""
    data = content.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        # Write first, then cut: a reader never sees an empty file.
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


class HostsTable:
    """Every running pod's DNS record, and the hosts file of each pod kept in sync."""

    def __init__(self) -> None:
        self.records: dict[str, PodRecord] = {}
        self.ready: dict[str, bool] = {}
        self.files: dict[str, tuple[Path, str, str, str | None, str]] = {}
        # (namespace, headless Service) -> publishNotReadyAddresses; None: publish everything
        self.services: dict[tuple[str, str], bool] | None = None
        # (namespace, selector-less headless Service) -> its endpoint addresses
        self.external: dict[tuple[str, str], list[str]] = {}

    def published(self) -> list[PodRecord]:
        # A replacement pod with the same hostname was added later: its record wins.
        latest: dict[tuple[str, str, str], PodRecord] = {}
        for uid, record in self.records.items():
            if self.services is not None:
                publish_not_ready = self.services.get((record.namespace, record.subdomain))
                if publish_not_ready is None or not (publish_not_ready or self.ready.get(uid)):
                    continue
            latest[(record.namespace, record.subdomain, record.hostname)] = record
        return list(latest.values())

    def add_pod(self, uid: str, path: Path, ip: str, hostname: str, namespace: str,
                subdomain: str | None) -> None:
        fqdn = None
        if subdomain:
            record = PodRecord(namespace=namespace, hostname=hostname, subdomain=subdomain, ip=ip)
            self.records[uid] = record
            fqdn = pod_names(record)[0]
        self.files[uid] = (path, ip, hostname, fqdn, namespace)
        self.refresh()

    def drop_record(self, uid: str) -> None:
        """The pod stops being published (terminal or deleted); its own file stays usable."""
        if self.records.pop(uid, None) is not None:
            self.refresh()

    def remove_pod(self, uid: str) -> None:
        self.files.pop(uid, None)
        self.ready.pop(uid, None)
        self.drop_record(uid)

    def set_services(self, services: dict[tuple[str, str], bool]) -> None:
        if services != self.services:
            self.services = dict(services)
            self.refresh()

    def set_external(self, external: dict[tuple[str, str], list[str]]) -> None:
        if external != self.external:
            self.external = {key: list(ips) for key, ips in external.items()}
            self.refresh()

    def set_ready(self, uid: str, ready: bool) -> None:
        """Pod readiness matters for Services with ``publishNotReadyAddresses: false``."""
        if self.ready.get(uid) != ready:
            self.ready[uid] = ready
            if uid in self.records:
                self.refresh()

    def refresh(self) -> None:
        records = self.published()
        for path, ip, hostname, fqdn, namespace in list(self.files.values()):
            try:
                write_in_place(path, render_hosts(ip, hostname, fqdn, records, namespace, self.external))
            except OSError:
                continue
