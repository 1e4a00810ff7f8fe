"""Torch: node count, PET_* env, rendezvous port, TorchTune mode (spec §4.2, §4.3)."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import Any

from .. import names
from ..documents import ensure_list, items, mapping
from ..errors import FieldError, invalid
from ..framework import PlanContext, Plugin, ValidationContext, Verdict
from trainyard.apimachinery.quantity import QuantityError
from ..resources import cpu_count, gpu_count
from ..upsert import api_env_var, upsert_env, upsert_port
from . import torchtune
from .shared import effective_resources_per_node, is_int, master_address


def resolve_num_proc_per_node(raw: Any, resources: dict[str, Any] | None) -> int | str:
    """``cpu``/``auto`` without GPUs -> max(1, cpu count); ``auto`` with GPUs and ``gpu``
    stay strings; integers pass through unchanged."""
    if is_int(raw):
        return int(raw)
    gpus = gpu_count(resources)
    cpus = cpu_count(resources)
    if raw == "cpu" or (raw == "auto" and gpus == 0):
        return max(1, cpus)
    return str(raw)


def enforce_ml_policy(ctx: PlanContext) -> None:
    torch_policy = ctx.info.torch_policy
    if torch_policy is None:
        return
    trainer = ctx.trainer
    trainer_set = ctx.info.pod_set_by_ancestor(names.ANCESTOR_TRAINER)
    if trainer_set is not None and trainer is not None and is_int(trainer.get("numNodes")):
        trainer_set.count = int(trainer["numNodes"])
    raw = (trainer or {}).get("numProcPerNode")
    if raw is None:
        raw = torch_policy.get("numProcPerNode", "auto")
    resources = effective_resources_per_node(ctx.trainjob, ctx.info)
    nproc = resolve_num_proc_per_node(raw, resources)
    if trainer is None or trainer_set is None:
        return
    container = trainer_set.container(names.NODE)
    if container is None:
        return
    env = ensure_list(container, "env")
    for entry in items(trainer.get("env")):
        if isinstance(entry, dict):
            upsert_env(env, api_env_var(entry))
    upsert_env(env, {"name": names.ENV_NNODES, "value": str(trainer_set.count)})
    upsert_env(env, {"name": names.ENV_NPROC_PER_NODE, "value": str(nproc)})
    upsert_env(env, {"name": names.ENV_NODE_RANK,
                     "valueFrom": {"fieldRef": {"fieldPath": names.JOB_COMPLETION_INDEX_FIELD_PATH}}})
    if torchtune.is_torchtune(trainer):
        ctx.info.torchtune_command = torchtune.mutated_command(ctx, trainer_set.count, nproc, resources)
    else:
        upsert_env(env, {"name": names.ENV_MASTER_ADDR, "value": master_address(ctx.name)})
        upsert_env(env, {"name": names.ENV_MASTER_PORT, "value": str(names.CONTAINER_TRAINER_PORT)})
    upsert_port(ensure_list(container, "ports"), {"containerPort": names.CONTAINER_TRAINER_PORT})


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None or ctx.info.torch_policy is None or ctx.trainer is None:
        return verdict
    trainer = ctx.trainer
    raw = trainer.get("numProcPerNode")
    if raw is None:
        return verdict
    if isinstance(raw, str) and raw not in names.TORCH_NPROC_KEYWORDS:
        verdict.errors.append(invalid("spec.trainer.numProcPerNode", raw,
                                      c.ERR_TORCH_NUM_PROC_PER_NODE))
    reserved = sorted({str(e.get("name")) for e in items(trainer.get("env"))
                       if isinstance(e, dict) and e.get("name") in names.TORCH_RESERVED_ENVS})
    if reserved:
        verdict.errors.append(invalid("spec.trainer.env", trainer.get("env"),
                                      f"{c.ERR_TORCH_RESERVED_ENVS}[{' '.join(reserved)}]"))
    if torchtune.is_torchtune(trainer):
        verdict.errors.extend(_torchtune_errors(ctx))
    return verdict


def _torchtune_errors(ctx: ValidationContext) -> list[FieldError]:
    try:
        return torchtune.validate(ctx)
    except QuantityError as err:
        return [invalid("spec.trainer.resourcesPerNode", mapping(ctx.trainer).get("resourcesPerNode"), str(err))]


PLUGIN = Plugin(name="Torch", enforce_ml_policy=enforce_ml_policy, validate=validate)
