"""The runtime info plugins read and mutate (spec §3.4), and how it is built.

Unlike upstream, a PodSet does not hold copies of the containers: it points at the live
Pod spec inside the JobSet spec being built, so plugin upserts land directly in the
document (the result is the same as upstream's copy-then-sync, see docs/pipeline.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainyard.compat import DEFAULT_COMPAT, TrainerCompat

from .documents import clone, dig, ensure_list, ensure_mapping, items, mapping
from .errors import PlanningError
from trainyard.apimachinery.quantity import QuantityError
from trainyard.api import constants
from .resources import Requests, single_pod_requests
from .upsert import upsert_volume

POD_TEMPLATE_TYPE = "io.k8s.api.core.v1.PodTemplateSpec"
JOB_TEMPLATE_TYPE = "io.k8s.api.batch.v1.JobTemplateSpec"


@dataclass
class PodSet:
    name: str
    ancestor: str | None
    count: int
    job: dict[str, Any]  # the replicated job inside the JobSet spec being built
    single_pod_requests: Requests
    replicas: int = 1
    # Elastic trainer (torch elasticPolicy): the fewest pods the job runs with (minNodes), which
    # gang scheduling admits; None: count.
    min_count: int | None = None
    # Set by the PodNetwork phase (JobSet plugin): the host name prefix (up to the replica
    # index) and subdomain.
    endpoint_prefix: str = ""
    subdomain: str = ""

    @property
    def endpoints(self) -> list[str]:
        """Host names of this job's pods (computed on demand, like upstream's lazy list): every
        pod of every replica of the job, as v2.3.0 (v2.1.0 listed replica 0 only)."""
        if not self.subdomain:
            return []
        return [f"{self.endpoint_prefix}{replica}-{index}.{self.subdomain}"
                for replica in range(max(self.replicas, 1)) for index in range(max(self.count, 0))]

    @property
    def pod_spec(self) -> dict[str, Any]:
        job_spec = ensure_mapping(ensure_mapping(self.job, "template"), "spec")
        return ensure_mapping(ensure_mapping(job_spec, "template"), "spec")

    @property
    def containers(self) -> list[dict[str, Any]]:
        return [c for c in items(dig(self.job, "template", "spec", "template", "spec", "containers"))
                if isinstance(c, dict)]

    def container(self, name: str) -> dict[str, Any] | None:
        for container in self.containers:
            if container.get("name") == name:
                return container
        return None

    def upsert_volume(self, volume: dict[str, Any]) -> None:
        upsert_volume(ensure_list(self.pod_spec, "volumes"), volume)


@dataclass
class RuntimeInfo:
    labels: dict[str, str]
    annotations: dict[str, str]
    ml_policy: dict[str, Any] | None
    pod_group_policy: dict[str, Any] | None
    jobset_spec: dict[str, Any]
    pod_sets: list[PodSet]
    pod_labels: dict[str, str] = field(default_factory=dict)
    pod_annotations: dict[str, str] = field(default_factory=dict)
    # Set by Torch in TorchTune mode: the command the JobSet builder writes instead of
    # trainer.command (in memory only; the TrainJob itself is never changed).
    torchtune_command: list[str] | None = None
    # Set by Flux: the entrypoint command that wraps the trainer's; the JobSet builder writes it
    # and leaves the TrainJob's args out (upstream clears them on its in-memory TrainJob).
    flux_command: list[str] | None = None

    @property
    def torch_policy(self) -> dict[str, Any] | None:
        torch = mapping(self.ml_policy).get("torch")
        return torch if isinstance(torch, dict) else None

    @property
    def mpi_policy(self) -> dict[str, Any] | None:
        mpi = mapping(self.ml_policy).get("mpi")
        return mpi if isinstance(mpi, dict) else None

    def pod_set_by_ancestor(self, ancestor: str) -> PodSet | None:
        return next((p for p in self.pod_sets if p.ancestor == ancestor), None)

    def pod_set_by_name(self, name: str) -> PodSet | None:
        return next((p for p in self.pod_sets if p.name == name), None)

    def trainer_container(self) -> dict[str, Any] | None:
        trainer = self.pod_set_by_ancestor(constants.ANCESTOR_TRAINER)
        return trainer.container(constants.NODE) if trainer else None


def merge_pod_template_overrides(jobset_spec: dict[str, Any], overrides: list[Any]) -> None:
    """Strategic-merge each override into the Pod templates of its target jobs (§4.1.2)."""
    if not overrides:
        return
    from trainyard.apimachinery.strategic_merge import strategic_merge_patch

    for override in overrides:
        if not isinstance(override, dict):
            continue
        targets = {t.get("name") for t in items(override.get("targetJobs")) if isinstance(t, dict)}
        patch: dict[str, Any] = {}
        meta = mapping(override.get("metadata"))
        patch_meta = {k: meta[k] for k in ("labels", "annotations") if meta.get(k)}
        if patch_meta:
            patch["metadata"] = patch_meta
        if isinstance(override.get("spec"), dict):
            patch["spec"] = _with_retained_volume_keys(override["spec"])
        if not patch:
            continue
        for job in items(jobset_spec.get("replicatedJobs")):
            if isinstance(job, dict) and job.get("name") in targets:
                job_spec = ensure_mapping(ensure_mapping(job, "template"), "spec")
                template = mapping(job_spec.get("template"))
                try:
                    job_spec["template"] = strategic_merge_patch(template, clone(patch), POD_TEMPLATE_TYPE)
                except Exception as err:  # a malformed patch: upstream fails building the info
                    raise PlanningError(f"failed to merge podTemplateOverrides into job {job.get('name')}: {err}")


def runtime_patch_metadata(patches: list[Any]) -> tuple[dict[str, str], dict[str, str]]:
    """Labels and annotations the runtime patches add to the JobSet, later patches winning."""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    for patch in patches:
        meta = mapping(dig(patch, "trainingRuntimeSpec", "template", "metadata"))
        labels.update(mapping(meta.get("labels")))
        annotations.update(mapping(meta.get("annotations")))
    return labels, annotations


def merge_runtime_patches(jobset_spec: dict[str, Any], patches: list[Any]) -> None:
    """v2.3.0 ``runtimePatches``: each patch in list order, strategic-merged into the Job
    template of the replicated job it names (replicated jobs keep the runtime's order).

    A patch naming a job the runtime does not have is refused at admission; planning skips it
    rather than adding a half-defined job."""
    from trainyard.apimachinery.strategic_merge import strategic_merge_patch

    jobs = {job.get("name"): job for job in items(jobset_spec.get("replicatedJobs")) if isinstance(job, dict)}
    for patch in patches:
        for job_patch in items(dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs")):
            job = jobs.get(mapping(job_patch).get("name"))
            template = _without_nulls(mapping(job_patch).get("template"))
            if job is None or not isinstance(template, dict) or not template:
                continue
            try:
                job["template"] = strategic_merge_patch(mapping(job.get("template")), template, JOB_TEMPLATE_TYPE)
            except Exception as err:  # a malformed patch: upstream fails building the info
                raise PlanningError(f"failed to merge runtimePatches into job {job.get('name')}: {err}")


def _without_nulls(value: Any) -> Any:
    # Upstream marshals typed structs, so an explicit null is an absent field, never a delete.
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _with_retained_volume_keys(spec: dict[str, Any]) -> dict[str, Any]:
    # Pod volumes merge with retain-keys semantics: a volume named in an override keeps only
    # the fields the override gives (a PVC volume turned into emptyDir loses the PVC part).
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        return spec
    marked = [{**v, "$retainKeys": sorted(v)} if isinstance(v, dict) else v for v in volumes]
    return {**spec, "volumes": marked}


def merge_resources_per_node(jobset_spec: dict[str, Any], trainer: Any, ml_policy: dict[str, Any] | None) -> None:
    """v2.3.0: ``trainer.resourcesPerNode`` merged key by key into the ``node`` container's
    resources while the runtime info is built, so everything that reads the info (PodGroup
    ``minResources``, the MPI slots) counts it. Only for runtimes with an ``mlPolicy``: the
    trainer job, and the job named ``node`` of an MPI runtime that runs its launcher as a node.
    As upstream, the container keeps only ``limits`` and ``requests`` (claims are not carried)."""
    resources = mapping(trainer).get("resourcesPerNode") if isinstance(trainer, dict) else None
    if not isinstance(resources, dict) or ml_policy is None:
        return
    launcher_as_node = mapping(ml_policy.get("mpi")).get("runLauncherAsNode") is True
    for job in items(jobset_spec.get("replicatedJobs")):
        if not isinstance(job, dict):
            continue
        ancestor = mapping(dig(job, "template", "metadata", "labels")).get(constants.LABEL_TRAINJOB_ANCESTOR)
        if ancestor != constants.ANCESTOR_TRAINER and not (launcher_as_node and job.get("name") == constants.NODE):
            continue
        for container in items(dig(job, "template", "spec", "template", "spec", "containers")):
            if not isinstance(container, dict) or container.get("name") != constants.NODE:
                continue
            base = mapping(container.get("resources"))
            merged: dict[str, Any] = {}
            for key in ("limits", "requests"):
                values = {**mapping(base.get(key)), **mapping(resources.get(key))}
                values = {name: value for name, value in values.items() if value is not None}
                if values:
                    merged[key] = clone(values)
            if merged:
                container["resources"] = merged
            else:
                container.pop("resources", None)
            break


def build_info(trainjob: dict[str, Any], runtime_spec: dict[str, Any],
               compat: TrainerCompat = DEFAULT_COMPAT) -> RuntimeInfo:
    """Build the runtime info from a (defaulted) TrainJob and runtime spec (§3.4)."""
    template = mapping(runtime_spec.get("template"))
    template_meta = mapping(template.get("metadata"))
    spec = mapping(trainjob.get("spec"))
    # Both releases' ways of changing the runtime from a TrainJob: v2.1.0's labels, annotations
    # and podTemplateOverrides first, then v2.3.0's runtimePatches in list order (upstream
    # never has both; docs/pipeline.md).
    patches = items(spec.get("runtimePatches"))
    patch_labels, patch_annotations = runtime_patch_metadata(patches)
    labels = {**mapping(template_meta.get("labels")), **mapping(spec.get("labels")), **patch_labels}
    annotations = {**mapping(template_meta.get("annotations")), **mapping(spec.get("annotations")),
                   **patch_annotations}
    jobset_spec = clone(mapping(template.get("spec")))
    merge_pod_template_overrides(jobset_spec, items(spec.get("podTemplateOverrides")))
    merge_runtime_patches(jobset_spec, patches)
    ml_policy = clone(runtime_spec["mlPolicy"]) if isinstance(runtime_spec.get("mlPolicy"), dict) else None
    if compat.v2_3:
        merge_resources_per_node(jobset_spec, spec.get("trainer"), ml_policy)
    pod_sets = [_pod_set(job, ml_policy) for job in items(jobset_spec.get("replicatedJobs"))
                if isinstance(job, dict)]
    pod_group_policy = runtime_spec.get("podGroupPolicy")
    return RuntimeInfo(
        labels=labels,
        annotations=annotations,
        ml_policy=ml_policy,
        pod_group_policy=pod_group_policy if isinstance(pod_group_policy, dict) else None,
        jobset_spec=jobset_spec,
        pod_sets=pod_sets,
    )


def _pod_set(job: dict[str, Any], ml_policy: dict[str, Any] | None) -> PodSet:
    job_template = mapping(job.get("template"))
    ancestor = mapping(dig(job_template, "metadata", "labels")).get(constants.LABEL_TRAINJOB_ANCESTOR)
    parallelism = dig(job_template, "spec", "parallelism")
    count = parallelism if isinstance(parallelism, int) and not isinstance(parallelism, bool) else 1
    if ancestor == constants.ANCESTOR_TRAINER and ml_policy is not None:
        num_nodes = ml_policy.get("numNodes")
        count = num_nodes if isinstance(num_nodes, int) and not isinstance(num_nodes, bool) else constants.DEFAULT_NUM_NODES
    pod_spec = mapping(dig(job_template, "spec", "template", "spec"))
    try:
        requests = single_pod_requests(pod_spec)
    except QuantityError as err:
        raise PlanningError(f"replicated job {job.get('name')}: {err}") from None
    replicas = job.get("replicas", 1)
    return PodSet(
        name=str(job.get("name") or ""),
        ancestor=ancestor if isinstance(ancestor, str) else None,
        count=max(count, 1),
        job=job,
        single_pod_requests=requests,
        replicas=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else 1,
    )
