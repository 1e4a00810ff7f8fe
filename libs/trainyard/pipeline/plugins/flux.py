"""Flux Framework (v2.3.0): admission rules only.

Upstream wraps the trainer command in a Flux entrypoint (an init container installs a Flux view,
a ConfigMap carries the scripts, a Secret the CURVE certificate). trainyard does not build those
yet, so a Flux runtime is refused when planning instead of silently running the command without
Flux (docs/compatibility.md B6); admission already follows upstream.
"""
from __future__ import annotations

from .. import names
from ..documents import items, mapping
from ..errors import PlanningError, invalid
from ..framework import PlanContext, Plugin, ValidationContext, Verdict
from .shared import is_int

FLUX_INSTALLER = "flux-installer"
NOT_SUPPORTED = "the Flux ML policy is not supported by trainyard yet"


def _flux_policy(info) -> dict | None:
    flux = mapping(info.ml_policy).get("flux") if info is not None else None
    return flux if isinstance(flux, dict) else None


def enforce_ml_policy(ctx: PlanContext) -> None:
    if _flux_policy(ctx.info) is not None:
        raise PlanningError(NOT_SUPPORTED)


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    policy = _flux_policy(ctx.info)
    if policy is None:
        return verdict
    nproc = mapping(ctx.trainer).get("numProcPerNode", policy.get("numProcPerNode"))
    if is_int(nproc) and nproc < 1:
        verdict.errors.append(invalid("spec.trainer.numProcPerNode", nproc,
                                      "must be greater than or equal to 1 for Flux TrainJob"))
    node = ctx.info.pod_set_by_name(names.NODE)
    if node is not None:
        for init in items(node.pod_spec.get("initContainers")):
            if mapping(init).get("name") == FLUX_INSTALLER:
                verdict.errors.append(invalid("spec.trainer.initContainers", FLUX_INSTALLER,
                                              "InitContainer 'flux-installer' is reserved"))
    return verdict


PLUGIN = Plugin(name="Flux", enforce_ml_policy=enforce_ml_policy, validate=validate)
