"""The MPI SSH key pair: the one random input of planning (spec §4.4.2).

The key pair never travels on the bus (docs/security.md): the planner plans the Secret with
:func:`deferred_ssh_key` and :func:`defer_generated_secrets`, which leave out ``data`` and mark
the Secret with :data:`GENERATE_ANNOTATION`; the applier, which writes it to the API server,
fills the data in with :func:`materialize` right before the apply. The Secret that lands in
the cluster is upstream's: same name, type, immutability, owner and keys.
"""
from __future__ import annotations

import base64
from copy import deepcopy
from typing import Any, Callable

from . import names

# Marks a planned Secret whose data the writer generates (the annotation never reaches the cluster).
GENERATE_ANNOTATION = "trainyard.kubeflow.org/generate"
GENERATE_MPI_SSH_KEY = "mpi-ssh-key"


def new_ssh_key_pair() -> tuple[bytes, bytes]:
    """A fresh ECDSA P-521 key: (SEC 1 PEM ``EC PRIVATE KEY``, OpenSSH public key + newline)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP521R1())
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return private_pem, public + b"\n"


def deferred_ssh_key() -> tuple[bytes, bytes]:
    """The key factory for planning that leaves the key to the writer: empty key material."""
    return b"", b""


def _is_mpi_ssh_secret(obj: dict[str, Any]) -> bool:
    return obj.get("apiVersion") == "v1" and obj.get("kind") == "Secret" \
        and obj.get("type") == names.MPI_SECRET_TYPE \
        and str((obj.get("metadata") or {}).get("name", "")).endswith(names.MPI_SSH_AUTH_SUFFIX)


def defer_generated_secrets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Objects planned with :func:`deferred_ssh_key`, with each MPI SSH Secret's empty data
    replaced by the generate mark: what is published carries no key material."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        data = obj.get("data") or {}
        if _is_mpi_ssh_secret(obj) and not any(data.values()):
            obj = deepcopy(obj)
            obj.pop("data", None)
            obj["metadata"].setdefault("annotations", {})[GENERATE_ANNOTATION] = GENERATE_MPI_SSH_KEY
        out.append(obj)
    return out


def needs_generation(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(GENERATE_ANNOTATION) is not None


def materialize(obj: dict[str, Any], new_key: Callable[[], tuple[bytes, bytes]] = new_ssh_key_pair) -> dict[str, Any]:
    """The Secret as upstream writes it: the mark removed, a fresh key pair as its data.
    Raises ValueError for a mark this release does not know."""
    what = obj["metadata"]["annotations"][GENERATE_ANNOTATION]
    if what != GENERATE_MPI_SSH_KEY or not _is_mpi_ssh_secret(obj):
        raise ValueError(f"cannot generate {what!r} for {obj.get('kind')} {obj['metadata'].get('name')}")
    obj = deepcopy(obj)
    annotations = obj["metadata"]["annotations"]
    del annotations[GENERATE_ANNOTATION]
    if not annotations:
        del obj["metadata"]["annotations"]
    private_key, public_key = new_key()
    obj["data"] = {
        names.MPI_SSH_PRIVATE_KEY: base64.b64encode(private_key).decode("ascii"),
        names.MPI_SSH_PUBLIC_KEY: base64.b64encode(public_key).decode("ascii"),
    }
    return obj
