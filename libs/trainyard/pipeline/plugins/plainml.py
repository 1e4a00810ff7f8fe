"""PlainML: node count and trainer env for runtimes without torch/mpi/jax policy (spec §4.5)."""
from __future__ import annotations

from trainyard.api import constants as c

from ..documents import ensure_list, items
from ..framework import PlanContext, Plugin
from ..upsert import api_env_var, upsert_env
from .shared import is_int


def enforce_ml_policy(ctx: PlanContext) -> None:
    # As upstream v2.3.0: PlainML stands aside for torch, mpi and jax, but still runs next to
    # xgboost and flux (node count and trainer env).
    if ctx.info.torch_policy is not None or ctx.info.mpi_policy is not None \
            or (ctx.info.ml_policy or {}).get("jax") is not None:
        return
    trainer = ctx.trainer
    if trainer is None:
        return
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    if trainer_set is None:
        return
    if is_int(trainer.get("numNodes")):
        trainer_set.count = int(trainer["numNodes"])
    container = trainer_set.container(c.NODE)
    if container is not None and trainer.get("env"):
        env = ensure_list(container, "env")
        for entry in items(trainer.get("env")):
            if isinstance(entry, dict):
                upsert_env(env, api_env_var(entry))


PLUGIN = Plugin(name="PlainML", enforce_ml_policy=enforce_ml_policy)
