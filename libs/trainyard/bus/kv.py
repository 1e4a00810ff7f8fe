"""KV buckets: latest object snapshots, last applied plan per TrainJob (compare-and-set).

Snapshots: several watchers may write the same object; a write only lands when its
resourceVersion is newer than the stored one (compare-and-set on the KV revision), so a
lagging watcher never rolls a snapshot back. A deletion leaves a tombstone snapshot
(``deleted: true``) so that a late ADDED from a lagging watcher cannot resurrect it.

Applied plans: the applier claims a TrainJob's entry with compare-and-set before applying and
records the result after, which is what makes plans monotonic across appliers (docs/bus.md).
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from trainyard.bus.envelopes import ObjectRef
from trainyard.bus.subjects import ObjectKey, encode_token, kv_key, kv_prefix
from trainyard.bus.topology import APPLIED_BUCKET, OUTCOMES_BUCKET, SNAPSHOTS_BUCKET
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)


def resource_version_newer(candidate: str, current: str) -> bool:
    """True when ``candidate`` is newer. Kubernetes calls resourceVersions opaque, but etcd and
    devcluster use increasing integers; for anything else, "different" counts as newer."""
    if candidate == current:
        return False
    if candidate.isdigit() and current.isdigit():
        return int(candidate) > int(current)
    return True


class Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    resource_version: str = Field("", alias="resourceVersion")
    deleted: bool = False
    object: dict[str, Any]


def _count(kv: KeyValue, op: str) -> None:
    metrics.KV_OPERATIONS.labels(kv._name, op).inc()


async def _get(kv: KeyValue, key: str) -> tuple[bytes | None, int | None]:
    _count(kv, "get")
    try:
        entry = await kv.get(key)
    except (KeyNotFoundError, NotFoundError):
        return None, None
    return entry.value, entry.revision


class SnapshotStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "SnapshotStore":
        return cls(await js.key_value(SNAPSHOTS_BUCKET))

    async def record(self, key: ObjectKey, obj: dict[str, Any], deleted: bool = False) -> bool:
        """Stores ``obj`` unless the stored snapshot is as new or newer. True when written."""
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion", ""))
        value = Snapshot(resourceVersion=rv, deleted=deleted, object=obj).model_dump_json(
            by_alias=True).encode()
        for _ in range(20):
            raw, revision = await _get(self._kv, kv_key(key))
            if raw is not None and not _supersedes(Snapshot.model_validate_json(raw), meta, rv, deleted):
                return False
            try:
                _count(self._kv, "create" if revision is None else "update")
                if revision is None:
                    await self._kv.create(kv_key(key), value)
                else:
                    await self._kv.update(kv_key(key), value, last=revision)
                return True
            except Exception as err:
                if not _is_cas_conflict(err):
                    raise
        return False

    async def get(self, key: ObjectKey) -> dict[str, Any] | None:
        """The latest live object, or None (absent or deleted)."""
        raw, _ = await _get(self._kv, kv_key(key))
        if raw is None:
            return None
        snapshot = Snapshot.model_validate_json(raw)
        return None if snapshot.deleted else snapshot.object

    async def list(self, cluster: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """All live objects of one kind (and namespace), read in one pass over the bucket."""
        return [s.object for s in await self.list_snapshots(cluster, kind, namespace) if not s.deleted]

    async def list_snapshots(
        self, cluster: str, kind: str, namespace: str | None = None
    ) -> list[Snapshot]:
        """Reads the latest value of every matching key with a short-lived pull consumer
        (deleted right after, so frequent listings do not pile consumers up)."""
        _count(self._kv, "list")
        stream = f"KV_{self._kv._name}"
        name = f"list-{uuid.uuid4().hex}"
        js = self._kv._js
        info = await js.add_consumer(stream, config=ConsumerConfig(
            name=name, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
            filter_subject=f"$KV.{self._kv._name}.{kv_prefix(cluster, kind, namespace)}",
            inactive_threshold=10.0, mem_storage=True,
        ))
        out: list[Snapshot] = []
        try:
            remaining = info.num_pending
            if remaining == 0:
                return out
            sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
            try:
                while remaining > 0:
                    msgs = await sub.fetch(min(remaining, 256), timeout=5.0)
                    for msg in msgs:
                        remaining = msg.metadata.num_pending
                        if msg.data and (msg.headers or {}).get("KV-Operation") not in ("DEL", "PURGE"):
                            out.append(Snapshot.model_validate_json(msg.data))
            finally:
                await sub.unsubscribe()
        finally:
            try:
                await js.delete_consumer(stream, name)
            except Exception:
                pass
        return out


def _supersedes(current: Snapshot, meta: dict[str, Any], rv: str, deleted: bool) -> bool:
    """Whether a new snapshot (meta/rv/deleted) should replace the stored one."""
    if (current.object.get("metadata") or {}).get("uid") != meta.get("uid"):
        return True  # another incarnation of the name: the newest event wins
    if current.deleted:
        return False  # a tombstone is final for this uid
    if deleted:
        return True
    return resource_version_newer(rv, current.resource_version)


def _is_cas_conflict(err: Exception) -> bool:
    if isinstance(err, KeyWrongLastSequenceError):
        return True
    text = str(err).lower()
    return "wrong last sequence" in text or "key exists" in text or "10071" in text


class AppliedPlan(BaseModel):
    """Last plan applied (or being applied) for one TrainJob."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    uid: str
    generation: int
    plan_hash: str = Field(alias="planHash")
    state: str = "applied"  # "applying" while a claim is held
    holder: str = ""
    claim_expires: float = Field(0.0, alias="claimExpires")
    owned: list[ObjectRef] = Field(default_factory=list)
    # Hashes already applied at this generation (a re-delivered older plan of the same
    # generation is then recognised and not applied again).
    hashes: list[str] = Field(default_factory=list)
    # W3C traceparent of the TrainJob change that applied it: status traces started by
    # JobSet events link to it.
    traceparent: str = ""
    # PlanMessage.inputs of the plan applied: the TrainJob's metadata and spec it was made from.
    inputs: str = ""

    def claim_live(self, now: float | None = None) -> bool:
        return self.state == "applying" and (now or time.time()) < self.claim_expires


