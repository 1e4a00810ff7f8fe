"""MPI (OpenMPI): launcher/node counts, SSH auth Secret, hostfile ConfigMap (spec §4.4)."""
from __future__ import annotations

from trainyard.api import constants as c

import base64
from typing import Any

from ..documents import clone, ensure_list, items
from ..errors import PlanningError, invalid
from ..framework import ChildKind, PlanContext, Plugin, ValidationContext, Verdict
from ..observed import ReadError
from ..resources import gpu_count
from ..upsert import upsert_env, upsert_volume_mount
from .shared import effective_resources_per_node, is_int


def _run_launcher_as_node(mpi: dict[str, Any]) -> bool:
    return mpi.get("runLauncherAsNode") is True


def enforce_ml_policy(ctx: PlanContext) -> None:
    mpi = ctx.info.mpi_policy
    if mpi is None:
        return
    trainer = ctx.trainer or {}
    node_set = ctx.info.pod_set_by_name(c.NODE)
    if is_int(trainer.get("numNodes")) and node_set is not None:
        num_nodes = int(trainer["numNodes"])
        node_set.count = max(num_nodes - 1, 1) if _run_launcher_as_node(mpi) else num_nodes
    slots = _slots(ctx, mpi)
    mpi["numProcPerNode"] = slots  # the info's policy carries the effective value (as upstream)
    # File modes as v2.3.0 sets them (v2.1.0 left them to the volume's default, 0644 for all):
    # the private key readable by its owner and group only (docs/compatibility.md A15).
    ssh_volume = {
        "name": c.MPI_SSH_AUTH_VOLUME_NAME,
        "secret": {
            "secretName": f"{ctx.name}{c.MPI_SSH_AUTH_SECRET_SUFFIX}",
            "defaultMode": c.MPI_SSH_AUTH_DEFAULT_MODE,
            "items": [
                {"key": c.MPI_SSH_PRIVATE_KEY, "path": c.MPI_SSH_PRIVATE_KEY_FILE,
                 "mode": c.MPI_SSH_PRIVATE_KEY_FILE_MODE},
                {"key": c.MPI_SSH_PUBLIC_KEY, "path": c.MPI_SSH_PUBLIC_KEY_FILE,
                 "mode": c.MPI_SSH_PUBLIC_KEY_FILE_MODE},
                {"key": c.MPI_SSH_PUBLIC_KEY, "path": c.MPI_SSH_AUTHORIZED_KEYS_FILE,
                 "mode": c.MPI_SSH_PUBLIC_KEY_FILE_MODE},
            ],
        },
    }
    hostfile_volume = {
        "name": c.MPI_HOSTFILE_VOLUME_NAME,
        "configMap": {
            "name": f"{ctx.name}{c.MPI_HOSTFILE_CONFIGMAP_SUFFIX}",
            "items": [{"key": c.MPI_HOSTFILE_NAME, "path": c.MPI_HOSTFILE_NAME,
                       "mode": c.MPI_HOSTFILE_MODE}],
        },
    }
    mount_path = mpi.get("sshAuthMountPath") or c.DEFAULT_SSH_AUTH_MOUNT_PATH
    for pod_set in ctx.info.pod_sets:
        if pod_set.name not in (c.NODE, c.LAUNCHER):
            continue
        is_launcher = pod_set.name == c.LAUNCHER
        pod_set.upsert_volume(clone(ssh_volume))
        if is_launcher:
            pod_set.upsert_volume(clone(hostfile_volume))
        container = pod_set.container(c.NODE)
        if container is None:
            continue
        mounts = ensure_list(container, "volumeMounts")
        upsert_volume_mount(mounts, {"name": c.MPI_SSH_AUTH_VOLUME_NAME, "mountPath": mount_path})
        if is_launcher:
            upsert_volume_mount(mounts, {"name": c.MPI_HOSTFILE_VOLUME_NAME, "mountPath": c.MPI_HOSTFILE_DIR})
            implementation = mpi.get("mpiImplementation")
            if implementation != c.MPI_IMPLEMENTATION_OPENMPI:
                raise PlanningError(f"MPI implementation for {implementation} doesn't supported")
            env = ensure_list(container, "env")
            upsert_env(env, {"name": c.ENV_OMPI_HOSTFILE, "value": c.MPI_HOSTFILE_PATH})
            upsert_env(env, {"name": c.ENV_OMPI_KEEP_FQDN_HOSTNAMES, "value": "true"})
            upsert_env(env, {"name": c.ENV_OMPI_SET_DEFAULT_SLOTS, "value": str(slots)})
            upsert_env(env, {"name": c.ENV_OMPI_PLM_RSH_ARGS, "value": c.OMPI_PLM_RSH_ARGS_VALUE})


