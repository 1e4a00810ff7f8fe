"""The ``serviceaccounts/token`` subresource (TokenRequest, ``kubectl create token``), as
kube-apiserver serves it: a token signed by the cluster's ServiceAccount issuer
(``serviceaccount_issuer.py``), bound to an object when the request asks.
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from trainyard.apimachinery import serviceaccount_tokens as sat

from .. import errors
from ..registry.kinds import Registry
from ..registry.store import Api
from ..serviceaccount_issuer import ServiceAccountIssuer

TOKEN_REQUEST_KIND = "TokenRequest"
TOKEN_REQUEST_API_VERSION = "authentication.k8s.io/v1"


class TokenRequests:
    def __init__(self, issuer: ServiceAccountIssuer) -> None:
        self._issuer = issuer

    def token_request(self, api: Api, registry: Registry, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """Answer ``POST .../serviceaccounts/<name>/token``: the TokenRequest with its status."""
        accounts = registry.lookup("", "v1", "serviceaccounts")
        assert accounts is not None
        account = api.get(accounts, namespace, name)  # 404 as kube-apiserver when it does not exist
        if not isinstance(body, dict) or body.get("kind") not in (None, TOKEN_REQUEST_KIND):
            raise errors.bad_request(f"the body of a {TOKEN_REQUEST_KIND} must be a {TOKEN_REQUEST_KIND} object")
        if body.get("spec") is not None and not isinstance(body["spec"], dict):
            raise errors.invalid(f"{TOKEN_REQUEST_KIND}.authentication.k8s.io", name, "authentication.k8s.io",
                                 TOKEN_REQUEST_KIND, [errors.field_cause("spec", "FieldValueInvalid",
                                                                         "Invalid value: must be an object")])
        spec = dict(body.get("spec") or {})
        spec.setdefault("expirationSeconds", sat.DEFAULT_EXPIRATION_SECONDS)
        if not spec.get("audiences"):
            spec["audiences"] = [self._issuer.issuer]  # the API server's own audience, as its default
        problems = sat.request_errors(spec)
        if problems:
            raise errors.invalid(f"{TOKEN_REQUEST_KIND}.authentication.k8s.io", name, "authentication.k8s.io",
                                 TOKEN_REQUEST_KIND,
                                 [errors.field_cause(field, "FieldValueInvalid", message) for field, message in problems])
        bound = self._bound_object(api, registry, namespace, spec.get("boundObjectRef"))
        now = int(time.time())
        token = sat.issue(self._issuer.key, issuer=self._issuer.issuer, namespace=namespace, service_account=name,
                          service_account_uid=str((account.get("metadata") or {}).get("uid", "")),
                          audiences=list(spec["audiences"]), expiration_seconds=int(spec["expirationSeconds"]),
                          now=now, bound=bound)
        expires = datetime.fromtimestamp(now + int(spec["expirationSeconds"]), timezone.utc)
        return {"kind": TOKEN_REQUEST_KIND, "apiVersion": TOKEN_REQUEST_API_VERSION,
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": None},
                "spec": spec,
                "status": {"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ")}}

    @staticmethod
    def _bound_object(api: Api, registry: Registry, namespace: str, ref: Any) -> sat.BoundObject | None:
        if not isinstance(ref, dict):
            return None
        kind, name = ref["kind"], ref["name"]
        resource = {"Pod": "pods", "Secret": "secrets", "Node": "nodes"}[kind]
        rt = registry.lookup("", "v1", resource)
        assert rt is not None
        found = api.get(rt, namespace if rt.namespaced else None, name)
        uid = str((found.get("metadata") or {}).get("uid", ""))
        if ref.get("uid") and ref["uid"] != uid:
            raise errors.conflict(rt.qualified_resource, name, rt.group, rt.resource,
                                  f"the UID in the bound object reference ({ref['uid']}) does not match the UID in "
                                  "record. The object might have been deleted and then recreated")
        return sat.BoundObject(kind, name, uid)
