"""Versioned message envelopes (pydantic v2, JSON on the wire).

Every envelope carries ``v`` (the schema version). A consumer rejects a version it does not
know with :class:`EnvelopeError` (the message then goes to the dead letter with that reason)
instead of guessing. Fields are additive: a newer minor addition gets a default so older
messages still parse.
"""
from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainyard.bus.subjects import ObjectKey, bus_kind, event_subject, partitions_setting
from trainyard.pipeline.trainjobs import home_trainjob, partition_of

ENVELOPE_VERSION = 1

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


class EnvelopeError(ValueError):
    """A message body that is not a valid envelope (a poison message)."""


class Envelope(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    v: int = ENVELOPE_VERSION


class ObjectRef(BaseModel):
    """apiVersion/kind/namespace/name of one object (namespace "" when cluster-scoped)."""

    api_version: str = Field(alias="apiVersion")
    kind: str
    namespace: str = ""
    name: str

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    @classmethod
    def of(cls, obj: dict[str, Any]) -> "ObjectRef":
        meta = obj.get("metadata") or {}
        return cls(
            apiVersion=obj.get("apiVersion", ""),
            kind=obj.get("kind", ""),
            namespace=meta.get("namespace") or "",
            name=meta.get("name", ""),
        )

    def __str__(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind}({self.api_version}) {where}"


class ObjectEvent(Envelope):
    """One observed change of one Kubernetes object (published by the watcher)."""

    cluster: str
    type: EventType
    kind: str
    api_version: str = Field(alias="apiVersion")
    namespace: str = ""
    name: str
    uid: str = ""
    resource_version: str = Field("", alias="resourceVersion")
    generation: int = 0
    object: dict[str, Any]

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    @property
    def key(self) -> ObjectKey:
        return ObjectKey(self.cluster, bus_kind(self.api_version, self.kind), self.namespace, self.name)

    def partition(self, count: int | None = None) -> int | None:
        """The home partition of the TrainJob this object belongs to (the TrainJob itself, or
        its owner); None for an object of no TrainJob (a runtime: every partition reads it).
        ``count``: the partition count (``$TRAINYARD_PARTITIONS`` when not given)."""
        home = home_trainjob(self.kind, self.object) if self.kind != "TrainJob" else (self.namespace, self.name)
        if home is None:
            return None
        return partition_of(home[0], home[1], count or partitions_setting())

    def subject(self, count: int | None = None) -> str:
        """The subject this event is published on (its home partition's)."""
        return event_subject(self.key, self.partition(count))

    def msg_id(self) -> str:
        """Same change seen by two watchers (or listed again) -> same id -> stored once."""
        suffix = ":DELETED" if self.type == "DELETED" else ""
        return f"{self.key}:{self.uid}:{self.resource_version}{suffix}"

    @classmethod
    def from_object(cls, cluster: str, event_type: EventType, obj: dict[str, Any]) -> "ObjectEvent":
        meta = obj.get("metadata") or {}
        return cls(
            cluster=cluster,
            type=event_type,
            kind=obj.get("kind", ""),
            apiVersion=obj.get("apiVersion", ""),
            namespace=meta.get("namespace") or "",
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            resourceVersion=str(meta.get("resourceVersion", "")),
            generation=int(meta.get("generation") or 0),
            object=obj,
        )


class PlanMessage(Envelope):
    """The desired state of one TrainJob at one generation (published by the planner).

    ``objects`` are applied in order (server-side apply). ``owned`` lists every object the
    TrainJob should own now, including the ones left untouched this time (e.g. a running JobSet,
    which upstream never re-applies); anything applied earlier and absent from ``owned`` is
    deleted. ``error`` set means planning failed: nothing is applied, the status path reports it.
    """

    cluster: str
    namespace: str
    name: str
    uid: str
    generation: int
    resource_version: str = Field("", alias="resourceVersion")
    plan_hash: str = Field(alias="planHash")
    objects: list[dict[str, Any]] = Field(default_factory=list)
    owned: list[ObjectRef] = Field(default_factory=list)
    suspended: bool = False
    # Digest of the TrainJob's planning inputs (metadata and spec, not status) this plan was
    # made from; the applier records it so a status-only change is not planned again.
    inputs: str = ""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    def msg_id(self) -> str:
        return f"plan:{self.cluster}:{self.uid}:{self.generation}:{self.plan_hash}"


ApplyOutcome = Literal["applied", "skipped-stale", "skipped-unchanged", "failed", "plan-failed"]


class ApplyResult(Envelope):
    """What happened to one plan (published by the applier; by the planner for plan errors)."""

    cluster: str
    namespace: str
    name: str
    uid: str
    generation: int
    plan_hash: str = Field("", alias="planHash")
    outcome: ApplyOutcome
    applied: list[ObjectRef] = Field(default_factory=list)
    deleted: list[ObjectRef] = Field(default_factory=list)
    reason: str = ""
    message: str = ""
    applier: str = ""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    def msg_id(self) -> str:
        return f"result:{self.cluster}:{self.uid}:{self.generation}:{self.plan_hash}:{self.outcome}"


class MetricValue(BaseModel):
    """One ``status.trainerStatus.metrics`` entry: name and value, both strings as upstream."""

    name: str
    value: str

    model_config = ConfigDict(frozen=True)


class ProgressReport(Envelope):
    """One progress report a trainer made (``status.trainerStatus``), as the status endpoint
    wrote it: the points of the dashboard's per-TrainJob charts. ``at`` is when the endpoint
    accepted it (seconds since the epoch, sub-second: ``lastUpdatedTime`` has whole seconds
    only); ``resourceVersion`` is the TrainJob's after the write (one report, one version)."""

    cluster: str
    namespace: str
    name: str
    uid: str
    resource_version: str = Field(alias="resourceVersion")
    at: float
    last_updated_time: str | None = Field(None, alias="lastUpdatedTime")
    progress_percentage: int | None = Field(None, alias="progressPercentage")
    estimated_remaining_seconds: int | None = Field(None, alias="estimatedRemainingSeconds")
    metrics: list[MetricValue] = Field(default_factory=list)

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    def msg_id(self) -> str:
        return f"progress:{self.cluster}:{self.uid}:{self.resource_version}"


class DeadLetter(Envelope):
    """A message given up on, with the error that made it poison.

    ``data`` is the base64 of the original body, or of its first ``DEAD_LETTER_DATA_MAX`` bytes
    (``truncated`` true) when it is larger: a letter must fit in NATS's max_payload, which a
    poison message just under that limit, grown by base64, would not.
    """

    stream: str
    consumer: str
    subject: str
    deliveries: int
    error: str
    data: str
    headers: dict[str, str] = Field(default_factory=dict)
    truncated: bool = False


DEAD_LETTER_DATA_MAX = 256 * 1024


E = TypeVar("E", bound=Envelope)


def encode(envelope: Envelope) -> bytes:
    return envelope.model_dump_json(by_alias=True).encode("utf-8")


def decode(model: type[E], data: bytes) -> E:
    """Parses an envelope; any problem becomes one :class:`EnvelopeError` line."""
    try:
        envelope = model.model_validate_json(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise EnvelopeError(f"invalid {model.__name__}: {where}: {first.get('msg')}") from None
    if envelope.v != ENVELOPE_VERSION:
        raise EnvelopeError(f"unsupported {model.__name__} version v={envelope.v}")
    return envelope