def _slots(ctx: PlanContext, mpi: dict[str, Any]) -> int:
    trainer = ctx.trainer or {}
    if is_int(trainer.get("numProcPerNode")):
        return int(trainer["numProcPerNode"])
    runtime_slots = mpi.get("numProcPerNode")
    runtime_slots = int(runtime_slots) if is_int(runtime_slots) else c.MPI_NUM_PROC_PER_NODE_DEFAULT
    if runtime_slots == 1:
        gpus = gpu_count(effective_resources_per_node(ctx.trainjob, ctx.info))
        if gpus > 1:
            return gpus
    return runtime_slots


def build(ctx: PlanContext) -> list[dict[str, Any]]:
    mpi = ctx.info.mpi_policy
    if mpi is None:
        return []
    objects: list[dict[str, Any]] = []
    secret_name = f"{ctx.name}{c.MPI_SSH_AUTH_SECRET_SUFFIX}"
    try:
        existing = ctx.observed.get("v1", "Secret", ctx.namespace, secret_name)
    except ReadError as err:
        raise PlanningError(str(err)) from None
    if existing is None:
        objects.append(_ssh_secret(ctx, secret_name))
    objects.append(_hostfile_config_map(ctx, mpi))
    return objects


def _ssh_secret(ctx: PlanContext, name: str) -> dict[str, Any]:
    try:
        private_key, public_key = ctx.new_ssh_key()
    except Exception as err:  # key generation failure (cryptography backend)
        raise PlanningError(f"failed to build SSH Auth secret: {err}") from None
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ctx.namespace, "ownerReferences": [ctx.owner_reference()]},
        "type": c.MPI_SSH_SECRET_TYPE,
        "immutable": True,
        "data": {
            c.MPI_SSH_PRIVATE_KEY: base64.b64encode(private_key).decode("ascii"),
            c.MPI_SSH_PUBLIC_KEY: base64.b64encode(public_key).decode("ascii"),
        },
    }


def _hostfile_config_map(ctx: PlanContext, mpi: dict[str, Any]) -> dict[str, Any]:
    slots = mpi.get("numProcPerNode", c.MPI_NUM_PROC_PER_NODE_DEFAULT)
    lines: list[str] = []
    if mpi.get("mpiImplementation") == c.MPI_IMPLEMENTATION_OPENMPI:
        for pod_set in ctx.info.pod_sets:
            is_host = pod_set.name == c.NODE or (
                _run_launcher_as_node(mpi) and pod_set.name == c.LAUNCHER)
            if is_host:
                lines.extend(f"{endpoint} slots={slots}\n" for endpoint in pod_set.endpoints)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{ctx.name}{c.MPI_HOSTFILE_CONFIGMAP_SUFFIX}", "namespace": ctx.namespace,
                     "ownerReferences": [ctx.owner_reference()]},
        "data": {c.MPI_HOSTFILE_NAME: "".join(lines)},
    }


def validate(ctx: ValidationContext) -> Verdict:
    verdict = Verdict()
    if ctx.info is None or ctx.info.mpi_policy is None:
        return verdict
    trainer = ctx.trainer
    if trainer is None:
        return verdict
    raw = trainer.get("numProcPerNode")
    if raw is not None and isinstance(raw, str):
        verdict.errors.append(invalid("spec.trainer.numProcPerNode", raw, c.ERR_MPI_NUM_PROC_PER_NODE))
    num_nodes = trainer.get("numNodes") if is_int(trainer.get("numNodes")) else 1
    job_names = {p.name for p in ctx.info.pod_sets}
    if (num_nodes >= 2 and _run_launcher_as_node(ctx.info.mpi_policy)
            and not {c.LAUNCHER, c.NODE} <= job_names):
        verdict.errors.append(invalid(
            "spec.trainer.numNodes", num_nodes,
            c.ERR_MPI_RUN_LAUNCHER_AS_NODE))
    # v2.3.0: the OpenMPI variables the plugin sets may not come from the TrainJob.
    reserved = sorted({str(e.get("name")) for e in items(trainer.get("env"))
                       if isinstance(e, dict) and e.get("name") in c.MPI_RESERVED_ENVS})
    if reserved:
        verdict.errors.append(invalid("spec.trainer.env", trainer.get("env"),
                                      f"{c.ERR_TORCH_RESERVED_ENVS}[{' '.join(reserved)}]"))
    return verdict


PLUGIN = Plugin(name="MPI", enforce_ml_policy=enforce_ml_policy, build=build, validate=validate,
                children=(ChildKind("v1", "Secret", c.MPI_SSH_AUTH_SECRET_SUFFIX),
                          ChildKind("v1", "ConfigMap", c.MPI_HOSTFILE_CONFIGMAP_SUFFIX)))
