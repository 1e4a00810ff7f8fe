"""What `trainyard up` installs into the API server: CRDs, the default runtimes, and the public
ConfigMap the Kubeflow SDK reads. Pure: reading files and building documents, no API calls."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainyard.compat import DEFAULT_COMPAT, TrainerCompat

# The SDK reads this ConfigMap on every TrainerClient() (kubeflow 0.5.0, `verify_backend`); only
# a warning is logged without it, but a real installation ships it, so a local one does too.
SYSTEM_NAMESPACE = "kubeflow-system"
PUBLIC_CONFIGMAP = "kubeflow-trainer-public"
# The upstream release whose behaviour each compatibility level reproduces (docs/compatibility.md).
TRAINER_VERSIONS = {TrainerCompat.V2_3: "v2.3.0", TrainerCompat.V2_1: "v2.1.0"}
COMPATIBLE_TRAINER_VERSION = TRAINER_VERSIONS[DEFAULT_COMPAT]

Manifest = dict[str, Any]


class ManifestError(Exception):
    pass


def repository_deploy_dir() -> Path:
    """`deploy/`: the checkout's (editable installs), else the copy shipped in the package."""
    from trainyard.packaged import deploy_dir

    return deploy_dir()


# The CRDs embed the whole PodSpec schema (about 1 MB of YAML): libyaml parses them ten times
# faster than the pure-Python loader, which matters for how long `trainyard up` takes.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
# Even so the CRDs took 0.7 s of CPU to parse at every `trainyard up` (JSON: 20 ms). A large
# file's documents are kept as JSON in the user's cache, under the SHA-256 of the file's bytes:
# an edited file is a new key, and a cache that cannot be written is only slower.
CACHED_FROM_BYTES = 64 * 1024


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainyard" / "yaml-as-json"


def _parse(path: Path, data: bytes) -> list[Any]:
    try:
        return list(yaml.load_all(data, Loader=_SAFE_LOADER))
    except yaml.YAMLError as err:
        raise ManifestError(f"{path}: not valid YAML: {err}") from err


def _parse_cached(path: Path, data: bytes) -> list[Any]:
    if len(data) < CACHED_FROM_BYTES:
        return _parse(path, data)
    cached = _cache_dir() / f"{hashlib.sha256(data).hexdigest()}.json"
    try:
        return json.loads(cached.read_bytes())
    except (OSError, ValueError):
        pass
    documents = _parse(path, data)
    try:
        text = json.dumps(documents, separators=(",", ":"))
    except (TypeError, ValueError):  # YAML-only values (dates, sets...): not cached
        return documents
    if json.loads(text) != documents:  # non-string keys, tuples...: not cached either
        return documents
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        os.replace(partial, cached)  # a reader sees the whole file or none
    except OSError:
        pass
    return documents


def load_yaml_file(path: Path) -> list[Manifest]:
    documents = _parse_cached(path, path.read_bytes())
    manifests = [doc for doc in documents if doc]
    for doc in manifests:
        if not isinstance(doc, dict) or not doc.get("kind") or not doc.get("apiVersion"):
            raise ManifestError(f"{path}: every document needs apiVersion and kind")
    return manifests


def load_crds(deploy_dir: Path, compat: TrainerCompat = DEFAULT_COMPAT) -> list[Manifest]:
    """The committed CRDs in deploy/crds/, else freshly generated ones from the models, with the
    rule messages of the compatibility level (deploy/compat/v2.1 does the same for a cluster)."""
    crd_dir = deploy_dir / "crds"
    files = sorted(crd_dir.glob("*.yaml")) if crd_dir.is_dir() else []
    crds = [doc for path in files for doc in load_yaml_file(path) if doc["kind"] == "CustomResourceDefinition"]
    try:
        from trainyard.api.crds import crds_at
    except ImportError as err:
        raise ManifestError(
            f"no CRDs found: {crd_dir} holds none and trainyard.api.crds is not available ({err})"
        ) from err
    return crds_at(compat, crds or None)


def load_multicluster_crds(deploy_dir: Path) -> list[Manifest]:
    """deploy/multicluster/crds/: the MultiKueueCluster CRD for a manager without Kueue."""
    crd_dir = deploy_dir / "multicluster" / "crds"
    files = sorted(crd_dir.glob("*.yaml")) if crd_dir.is_dir() else []
    crds = [doc for path in files for doc in load_yaml_file(path) if doc["kind"] == "CustomResourceDefinition"]
    if not crds:
        raise ManifestError(f"no MultiKueueCluster CRD in {crd_dir}")
    return crds


def worker_kubeconfig_secret_name(worker: str) -> str:
    return f"{worker}-kubeconfig"


