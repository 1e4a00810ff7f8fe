"""The plugin registry: one line per plugin.

This order is the order inside every phase (upstream iterates a Go map, so its order is
random): ML policy plugins run before the JobSet plugin reads their results, and builders
emit PodGroups, then the MPI Secret and ConfigMap, the Flux ConfigMap and Secret, then the
JobSet, so that what the JobSet's Pods reference exists first when the objects are applied in
plan order.
"""
from __future__ import annotations

from ..framework import ChildKind, Plugin, child_kinds
from . import coscheduling, flux, jax, jobset, mpi, plainml, torch, trainjobstatus, volcano, xgboost

REGISTRY: tuple[Plugin, ...] = (
    coscheduling.PLUGIN,
    volcano.PLUGIN,
    torch.PLUGIN,
    mpi.PLUGIN,
    jax.PLUGIN,
    # PlainML before XGBoost: the trainer's env first, then the framework's (as Torch does).
    plainml.PLUGIN,
    xgboost.PLUGIN,
    flux.PLUGIN,
    jobset.PLUGIN,
)

# What a TrainJob may own: the children of every plugin, the feature-gated TrainJobStatus's too.
CHILD_KINDS: tuple[ChildKind, ...] = child_kinds(REGISTRY) + trainjobstatus.CHILDREN
