"""Torch: node count, PET_* env, rendezvous port, TorchTune mode (spec §4.2, §4.3)."""
from __future__ import annotations

from trainyard.api import constants as c

from typing import Any

from .. import elastic
from ..documents import dig, ensure_list, ensure_mapping, items, mapping
from ..errors import FieldError, PlanningError, invalid
from ..framework import ChildKind, PlanContext, Plugin, ValidationContext, Verdict
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
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    if trainer_set is not None and trainer is not None and is_int(trainer.get("numNodes")):
        trainer_set.count = int(trainer["numNodes"])
    raw = (trainer or {}).get("numProcPerNode")
    if raw is None:
        raw = torch_policy.get("numProcPerNode", "auto")
    resources = effective_resources_per_node(ctx.trainjob, ctx.info)
    nproc = resolve_num_proc_per_node(raw, resources)
    count = trainer_set.count if trainer_set is not None else 1
    pet_envs = [
        {"name": c.ENV_PET_NNODES, "value": str(count)},
        {"name": c.ENV_PET_NPROC_PER_NODE, "value": str(nproc)},
        {"name": c.ENV_PET_NODE_RANK, "valueFrom": {"fieldRef": {"fieldPath": c.JOB_COMPLETION_INDEX_FIELD_PATH}}},
    ]
    master_envs = [
        {"name": c.ENV_PET_MASTER_ADDR, "value": master_address(ctx.name)},
        {"name": c.ENV_PET_MASTER_PORT, "value": str(c.CONTAINER_TRAINER_PORT)},
    ]
    elastic_policy = elastic.policy_of({"mlPolicy": {"torch": torch_policy}})
    if elastic_policy is not None and trainer_set is not None:
        # Elastic (issue #17): torchrun's own rendezvous replaces the fixed rank and master.
        found = elastic.bounds(elastic_policy, count)
        assert found is not None  # count is always known here
        pet_envs = elastic.torchrun_env(ctx.name, elastic.rendezvous_id(ctx.trainjob), found, nproc,
                                        master_address(ctx.name))
        master_envs = []
        _make_elastic(ctx, trainer_set, found)
    container = trainer_set.container(c.NODE) if trainer is not None and trainer_set is not None else None
    if container is not None:
        env = ensure_list(container, "env")
        for entry in items(trainer.get("env")):
            if isinstance(entry, dict):
                upsert_env(env, api_env_var(entry))
        for entry in pet_envs:
            upsert_env(env, entry)
        if torchtune.is_torchtune(trainer) and elastic_policy is None:
            ctx.info.torchtune_command = torchtune.mutated_command(ctx, count, nproc, resources)
        else:
            for entry in master_envs:
                upsert_env(env, entry)
        upsert_port(ensure_list(container, "ports"), {"containerPort": c.CONTAINER_TRAINER_PORT})
    # v2.3.0 envInjection: the same PET_* variables, master address included (sidecars and init
    # containers use it for preflight checks even under TorchTune), whether or not the TrainJob
    # has a trainer section.
    for job_name, container_name in env_injection_targets(torch_policy):
        target = _container_in_job(ctx.info, job_name, container_name)
        if target is None:
            raise PlanningError(envinjection_missing_message(job_name, container_name))
        target_env = ensure_list(target, "env")
        for entry in pet_envs + master_envs:
            upsert_env(target_env, dict(entry))


def _make_elastic(ctx: PlanContext, trainer_set: Any, found: elastic.Bounds) -> None:
    """Fault tolerance of an elastic trainer: torchrun's restart budget is final. The pod never
    restarts in place (a fresh torchrun would get a fresh budget), a pod lost to a signal is
    replaced by the Job (up to maxRestarts times), any other failure fails the Job at once, and no
    JobSet failurePolicy recreates every pod. Gang scheduling admits minNodes pods."""
    trainer_set.min_count = found.min_nodes
    trainer_set.pod_spec["restartPolicy"] = "Never"
    job_spec = ensure_mapping(ensure_mapping(trainer_set.job, "template"), "spec")
    job_spec["backoffLimit"] = found.max_restarts or 0
    job_spec["podFailurePolicy"] = elastic.pod_failure_policy()
    ctx.info.jobset_spec.pop("failurePolicy", None)
    ctx.info.annotations[elastic.ANNOTATION_ELASTIC] = elastic.annotation_value(found)


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    """The HorizontalPodAutoscaler of an elastic TrainJob whose policy has metrics."""
    torch_policy = ctx.info.torch_policy
    policy = elastic.policy_of({"mlPolicy": {"torch": torch_policy}}) if torch_policy is not None else None
    if policy is None or not items(policy.get("metrics")):
        return []
    trainer_set = ctx.info.pod_set_by_ancestor(c.ANCESTOR_TRAINER)
    count = trainer_set.count if trainer_set is not None else 1
    found = elastic.bounds(policy, count)
    assert found is not None
    return [elastic.hpa_document(ctx.trainjob, found, items(policy.get("metrics")), ctx.owner_reference())]


def env_injection_targets(torch_policy: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(mapping(t).get("jobName")), str(name))
            for t in items(dig(torch_policy, "envInjection", "targets"))
            for name in items(mapping(t).get("containerNames"))]


def envinjection_missing_message(job_name: str, container_name: str) -> str:
    return f'envInjection target podSet "{job_name}" container "{container_name}" not found in runtime template'


def _container_in_job(info: Any, job_name: str, container_name: str) -> dict[str, Any] | None:
    """A container of the named job, else an init container of it (upstream's lookup order)."""
    pod_set = info.pod_set_by_name(job_name)
    if pod_set is None:
        return None
    found = pod_set.container(container_name)
    if found is not None:
        return found
    return next((c for c in items(pod_set.pod_spec.get("initContainers"))
                 if isinstance(c, dict) and c.get("name") == container_name), None)


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None or ctx.info.torch_policy is None:
        return verdict
    for target in items(dig(ctx.info.torch_policy, "envInjection", "targets")):
        for name in items(mapping(target).get("containerNames")):
            job_name = str(mapping(target).get("jobName"))
            if _container_in_job(ctx.info, job_name, str(name)) is None:
                verdict.errors.append(invalid("spec.runtimeRef", target,
                                              envinjection_missing_message(job_name, str(name))))
    if ctx.trainer is None:
        return verdict
    trainer = ctx.trainer
    raw = trainer.get("numProcPerNode")
    # v2.1.0 checked the rest only with numProcPerNode set; v2.3.0 checks it for every trainer.
    if isinstance(raw, str) and raw not in c.TORCH_NUM_PROC_PER_NODE_KEYWORDS:
        verdict.errors.append(invalid("spec.trainer.numProcPerNode", raw,
                                      c.ERR_TORCH_NUM_PROC_PER_NODE))
    reserved = sorted({str(e.get("name")) for e in items(trainer.get("env"))
                       if isinstance(e, dict) and e.get("name") in c.TORCH_RESERVED_ENV_NAMES})
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


PLUGIN = Plugin(name="Torch", enforce_ml_policy=enforce_ml_policy, build=build, validate=validate,
                children=(ChildKind("autoscaling/v2", "HorizontalPodAutoscaler"),))  # elastic with metrics