@dataclass(frozen=True)
class Versioned:
    value: AppliedPlan | None
    revision: int | None


class CasConflict(Exception):
    """Someone else updated the entry between our read and our write."""


def applied_key(cluster: str, namespace: str, name: str) -> str:
    return f"{encode_token(cluster)}.{encode_token(namespace)}.{encode_token(name)}"


class AppliedPlanStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "AppliedPlanStore":
        return cls(await js.key_value(APPLIED_BUCKET))

    async def read(self, key: str) -> Versioned:
        raw, revision = await _get(self._kv, key)
        if raw is None:
            return Versioned(None, revision)
        return Versioned(AppliedPlan.model_validate_json(raw), revision)

    async def compare_and_set(self, key: str, value: AppliedPlan, revision: int | None) -> int:
        """Writes ``value`` only if the entry is still at ``revision`` (None: must not exist)."""
        data = value.model_dump_json(by_alias=True).encode()
        _count(self._kv, "create" if revision is None else "update")
        try:
            if revision is None:
                return await self._kv.create(key, data)
            return await self._kv.update(key, data, last=revision)
        except Exception as err:
            if _is_cas_conflict(err):
                raise CasConflict(key) from err
            raise

    async def delete(self, key: str) -> None:
        _count(self._kv, "delete")
        try:
            await self._kv.delete(key)
        except (KeyNotFoundError, NotFoundError):
            pass


class Outcome(BaseModel):
    """The last planning or apply failure of a TrainJob (cleared when a later one succeeds)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    uid: str
    generation: int
    stage: str  # "plan" or "apply"
    reason: str
    message: str


class OutcomeStore:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "OutcomeStore":
        return cls(await js.key_value(OUTCOMES_BUCKET))

    async def get(self, key: str) -> Outcome | None:
        raw, _ = await _get(self._kv, key)
        if raw is None or raw == b"":
            return None
        try:
            return Outcome.model_validate_json(raw)
        except ValueError:
            return None

    async def set(self, key: str, outcome: Outcome) -> None:
        _count(self._kv, "put")
        await self._kv.put(key, outcome.model_dump_json(by_alias=True).encode())

    async def clear(self, key: str, stage: str) -> None:
        current = await self.get(key)
        if current is not None and current.stage == stage:
            _count(self._kv, "delete")
            try:
                await self._kv.delete(key)
            except (KeyNotFoundError, NotFoundError):
                pass
