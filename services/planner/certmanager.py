"""Keeps the webhook certificate valid and the webhook configuration's caBundle current.

The certificate lives in Secret ``kubeflow-trainer-webhook-cert`` (namespace from
``--webhook-namespace``) so all planner replicas serve one certificate. Every check interval
each replica re-reads the Secret: a rotation made by another replica is loaded; a certificate in
the last fifth of its life is rotated here (optimistic concurrency on the Secret decides which
replica wins). The ValidatingWebhookConfiguration (and, at the v2.3 level, v2.3.0's
MutatingWebhookConfiguration) is server-side applied after every change.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from trainyard.compat import DEFAULT_COMPAT, TrainerCompat
from trainyard.errortext import describe
from trainyard.kube import resources as r
from trainyard.kube.client import KubeClient, KubeError
from trainyard.kube.resources import Resource
from trainyard.pipeline.defaulting import DEFAULTER_CONFIGURATION

from trainyard_services.planner import certs
from trainyard_services.planner.webhook import TlsFiles, mutating_webhook_configuration, webhook_configuration

log = logging.getLogger(__name__)

NAMESPACE = Resource("", "v1", "namespaces", "Namespace", False)
WEBHOOK_FIELD_MANAGER = "trainyard-planner"


class CertManager:
    def __init__(self, kube: KubeClient, tls: TlsFiles, *, namespace: str, hosts: list[str],
                 url_base: str | None, service: tuple[str, str] | None,
                 check_interval_s: float = 60.0, compat: TrainerCompat = DEFAULT_COMPAT) -> None:
        self._kube = kube
        self._compat = compat
        self._tls = tls
        self._namespace = namespace
        self._hosts = hosts
        self.url_base = url_base
        self._service = service
        self._interval = check_interval_s
        self.current: certs.CertBundle | None = None
        self.ready = False

    async def ensure(self) -> certs.CertBundle:
        """Loads or creates/rotates the certificate; writes the TLS files; applies the VWC
        (every time: a configuration someone deleted or edited is put back)."""
        for _ in range(5):
            secret = await self._kube.get(r.SECRET, self._namespace, certs.SECRET_NAME)
            bundle = certs.from_secret_data((secret or {}).get("data") or {})
            if bundle is not None and not certs.needs_rotation(bundle, self._hosts):
                break
            fresh = certs.issue(self._hosts, previous=bundle)
            try:
                await self._store(secret, fresh)
                bundle = fresh
                log.info("webhook certificate issued", extra={"not_after": str(fresh.not_after)})
                break
            except KubeError as err:
                if not err.conflict:
                    raise
                log.info("another planner rotated the certificate first; reloading")
        else:
            raise RuntimeError("could not settle the webhook certificate Secret")
        if self.current is None or bundle.cert_pem != self.current.cert_pem:
            self._tls.write(bundle.cert_pem, bundle.key_pem)
        await self._kube.apply(
            webhook_configuration(bundle.ca_bundle_pem, url_base=self.url_base, service=self._service),
            field_manager=WEBHOOK_FIELD_MANAGER,
        )
        if self._compat.v2_3:
            await self._kube.apply(
                mutating_webhook_configuration(bundle.ca_bundle_pem, url_base=self.url_base, service=self._service),
                field_manager=WEBHOOK_FIELD_MANAGER,
            )
        elif self.current is None:
            # v2.1.0 has no mutating webhook. One left by an earlier v2.3 run is never updated
            # again, so once the planner's address or certificate changes (a new port, a rotated
            # CA) its failurePolicy Fail rejects every TrainJob write.
            try:
                if await self._kube.delete(r.MUTATING_WEBHOOK_CONFIGURATION, None, DEFAULTER_CONFIGURATION):
                    log.info("removed the v2.3 TrainJob defaulter webhook configuration",
                             extra={"configuration": DEFAULTER_CONFIGURATION})
            except KubeError as err:
                if err.status != 403:
                    raise
                log.warning("cannot remove the v2.3 TrainJob defaulter webhook configuration %s: %s "
                            "(the planner's role needs 'delete' on it)", DEFAULTER_CONFIGURATION, describe(err))
        self.current = bundle
        self.ready = True
        return bundle

    async def _store(self, existing: dict[str, Any] | None, bundle: certs.CertBundle) -> None:
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": certs.SECRET_NAME, "namespace": self._namespace},
            "data": certs.to_secret_data(bundle),
        }
        if existing is None:
            try:
                await self._kube.create(r.SECRET, self._namespace, body)
            except KubeError as err:
                if not err.not_found:
                    raise
                await self._create_namespace()
                await self._kube.create(r.SECRET, self._namespace, body)
            return
        body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        await self._kube.request("PUT", r.SECRET.path(self._namespace, certs.SECRET_NAME), body=body)

    async def _create_namespace(self) -> None:
        try:
            await self._kube.create(NAMESPACE, None, {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": self._namespace}})
        except KubeError as err:
            if not err.conflict:
                raise

    async def run(self, stop: asyncio.Event) -> None:
        """Re-checks every interval until ``stop``; errors are logged and retried."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self._interval)
                return
            except asyncio.TimeoutError:
                pass
            try:
                await self.ensure()
            except Exception as err:
                log.warning("certificate check failed: %s", describe(err))
