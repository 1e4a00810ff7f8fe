"""Sizing and autoscaling as deploy/ ships them (docs/deploy.md, "Sizing and autoscaling").

A manager's overlay of deploy/ with the components deploy/multicluster, deploy/autoscaling and
deploy/multicluster/autoscaling is rendered with the real kubectl (`kubectl kustomize`, no
cluster needed). Every ScaledObject is valid against KEDA's own CRD, vendored unchanged from a
named release; what the schema cannot check (a trigger's metadata is a free map of strings) is
checked here: the prometheus trigger's serverAddress, query and threshold, the query naming the
role's backlog on the target Deployment's cluster, the target an existing Deployment, at most
as many replicas as partitions. Every container has CPU and memory requests and limits.
The query itself runs on a real Prometheus in tests/e2e/test_autoscaling_query.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from trainyard.apimachinery.quantity import parse_quantity

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
KUBECTL = Path(sys.executable).parent / "kubectl"
KEDA_CRD = DEPLOY / "crds" / "dependencies" / "keda.sh_scaledobjects.yaml"
KEDA_RELEASE = "v2.20.2"
# sha256 of config/crd/bases/keda.sh_scaledobjects.yaml at KEDA's tag v2.20.2: the vendored file
# is that file below its header comment, unchanged.
KEDA_CRD_SHA256 = "af35555862a83933b074af14ad439c4b4ceabaf4daa3e9338e9b23e36d308d80"
COMPONENTS = ("multicluster", "autoscaling", "multicluster/autoscaling")
PARTITIONED = {"planner", "applier", "status", "dispatcher"}
QUERY = re.compile(r'^max\(trainyard_role_backlog_messages\{role="(?P<role>[a-z-]+)",cluster="(?P<cluster>[^"]+)"\}\)$')


def render(tmp_path: Path, components: tuple[str, ...]) -> list[dict]:
    """`kubectl kustomize` of an overlay as a user writes it: deploy/ plus ``components``."""
    overlay = tmp_path / ("overlay-" + "-".join(c.replace("/", "_") for c in components) if components else "plain")
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(DEPLOY / c, overlay) for c in components],
    }))
    out = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return render(tmp_path_factory.mktemp("autoscaling"), COMPONENTS)


def scaled_objects(docs: list[dict]) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == "ScaledObject"]


def deployments(docs: list[dict]) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Deployment"}


def env_of(deployment: dict) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def keda_schema() -> dict:
    (crd,) = [doc for doc in yaml.safe_load_all(KEDA_CRD.read_text()) if doc]
    (version,) = [v for v in crd["spec"]["versions"] if v["served"] and v["storage"]]
    assert version["name"] == "v1alpha1"
    return json.loads(json.dumps(version["schema"]["openAPIV3Schema"]))


def test_the_vendored_crd_is_kedas_release_unchanged() -> None:
    text = KEDA_CRD.read_text()
    header, _, body = text.partition("\n---\n")
    assert f"KEDA {KEDA_RELEASE}" in header and "kedacore/keda" in header
    assert all(line.startswith("#") for line in header.splitlines())
    assert hashlib.sha256(("---\n" + body).encode()).hexdigest() == KEDA_CRD_SHA256
    (crd,) = [doc for doc in yaml.safe_load_all(text) if doc]
    assert crd["metadata"]["name"] == "scaledobjects.keda.sh"
    # Deliberately not installed by deploy/crds/dependencies (KEDA's own install brings it), but
    # the release is named there.
    dependencies = (DEPLOY / "crds" / "dependencies" / "kustomization.yaml").read_text()
    assert KEDA_CRD.name not in yaml.safe_load(dependencies)["resources"]
    assert KEDA_RELEASE in dependencies


def test_every_scaled_object_is_valid_against_kedas_crd(rendered: list[dict]) -> None:
    validator = jsonschema.Draft7Validator(keda_schema())
    found = scaled_objects(rendered)
    assert found
    for doc in found:
        assert doc["apiVersion"] == "keda.sh/v1alpha1"
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert errors == [], (doc["metadata"]["name"], errors)
    # The validation can tell: a number where KEDA's metadata map takes strings, no target name.
    bad = json.loads(json.dumps(found[0]))
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 2000
    del bad["spec"]["scaleTargetRef"]["name"]
    messages = {e.message for e in validator.iter_errors(bad)}
    assert "2000 is not of type 'string'" in messages and "'name' is a required property" in messages


def test_each_partitioned_role_scales_on_its_backlog(rendered: list[dict]) -> None:
    targets = deployments(rendered)
    seen = {}
    for doc in scaled_objects(rendered):
        spec = doc["spec"]
        assert doc["metadata"]["namespace"] == "kubeflow-system"
        target = spec["scaleTargetRef"]
        assert target.get("kind", "Deployment") == "Deployment" and target.get("apiVersion", "apps/v1") == "apps/v1"
        deployment = targets.get(target["name"])
        assert deployment is not None, f"{doc['metadata']['name']}: no Deployment {target['name']} in deploy/"
        assert deployment["metadata"]["namespace"] == doc["metadata"]["namespace"]
        role = deployment["metadata"]["labels"]["app.kubernetes.io/component"]
        env = env_of(deployment)
        # Never more replicas than partitions: one beyond the count holds none.
        partitions = int(env["TRAINYARD_PARTITIONS"])
        assert 2 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions, (role, spec)
        assert "replicas" not in deployment["spec"], f"{target['name']}: the HPA owns spec.replicas"
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "prometheus" and trigger.get("metricType", "AverageValue") == "AverageValue"
        metadata = trigger["metadata"]
        assert {"serverAddress", "query", "threshold"} <= set(metadata), metadata
        assert re.fullmatch(r"https?://[a-z0-9.-]+(:\d+)?", metadata["serverAddress"]), metadata["serverAddress"]
        assert isinstance(metadata["threshold"], str) and float(metadata["threshold"]) > 0
        assert metadata.get("ignoreNullValues") == "false"  # no series holds the count, never scales to min
        query = QUERY.match(metadata["query"])
        assert query, metadata["query"]
        assert (query["role"], query["cluster"]) == (role, env["TRAINYARD_CLUSTER"])
        seen[role] = doc["metadata"]["name"]
    assert set(seen) == PARTITIONED, seen  # the watcher keeps its fixed count
    assert targets["trainyard-watcher"]["spec"]["replicas"] == 2


def test_the_managers_services_and_its_dispatcher_run_as_one_cluster(rendered: list[dict]) -> None:
    """The dispatcher acts on the TrainJob events of its own cluster name and holds worker slots
    under it, and its bus identity is made for the bus-setup Job's first --cluster. All must be
    the manager services' TRAINYARD_CLUSTER: a dispatcher named `manager` beside services
    publishing as `default` saw none of the manager's TrainJob events and was refused its slots."""
    clusters = {name: env_of(doc).get("TRAINYARD_CLUSTER") for name, doc in deployments(rendered).items()}
    assert "trainyard-dispatcher" in clusters
    assert len(set(clusters.values())) == 1, clusters
    (job,) = [doc for doc in rendered if doc["kind"] == "Job" and doc["metadata"]["name"] == "trainyard-bus-setup"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    named = [args[i + 1] for i, arg in enumerate(args) if arg == "--cluster"]
    assert named[:1] == [clusters["trainyard-dispatcher"]], named


def test_without_the_components_nothing_autoscales(tmp_path: Path) -> None:
    plain = render(tmp_path, ())
    assert scaled_objects(plain) == []
    assert {name: d["spec"]["replicas"] for name, d in deployments(plain).items()} == {
        f"trainyard-{role}": 2 for role in ("watcher", "planner", "applier", "status")}


def test_every_container_has_cpu_and_memory_requests_and_limits(rendered: list[dict]) -> None:
    checked = []
    for doc in rendered:
        template = doc.get("spec", {}).get("template") if doc["kind"] in ("Deployment", "StatefulSet", "Job") else None
        if template is None:
            continue
        for container in template["spec"].get("initContainers", []) + template["spec"]["containers"]:
            resources = container.get("resources") or {}
            where = f"{doc['kind']}/{doc['metadata']['name']}/{container['name']}"
            for resource in ("cpu", "memory"):
                request = (resources.get("requests") or {}).get(resource)
                limit = (resources.get("limits") or {}).get(resource)
                assert request and limit, f"{where}: {resource} request {request}, limit {limit}"
                assert parse_quantity(request).value <= parse_quantity(limit).value, (where, resource)
            checked.append(where)
    assert {f"Deployment/trainyard-{r}/{r}" for r in ("watcher", "planner", "applier", "status", "dispatcher")} \
        | {"StatefulSet/trainyard-nats/nats", "Job/trainyard-bus-setup/bus-setup"} <= set(checked)
    # One event loop per service process: a limit of one CPU, which sizes its handler slots to
    # the bus's default (32 per core, docs/bus.md).
    for doc in deployments(rendered).values():
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        assert parse_quantity(container["resources"]["limits"]["cpu"]).value == 1, doc["metadata"]["name"]


def test_the_overlay_of_docs_deploy_md_renders_with_its_prometheus_address(tmp_path: Path) -> None:
    """docs/deploy.md's overlay, as printed there (with the Prometheus address patch)."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    section = doc[doc.index("### Autoscaling with KEDA"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    block = block[:block.index("```")]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(block.replace("<trainyard>", os.path.relpath(REPO, overlay)))
    out = subprocess.run([str(KUBECTL), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    addresses = {d["metadata"]["name"]: d["spec"]["triggers"][0]["metadata"]["serverAddress"] for d in scaled_objects(docs)}
    assert addresses == {f"trainyard-{role}": "http://prometheus-k8s.monitoring.svc:9090"
                         for role in ("planner", "applier", "status")}
    assert {d["kind"] for d in docs} >= {"PodMonitor", "ScaledObject", "Deployment"}
