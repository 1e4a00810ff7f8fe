"""The MPI SSH key pair: the one random input of planning (spec §4.4.2)."""
from __future__ import annotations


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
