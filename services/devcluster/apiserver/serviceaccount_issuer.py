"""The ServiceAccount token issuer's identity: its signing key and its URL, with the OIDC
discovery documents (``/.well-known/openid-configuration``, ``/openid/v1/jwks``) that name them.

The signing key is made once per data directory (``sa-signing.key``, 0600) so tokens outlive a
restart; the issuer is the API server's own URL, where its discovery documents are served. The
token subresource signs with it and authentication verifies with it; the token format and checks
are ``trainyard.apimachinery.serviceaccount_tokens``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainyard.apimachinery import serviceaccount_tokens as sat

KEY_FILE = "sa-signing.key"


def load_or_create_key(data_dir: Path) -> sat.SigningKey:
    path = data_dir / KEY_FILE
    if path.exists():
        return sat.SigningKey.from_pem(path.read_bytes())
    key = sat.SigningKey.generate()
    data_dir.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    # Created 0600 from the start: the key signs every token of the cluster.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(key.to_pem())
    os.replace(temporary, path)
    return key


class ServiceAccountIssuer:
    def __init__(self, data_dir: Path) -> None:
        self.key = load_or_create_key(data_dir)
        self.issuer = ""  # set once the server knows its URL

    def discovery(self) -> dict[str, Any]:
        return sat.openid_configuration(self.issuer)

    def jwks(self) -> dict[str, Any]:
        return sat.jwks([self.key])
