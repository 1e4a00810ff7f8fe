"""The Flux CURVE certificate (v2.3.0 Flux plugin): an X25519 key pair in ZeroMQ's form.

Flux brokers authenticate each other over ZeroMQ CURVE with one certificate shared by every
node of a TrainJob. Upstream derives the key from the TrainJob's UID; trainyard draws it at
random once, like the MPI SSH key, and keeps the Secret that holds it (docs/compatibility.md
B6). Like the SSH key, it never travels on the bus: the planner plans the Secret without data
(:func:`deferred_curve_key`) and the applier writes the certificate (:mod:`.ssh_keys`).
"""
from __future__ import annotations

from typing import Callable

CurveKeyFactory = Callable[[], tuple[bytes, bytes]]

# ZeroMQ RFC 32 (Z85): 85 printable characters, 4 bytes to 5 characters, big endian.
Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_encode(data: bytes) -> str:
    """Z85 text of ``data``; "" when its length is not a multiple of 4 (as upstream's encoder)."""
    if len(data) % 4:
        return ""
    out: list[str] = []
    for start in range(0, len(data), 4):
        value = int.from_bytes(data[start:start + 4], "big")
        chunk = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            chunk.append(Z85_ALPHABET[digit])
        out.extend(reversed(chunk))
    return "".join(out)


def new_curve_key_pair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair: (32 secret bytes, 32 public bytes)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    secret = key.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(raw, serialization.PublicFormat.Raw)
    return secret, public


def deferred_curve_key() -> tuple[bytes, bytes]:
    """The key factory for planning that leaves the certificate to the writer."""
    return b"", b""


def curve_certificate(name: str, secret: bytes, public: bytes) -> str:
    """The certificate file ``flux keygen`` writes (CZMQ zcert text: the ``metadata`` and
    ``curve`` sections, keys in Z85, four-space indents), named after the TrainJob."""
    return (
        "#   ZeroMQ CURVE **Secret** Certificate\n"
        "#   Written by trainyard for the Flux brokers of one TrainJob.\n"
        "\n"
        "metadata\n"
        f'    name = "{name}"\n'
        "curve\n"
        f'    public-key = "{z85_encode(public)}"\n'
        f'    secret-key = "{z85_encode(secret)}"\n'
    )
