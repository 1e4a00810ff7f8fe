"""JAX (v2.3.0): one JAX process per node, coordinated by the first node's pod."""
from __future__ import annotations

from trainyard.api import constants as c

from ..documents import ensure_list, mapping
from ..framework import PlanContext, Plugin
from ..upsert import upsert_env, upsert_port
from .shared import is_int, master_address


def enforce_ml_policy(ctx: PlanContext) -> None:
    if mapping(ctx.info.ml_policy).get("jax") is None:
        return
    trainer = ctx.trainer
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    if trainer_set is not None and trainer is not None and is_int(trainer.get("numNodes")):
        trainer_set.count = int(trainer["numNodes"])
    if trainer is None or trainer_set is None:
        return
    container = trainer_set.container(c.NODE)
    if container is None:
        return
    # The runtime's trainer env is applied by the JobSet builder (PlainML does not run for JAX).
    env = ensure_list(container, "env")
    upsert_env(env, {"name": c.ENV_JAX_NUM_PROCESSES, "value": str(trainer_set.count)})
    upsert_env(env, {"name": c.ENV_JAX_PROCESS_ID,
                     "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD_PATH}}})
    upsert_env(env, {"name": c.ENV_JAX_COORDINATOR_ADDRESS,
                     "value": f"{master_address(ctx.name)}:{c.CONTAINER_TRAINER_PORT}"})
    upsert_port(ensure_list(container, "ports"), {"containerPort": c.CONTAINER_TRAINER_PORT})


PLUGIN = Plugin(name="JAX", enforce_ml_policy=enforce_ml_policy)