def worker_registration(worker: str, kubeconfig: str, secrets_namespace: str) -> list[Manifest]:
    """A worker as a manager declares it: the Secret holding its kubeconfig and the
    MultiKueueCluster pointing at that Secret (Kueue's shape)."""
    import base64

    secret_name = worker_kubeconfig_secret_name(worker)
    return [
        {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
         "metadata": {"name": secret_name, "namespace": secrets_namespace},
         "data": {"kubeconfig": base64.b64encode(kubeconfig.encode()).decode()}},
        {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster",
         "metadata": {"name": worker},
         "spec": {"kubeConfig": {"locationType": "Secret", "location": secret_name}}},
    ]


def load_runtimes(deploy_dir: Path) -> list[Manifest]:
    """The runtimes listed in deploy/runtimes/kustomization.yaml, in that order."""
    runtimes_dir = deploy_dir / "runtimes"
    kustomization = runtimes_dir / "kustomization.yaml"
    if not kustomization.is_file():
        raise ManifestError(f"{kustomization} not found: cannot tell which runtimes to install")
    resources = yaml.safe_load(kustomization.read_text()).get("resources") or []
    return [doc for name in resources for doc in load_yaml_file(runtimes_dir / name)]


def system_namespace() -> Manifest:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}}


def public_configmap(compat: TrainerCompat = DEFAULT_COMPAT) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": PUBLIC_CONFIGMAP, "namespace": SYSTEM_NAMESPACE},
        "data": {"kubeflow_trainer_version": TRAINER_VERSIONS[compat]},
    }


# Feature gate TrainJobStatus: the Service trainer pods reach the status endpoint by. It has no
# selector (the endpoint is a host process); its EndpointSlice names the node's address.
STATUS_SERVICE = "trainyard-status"


def status_service(port: int) -> Manifest:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": STATUS_SERVICE, "namespace": SYSTEM_NAMESPACE},
            "spec": {"clusterIP": "None", "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}}


def status_endpoint_slice(address: str, port: int) -> Manifest:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": STATUS_SERVICE, "namespace": SYSTEM_NAMESPACE,
                         "labels": {"kubernetes.io/service-name": STATUS_SERVICE}},
            "addressType": "IPv4", "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}


def status_service_hosts() -> list[str]:
    return [f"{STATUS_SERVICE}.{SYSTEM_NAMESPACE}.svc", f"{STATUS_SERVICE}.{SYSTEM_NAMESPACE}.svc.cluster.local"]


# The planner replicas' admission webhooks behind upstream's Service name, as deploy/ ships it;
# locally the Service has no selector (the replicas are host processes) and one EndpointSlice
# per replica names its port, so the API server spreads calls over live replicas.
WEBHOOK_SERVICE = "kubeflow-trainer-controller-manager"
WEBHOOK_PORT_NAME = "webhook"


def webhook_service() -> Manifest:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": WEBHOOK_SERVICE, "namespace": SYSTEM_NAMESPACE},
            "spec": {"ports": [{"name": WEBHOOK_PORT_NAME, "port": 443, "protocol": "TCP"}]}}


def webhook_endpoint_slice(replica: str, address: str, port: int) -> Manifest:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{WEBHOOK_SERVICE}-{replica}", "namespace": SYSTEM_NAMESPACE,
                         "labels": {"kubernetes.io/service-name": WEBHOOK_SERVICE}},
            "addressType": "IPv4", "ports": [{"name": WEBHOOK_PORT_NAME, "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}


@dataclass(frozen=True)
class ResourcePath:
    """Where a manifest lives in the REST API."""

    collection: str
    name: str

    @property
    def item(self) -> str:
        return f"{self.collection}/{self.name}"


_PLURALS = {
    "CustomResourceDefinition": "customresourcedefinitions",
    "Namespace": "namespaces",
    "ConfigMap": "configmaps",
    "ClusterTrainingRuntime": "clustertrainingruntimes",
    "TrainingRuntime": "trainingruntimes",
    "TrainJob": "trainjobs",
    "Secret": "secrets",
    "MultiKueueCluster": "multikueueclusters",
    "Service": "services",
    "EndpointSlice": "endpointslices",
}
_CLUSTER_SCOPED = {"CustomResourceDefinition", "Namespace", "ClusterTrainingRuntime", "MultiKueueCluster"}


def resource_path(manifest: Manifest) -> ResourcePath:
    kind = manifest["kind"]
    if kind not in _PLURALS:
        raise ManifestError(f"cannot install kind {kind!r}: not one of {sorted(_PLURALS)}")
    api_version = manifest["apiVersion"]
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    metadata = manifest.get("metadata") or {}
    name = metadata.get("name")
    if not name:
        raise ManifestError(f"{kind} without metadata.name")
    if kind in _CLUSTER_SCOPED:
        return ResourcePath(f"{prefix}/{_PLURALS[kind]}", name)
    namespace = metadata.get("namespace") or "default"
    return ResourcePath(f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}", name)
