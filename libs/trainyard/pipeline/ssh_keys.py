"""The MPI SSH key pair and the Flux CURVE certificate: the random inputs of planning (spec §4.4.2).

Key material never travels on the bus (docs/security.md): the planner plans the Secret with
:func:`deferred_ssh_key` (:func:`.curve_keys.deferred_curve_key` for Flux) and
:func:`defer_generated_secrets`, which leave out ``data`` and mark the Secret with
:data:`GENERATE_ANNOTATION`; the applier, which writes it to the API server, fills the data
in with :func:`materialize` right before the apply, and keeps a generated Secret that already
exists. The Secret that lands in the cluster is upstream's: same name, type, immutability,
owner and keys.
"""
from __future__ import annotations

from trainyard.api import constants as c

import base64
from copy import deepcopy
from typing import Any, Callable


# Marks a planned Secret whose data the writer generates (the annotation never reaches the cluster).
GENERATE_ANNOTATION = "trainyard.kubeflow.org/generate"
GENERATE_MPI_SSH_KEY = "mpi-ssh-key"
GENERATE_FLUX_CURVE = "flux-curve-certificate"


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
        and obj.get("type") == c.MPI_SSH_SECRET_TYPE \
        and str((obj.get("metadata") or {}).get("name", "")).endswith(c.MPI_SSH_AUTH_SECRET_SUFFIX)


def _is_flux_curve_secret(obj: dict[str, Any]) -> bool:
    return obj.get("apiVersion") == "v1" and obj.get("kind") == "Secret" and "type" not in obj \
        and str((obj.get("metadata") or {}).get("name", "")).endswith(c.FLUX_CURVE_SECRET_SUFFIX) \
        and set(obj.get("data") or {}) == {c.FLUX_CURVE_CERT_KEY}


def defer_generated_secrets(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Objects planned with :func:`deferred_ssh_key` and ``deferred_curve_key``, with each MPI
    SSH Secret's and Flux CURVE Secret's empty data replaced by the generate mark: what is
    published carries no key material."""
    out: list[dict[str, Any]] = []
    for obj in objects:
        data = obj.get("data") or {}
        mark = GENERATE_MPI_SSH_KEY if _is_mpi_ssh_secret(obj) else \
            GENERATE_FLUX_CURVE if _is_flux_curve_secret(obj) else None
        if mark is not None and not any(data.values()):
            obj = deepcopy(obj)
            obj.pop("data", None)
            obj["metadata"].setdefault("annotations", {})[GENERATE_ANNOTATION] = mark
        out.append(obj)
    return out


def needs_generation(obj: dict[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("annotations") or {}).get(GENERATE_ANNOTATION) is not None


def materialize(obj: dict[str, Any], new_key: Callable[[], tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    """The Secret as upstream writes it: the mark removed, a fresh key pair as its data
    (``new_key`` defaults to the pair the mark names). Raises ValueError for a mark this
    release does not know."""
    from .curve_keys import curve_certificate, new_curve_key_pair

    what = obj["metadata"]["annotations"][GENERATE_ANNOTATION]
    is_ssh = what == GENERATE_MPI_SSH_KEY and _is_mpi_ssh_secret(obj)
    # The planned Flux Secret has no data left to recognise it by: name and absent type.
    is_curve = what == GENERATE_FLUX_CURVE and obj.get("kind") == "Secret" and "type" not in obj \
        and str(obj["metadata"].get("name", "")).endswith(c.FLUX_CURVE_SECRET_SUFFIX)
    if not (is_ssh or is_curve):
        raise ValueError(f"cannot generate {what!r} for {obj.get('kind')} {obj['metadata'].get('name')}")
    obj = deepcopy(obj)
    annotations = obj["metadata"]["annotations"]
    del annotations[GENERATE_ANNOTATION]
    if not annotations:
        del obj["metadata"]["annotations"]
    if is_curve:
        secret, public = (new_key or new_curve_key_pair)()
        trainjob = str(obj["metadata"]["name"])[: -len(c.FLUX_CURVE_SECRET_SUFFIX)]
        text = curve_certificate(trainjob, secret, public)
        obj["data"] = {c.FLUX_CURVE_CERT_KEY: base64.b64encode(text.encode()).decode("ascii")}
        return obj
    private_key, public_key = (new_key or new_ssh_key_pair)()
    obj["data"] = {
        c.MPI_SSH_PRIVATE_KEY: base64.b64encode(private_key).decode("ascii"),
        c.MPI_SSH_PUBLIC_KEY: base64.b64encode(public_key).decode("ascii"),
    }
    return obj
