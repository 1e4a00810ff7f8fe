"""Authentication of the devcluster API server: who a request's bearer token says it is.

- The kubeconfig's token (``pki/token``) is the administrator ``devcluster-admin`` in group
  ``system:masters`` (allowed everything, as kube-apiserver's privileged group).
- The in-process data plane's token (``pki/controllers-token``, its own kubeconfig
  ``pki/controllers.kubeconfig``) is ``system:devcluster-controllers``, also in
  ``system:masters``: the JobSet/Job controllers, scheduler and kubelet do what
  kube-controller-manager, kube-scheduler and the kubelets do on a real cluster.
- A ServiceAccount token (TokenRequest, ``kubectl create token``, a projected volume) signed by
  this server's key, issued by it, for its own audience (the issuer URL, kube-apiserver's
  default ``--api-audiences``), not expired, whose ServiceAccount (and bound Pod or Secret) still
  exists with the same uid, is ``system:serviceaccount:<ns>:<name>`` in groups
  ``system:serviceaccounts``, ``system:serviceaccounts:<ns>`` and ``system:authenticated``.

Anything else is 401 ``Unauthorized``, kube-apiserver's answer (anonymous requests are not
authenticated: as ``--anonymous-auth=false``; the public paths /healthz, /readyz, /livez,
/version and the issuer's discovery documents are served before authentication).
"""
from __future__ import annotations

import hmac
import secrets
import time
from pathlib import Path
from typing import Any

from trainyard.apimachinery import rbac
from trainyard.apimachinery import serviceaccount_tokens as sat
from trainyard.security.pki import write_private

from .. import errors
from ...storage.datadir import PKI_NAME
from ..registry.kinds import Registry
from ..registry.store import Api
from ..serviceaccount_issuer import ServiceAccountIssuer

ADMIN = rbac.UserInfo("devcluster-admin", (rbac.SYSTEM_MASTERS, rbac.AUTHENTICATED))
CONTROLLERS = rbac.UserInfo("system:devcluster-controllers", (rbac.SYSTEM_MASTERS, rbac.AUTHENTICATED))
CONTROLLERS_TOKEN_FILE = "controllers-token"
CONTROLLERS_KUBECONFIG = "controllers.kubeconfig"
_CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"


def ensure_controllers_token(data_dir: Path) -> str:
    """The data plane's token, made once per data dir (0600)."""
    path = data_dir / PKI_NAME / CONTROLLERS_TOKEN_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_private(path, secrets.token_urlsafe(32).encode())
    return path.read_text().strip()


class Authenticator:
    def __init__(self, admin_token: str, controllers_token: str, tokens: ServiceAccountIssuer, api: Api,
                 registry: Registry) -> None:
        self._static = [(admin_token.encode(), ADMIN), (controllers_token.encode(), CONTROLLERS)]
        self.tokens = tokens
        self.api = api
        self.registry = registry
        # token -> its verified claims: the signature is checked once per token (kube-apiserver
        # caches token authentication too); expiry and the ServiceAccount's existence are
        # checked on every request.
        self._verified: dict[str, dict[str, Any]] = {}

    def authenticate(self, authorization: str | None) -> rbac.UserInfo:
        """The user of an ``Authorization: Bearer <token>`` header; 401 when there is none or it
        does not authenticate."""
        if not authorization or not authorization.startswith("Bearer "):
            raise errors.unauthorized()
        token = authorization[7:].strip()
        raw = token.encode()
        for known, user in self._static:
            if hmac.compare_digest(raw, known):
                return user
        if token.count(".") == 2:
            user = self._service_account(token)
            if user is not None:
                return user
        raise errors.unauthorized()

    def _service_account(self, token: str) -> rbac.UserInfo | None:
        issuer = self.tokens.issuer
        now = int(time.time())
        claims = self._verified.get(token)
        if claims is not None and (claims.get("iss") != issuer or now > claims["exp"] + sat.LEEWAY_SECONDS):
            del self._verified[token]
            claims = None
        if claims is None:
            try:
                claims = sat.verify(token, sat.jwks([self.tokens.key]), issuer=issuer, audience=issuer, now=now)
            except sat.TokenError:
                return None
            if len(self._verified) >= 4096:
                self._verified.clear()
            self._verified[token] = claims
        private = claims.get("kubernetes.io")
        if not isinstance(private, dict):
            return None
        account = private.get("serviceaccount") if isinstance(private.get("serviceaccount"), dict) else {}
        namespace, name = private.get("namespace"), account.get("name")
        if not isinstance(namespace, str) or not isinstance(name, str) \
                or claims.get("sub") != rbac.service_account_username(namespace, name):
            return None
        uid = str(account.get("uid") or "")
        if not self._exists("serviceaccounts", namespace, name, uid):
            return None  # deleted (or deleted and re-created) since the token was issued
        extra: dict[str, tuple[str, ...]] = {}
        for kind, resource in (("pod", "pods"), ("secret", "secrets")):
            bound = private.get(kind)
            if isinstance(bound, dict):
                if not self._exists(resource, namespace, str(bound.get("name", "")), str(bound.get("uid") or "")):
                    return None
                if kind == "pod":
                    extra["authentication.kubernetes.io/pod-name"] = (str(bound.get("name", "")),)
                    extra["authentication.kubernetes.io/pod-uid"] = (str(bound.get("uid") or ""),)
        if claims.get("jti"):
            extra[_CREDENTIAL_ID] = (f"JTI={claims['jti']}",)
        return rbac.service_account_user(namespace, name, uid, extra)

    def _exists(self, resource: str, namespace: str, name: str, uid: str) -> bool:
        rt = self.registry.lookup("", "v1", resource)
        if rt is None:
            return False
        stored = self.api.store.get(rt.storage_key, namespace, name)
        if stored is None:
            return False
        if not uid:
            return True
        meta: dict[str, Any] = stored.load().get("metadata") or {}
        return str(meta.get("uid", "")) == uid
