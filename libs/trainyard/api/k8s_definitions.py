"""The pinned Kubernetes OpenAPI definitions (Kubernetes 1.36, from kubernetes-validate).

Loaded once, on first use. Used to inline built-in types into generated CRDs and to reject
unknown fields in strict parsing.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

KUBERNETES_VERSION = "1.36.0"
DEFINITIONS_DIR = f"v{KUBERNETES_VERSION}-local"


@functools.cache
def load_definitions() -> dict[str, dict[str, Any]]:
    """``{"io.k8s.api.core.v1.Container": {...}, ...}`` of the pinned Kubernetes version."""
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema" / DEFINITIONS_DIR
    with (root / "_definitions.json").open("rb") as handle:
        return json.load(handle)["$defs"]


def definition(name: str) -> dict[str, Any]:
    return load_definitions()[name]


def ref_name(ref: str) -> str:
    """``#/$defs/io.k8s.api.core.v1.EnvVar`` -> ``io.k8s.api.core.v1.EnvVar``."""
    return ref.rsplit("/", 1)[-1]
