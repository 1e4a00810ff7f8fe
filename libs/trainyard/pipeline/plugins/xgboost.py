"""XGBoost (v2.3.0): DMLC_* variables for the collective (Rabit) tracker on the first node.

Workers per node follow the GPUs of the trainer (one per GPU), else one per node; the tracker
listens on the trainer port. PlainML still runs for XGBoost runtimes (node count, trainer env).
"""
from __future__ import annotations

from trainyard.api import constants as c

from ..documents import ensure_list, items, mapping
from ..errors import forbidden
from ..framework import PlanContext, Plugin, ValidationContext, Verdict
from ..resources import gpu_count
from ..upsert import upsert_env, upsert_port
from .shared import effective_resources_per_node, is_int, master_address


def enforce_ml_policy(ctx: PlanContext) -> None:
    if mapping(ctx.info.ml_policy).get("xgboost") is None:
        return
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    if trainer_set is None:
        return
    trainer = ctx.trainer
    if trainer is not None and is_int(trainer.get("numNodes")):
        trainer_set.count = int(trainer["numNodes"])
    if trainer is None:
        return
    container = trainer_set.container(c.NODE)
    if container is None:
        return
    workers_per_node = gpu_count(effective_resources_per_node(ctx.trainjob, ctx.info)) or 1
    env = ensure_list(container, "env")
    upsert_env(env, {"name": c.ENV_XGBOOST_TRACKER_URI, "value": master_address(ctx.name)})
    upsert_env(env, {"name": c.ENV_XGBOOST_TRACKER_PORT, "value": str(c.CONTAINER_TRAINER_PORT)})
    upsert_env(env, {"name": c.ENV_XGBOOST_TASK_ID,
                     "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD_PATH}}})
    upsert_env(env, {"name": c.ENV_XGBOOST_NUM_WORKER, "value": str(trainer_set.count * workers_per_node)})
    upsert_port(ensure_list(container, "ports"), {"containerPort": c.CONTAINER_TRAINER_PORT})


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None or mapping(ctx.info.ml_policy).get("xgboost") is None or ctx.trainer is None:
        return verdict
    for index, entry in enumerate(items(ctx.trainer.get("env"))):
        name = mapping(entry).get("name")
        if name in c.XGBOOST_RESERVED_ENVS:
            verdict.errors.append(forbidden(f"spec.trainer.env[{index}]", f"{name} is reserved for the XGBoost runtime"))
    return verdict


PLUGIN = Plugin(name="XGBoost", enforce_ml_policy=enforce_ml_policy, validate=validate)
