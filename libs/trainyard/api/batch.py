"""batch/v1 types: the Job template each JobSet replicated job carries."""
from __future__ import annotations

from typing import Any, ClassVar

from trainyard.api.core import PodTemplateSpec
from trainyard.api.meta import Int32, Int64, KubeModel, ObjectMeta

_BATCH = "io.k8s.api.batch.v1."


class JobSpec(KubeModel):
    """A Job's spec, typed where the planner and the devcluster data plane read it."""

    k8s_definition: ClassVar[str | None] = _BATCH + "JobSpec"

    parallelism: Int32 | None = None
    completions: Int32 | None = None
    completion_mode: str | None = None
    backoff_limit: Int32 | None = None
    backoff_limit_per_index: Int32 | None = None
    max_failed_indexes: Int32 | None = None
    active_deadline_seconds: Int64 | None = None
    ttl_seconds_after_finished: Int32 | None = None
    suspend: bool | None = None
    selector: dict[str, Any] | None = None
    manual_selector: bool | None = None
    pod_failure_policy: dict[str, Any] | None = None
    success_policy: dict[str, Any] | None = None
    pod_replacement_policy: str | None = None
    managed_by: str | None = None
    template: PodTemplateSpec | None = None


class JobTemplateSpec(KubeModel):
    """Metadata and spec of the Jobs created for one replicated job."""

    k8s_definition: ClassVar[str | None] = _BATCH + "JobTemplateSpec"

    metadata: ObjectMeta | None = None
    spec: JobSpec | None = None
