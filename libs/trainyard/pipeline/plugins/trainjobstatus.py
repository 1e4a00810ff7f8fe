"""TrainJobStatus (v2.3.0, feature gate ``TrainJobStatus``, off by default): trainer pods get
what they need to report their progress to the status endpoint — its URL, the CA that signed
its certificate, and a ServiceAccount token bound to the TrainJob's status audience.

Not in ``REGISTRY``: default plans keep upstream's default (gate off). A deployment that runs
the status endpoint plans with ``with_trainjob_status(REGISTRY, StatusEndpoint(...))``.
Facts from upstream: env ``KUBEFLOW_TRAINER_SERVER_URL`` / ``_CA_CERT`` / ``_TOKEN``, the
projected volume ``kubeflow-trainer-token`` at ``/var/run/secrets/kubeflow/trainer`` (token
with the TrainJob's audience, 3600 s; ``ca.crt`` from the ConfigMap ``<trainjob>-tls-config``
that this plugin builds), injected into every container of the trainer pod set.
"""
from __future__ import annotations

from trainyard.api import constants as c

from dataclasses import dataclass
from functools import partial
from typing import Any, Sequence

from ..documents import ensure_list
from ..framework import ChildKind, PlanContext, Plugin
from ..trainer_status import status_path, token_audience
from ..upsert import upsert_env, upsert_volume_mount

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
MOUNT_PATH = "/var/run/secrets/kubeflow/trainer"
VOLUME = "kubeflow-trainer-token"
CA_KEY = "ca.crt"
TOKEN_FILE = "token"
TOKEN_EXPIRATION_SECONDS = 3600
CONFIGMAP_SUFFIX = "-tls-config"
CHILDREN = (ChildKind("v1", "ConfigMap", CONFIGMAP_SUFFIX),)  # the CA the pods trust


@dataclass(frozen=True)
class StatusEndpoint:
    """Where trainer pods reach the status endpoint: ``https://<service>.<ns>.svc:<port>``
    (no path) and the PEM of the CA that signed its certificate."""

    base_url: str
    ca_pem: str


def _enforce(endpoint: StatusEndpoint, ctx: PlanContext) -> None:
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    if trainer_set is None:
        return
    env = [{"name": ENV_URL, "value": endpoint.base_url.rstrip("/") + status_path(ctx.namespace, ctx.name)},
           {"name": ENV_CA_CERT, "value": f"{MOUNT_PATH}/{CA_KEY}"},
           {"name": ENV_TOKEN, "value": f"{MOUNT_PATH}/{TOKEN_FILE}"}]
    for container in trainer_set.containers:
        for item in env:
            upsert_env(ensure_list(container, "env"), dict(item))
        upsert_volume_mount(ensure_list(container, "volumeMounts"),
                            {"name": VOLUME, "mountPath": MOUNT_PATH, "readOnly": True})
    trainer_set.upsert_volume({"name": VOLUME, "projected": {"sources": [
        {"serviceAccountToken": {"audience": token_audience(ctx.namespace, ctx.name),
                                 "expirationSeconds": TOKEN_EXPIRATION_SECONDS, "path": TOKEN_FILE}},
        {"configMap": {"name": f"{ctx.name}{CONFIGMAP_SUFFIX}", "items": [{"key": CA_KEY, "path": CA_KEY}]}},
    ]}})


def _build(endpoint: StatusEndpoint, ctx: PlanContext) -> list[dict[str, Any]]:
    return [{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{ctx.name}{CONFIGMAP_SUFFIX}", "namespace": ctx.namespace,
                     "ownerReferences": [ctx.owner_reference()]},
        "data": {CA_KEY: endpoint.ca_pem},
    }]


def plugin(endpoint: StatusEndpoint) -> Plugin:
    return Plugin(name="TrainJobStatus", enforce_ml_policy=partial(_enforce, endpoint),
                  build=partial(_build, endpoint), children=CHILDREN)


def with_trainjob_status(plugins: Sequence[Plugin], endpoint: StatusEndpoint) -> tuple[Plugin, ...]:
    """``plugins`` with TrainJobStatus before the JobSet builder (its ConfigMap is planned
    before the JobSet whose pods mount it)."""
    listed = list(plugins)
    at = next((i for i, p in enumerate(listed) if p.name == "JobSet"), len(listed))
    return tuple(listed[:at] + [plugin(endpoint)] + listed[at:])
