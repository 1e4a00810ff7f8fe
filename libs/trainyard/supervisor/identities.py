"""Each service of a local stack runs as its own ServiceAccount, bound by the very RBAC that
``deploy/`` ships (docs/security.md, "API identities").

``trainyard up`` applies the ServiceAccounts, (Cluster)Roles and bindings of
``deploy/services/rbac.yaml`` (and, with workers, the dispatcher's from
``deploy/multicluster/dispatcher.yaml``) to each devcluster as the administrator, asks a token for
each service's ServiceAccount (TokenRequest) and writes that service a kubeconfig naming only
that token: ``<data dir>/identities/<cluster>/<service>.kubeconfig`` (0600). devcluster enforces
RBAC, so a permission missing from ``deploy/`` fails locally exactly as it would on a cluster.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainyard.kube.client import KubeClient, KubeError
from trainyard.supervisor import kubeapi, manifests
from trainyard.supervisor.manifests import Manifest

NAMESPACE = manifests.SYSTEM_NAMESPACE
# The ServiceAccount each service runs as, as deploy/ names them.
SERVICE_ACCOUNTS = {
    "watcher": "trainyard-watcher",
    "planner": "trainyard-planner",
    "applier": "trainyard-applier",
    "status": "trainyard-status",
    "dispatcher": "trainyard-dispatcher",
    # on a worker: the manager's dispatcher (deploy/multicluster/worker-rbac.yaml)
    "dispatcher-remote": "trainyard-dispatcher-remote",
}
RBAC_KINDS = {"ServiceAccount": ("", "serviceaccounts", True), "Role": ("rbac", "roles", True),
              "RoleBinding": ("rbac", "rolebindings", True), "ClusterRole": ("rbac", "clusterroles", False),
              "ClusterRoleBinding": ("rbac", "clusterrolebindings", False)}
# A year: tokens are asked again at every start of the stack.
TOKEN_SECONDS = 365 * 24 * 3600


def rbac_manifests(deploy_dir: Path, dispatcher: bool, worker: bool = False) -> list[Manifest]:
    """The ServiceAccounts and RBAC objects deploy/ ships for the services (and the dispatcher
    on a manager, or the dispatcher's identity on a worker)."""
    files = [deploy_dir / "services" / "rbac.yaml"]
    if dispatcher:
        files.append(deploy_dir / "multicluster" / "dispatcher.yaml")
    if worker:
        files.append(deploy_dir / "multicluster" / "worker-rbac.yaml")
    found: list[Manifest] = []
    for path in files:
        found += [m for m in manifests.load_yaml_file(path) if m.get("kind") in RBAC_KINDS]
    return found


def _paths(manifest: Manifest) -> tuple[str, str]:
    """(collection path, item path) of an RBAC manifest or ServiceAccount."""
    group, plural, namespaced = RBAC_KINDS[manifest["kind"]]
    prefix = "/api/v1" if not group else "/apis/rbac.authorization.k8s.io/v1"
    meta = manifest.get("metadata") or {}
    if not meta.get("name"):
        raise manifests.ManifestError(f"{manifest['kind']} without metadata.name")
    collection = f"{prefix}/namespaces/{meta.get('namespace') or 'default'}/{plural}" if namespaced \
        else f"{prefix}/{plural}"
    return collection, f"{collection}/{meta['name']}"


async def apply(client: KubeClient, manifest: Manifest) -> None:
    """Create, or replace the shipped fields of, one object (merge patch)."""
    collection, item = _paths(manifest)
    try:
        await kubeapi._call(client, "POST", collection, manifest)
        return
    except KubeError as err:
        if err.status != 409:
            raise kubeapi.failure(f"{manifest['kind']} {item}", err, "creation") from err
    try:
        await kubeapi._call(client, "PATCH", item, manifest, content_type="application/merge-patch+json")
    except KubeError as err:
        raise kubeapi.failure(f"{manifest['kind']} {item}", err, "update") from err


async def request_token(client: KubeClient, service_account: str, seconds: int = TOKEN_SECONDS) -> str:
    path = f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{service_account}/token"
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}}
    try:
        answer = await kubeapi._call(client, "POST", path, body)
    except KubeError as err:
        raise kubeapi.failure(f"token for ServiceAccount {NAMESPACE}/{service_account}", err, "token request") from err
    return str(answer["status"]["token"])


def service_kubeconfig(admin_kubeconfig: Path, service_account: str, token: str) -> str:
    """The admin kubeconfig's cluster (server, CA) with the ServiceAccount's token as its only user."""
    config = yaml.safe_load(admin_kubeconfig.read_text()) or {}
    user = f"system:serviceaccount:{NAMESPACE}:{service_account}"
    config["users"] = [{"name": user, "user": {"token": token}}]
    for context in config.get("contexts") or []:
        context.setdefault("context", {})["user"] = user
        context["context"]["namespace"] = NAMESPACE
    return yaml.safe_dump(config, sort_keys=False)


def _write_private(path: Path, text: str) -> None:
    from trainyard.security.pki import write_private

    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    write_private(path, text.encode())


async def prepare(admin_kubeconfig: Path, deploy_dir: Path, out_dir: Path, services: list[str],
                  dispatcher: bool = False, worker: bool = False) -> dict[str, Path]:
    """Apply deploy/'s RBAC to the cluster, then a kubeconfig per service: ``{service: path}``
    (on a worker also ``dispatcher-remote``: what the manager's dispatcher reaches it with)."""
    objects = rbac_manifests(deploy_dir, dispatcher, worker)
    client = await kubeapi.open_client(admin_kubeconfig)
    written: dict[str, Path] = {}
    try:
        for manifest in objects:
            await apply(client, manifest)
        for service in [*services, *(["dispatcher"] if dispatcher else []), *(["dispatcher-remote"] if worker else [])]:
            account = SERVICE_ACCOUNTS[service]
            token = await request_token(client, account)
            path = out_dir / f"{service}.kubeconfig"
            _write_private(path, service_kubeconfig(admin_kubeconfig, account, token))
            written[service] = path
    finally:
        await client.close()
    return written
