"""KV buckets: latest object snapshots, last applied plan per TrainJob (compare-and-set).

Snapshots: several watchers may write the same object; a write only lands when its
resourceVersion is newer than the stored one (compare-and-set on the KV revision), so a
lagging watcher never rolls a snapshot back. A deletion leaves a tombstone snapshot
(``deleted: true``) so that a late ADDED from a lagging watcher cannot resurrect it. Tombstones,
and the markers a removed applied-plan or outcome entry leaves, expire after
``TOMBSTONE_TTL_S`` (JetStream per-message TTL), so the buckets do not grow with history.

Applied plans: the applier claims a TrainJob's entry with compare-and-set before applying and
records the result after, which is what makes plans monotonic across appliers (docs/bus.md).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import re
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (APIError, KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError,
                             NoStreamResponseError, NotFoundError, ServiceUnavailableError)
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from trainyard.bus import readfloor
from trainyard.bus.envelopes import ObjectRef
from trainyard.bus.subjects import ObjectKey, encode_token, kv_key, kv_prefix
from trainyard.bus.topology import APPLIED_BUCKET, CHECKED_BUCKETS, FLOOR_KEY, OUTCOMES_BUCKET, SNAPSHOTS_BUCKET
from trainyard.errortext import describe
from trainyard.telemetry import metrics

log = logging.getLogger(__name__)

# Long enough that no late event of a deleted object can still arrive (the streams' dedup window
# is 2 minutes; a watcher that was away lists again instead of replaying), short enough that the
# buckets hold the live objects only, however many came and went.
TOMBSTONE_TTL_S = 600.0
TOMBSTONE_TTL_ENV = "TRAINYARD_TOMBSTONE_TTL"


def tombstone_ttl_s() -> float:
    """``$TRAINYARD_TOMBSTONE_TTL`` seconds (benchmarks shorten it), else ``TOMBSTONE_TTL_S``."""
    raw = os.environ.get(TOMBSTONE_TTL_ENV, "").strip()
    if not raw:
        return TOMBSTONE_TTL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value < 1:
        log.warning("%s: must be a number of seconds >= 1, got %r; using %s", TOMBSTONE_TTL_ENV, raw,
                    TOMBSTONE_TTL_S)
        return TOMBSTONE_TTL_S
    return value


SKIP = object()  # what a list_snapshots keep() returns for "leave it out"


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


_COUNTERS: dict[tuple[str, str], Any] = {}


def _count(kv: KeyValue, op: str) -> None:
    # The labelled child is looked up once per (bucket, op): ``labels()`` on every round trip
    # was 4 % of the planner's samples.
    counter = _COUNTERS.get((kv._name, op))
    if counter is None:
        counter = _COUNTERS[(kv._name, op)] = metrics.KV_OPERATIONS.labels(kv._name, op)
    counter.inc()


def _ttl_refused(err: Exception) -> bool:
    return "ttl" in str(err).lower() and not is_cas_conflict(err)


async def write_entry(kv: KeyValue, key: str, value: bytes, revision: int | None, ttl: float | None) -> int:
    """Create (revision None) or compare-and-set update (a lost race raises what
    :func:`is_cas_conflict` recognises); ``ttl``: the entry expires after that
    many seconds (a bucket made without per-message TTL keeps it instead)."""
    _count(kv, "create" if revision is None else "update")
    if ttl:
        try:
            return await _put(kv, key, value, revision, ttl)
        except Exception as err:
            if not _ttl_refused(err):
                raise
            log.warning("bucket %s refuses per-message TTL; the tombstone of %s is kept", kv._name, key)
    return await _put(kv, key, value, revision, None)


async def _put(kv: KeyValue, key: str, value: bytes, revision: int | None, ttl: float | None) -> int:
    """``KeyValue.create`` (revision None) or ``update`` with its semantics, through
    ``BucketRequests``: a create lands on a key whose last entry is a delete or purge marker
    (on that marker's revision), and fails with ``KeyWrongLastSequenceError`` on a live one."""
    requests = BucketRequests.of(kv)
    if revision is not None:
        return await requests.put_if(key, value, revision, ttl)
    try:
        return await requests.put_if(key, value, 0, ttl)
    except KeyWrongLastSequenceError:
        if await requests.checked():
            # A copy might not hold the entry the stream leader just refused the create for.
            _, revision, marker = await _leader_entry(kv, key)
            if marker and revision is not None:
                return await requests.put_if(key, value, revision, ttl)
            raise
        try:
            await kv._get(key)  # a live entry: the create fails; a marker: raises KeyDeletedError
        except KeyDeletedError as deleted:
            return await requests.put_if(key, value, deleted.entry.revision, ttl)
        raise


async def _leader_entry(kv: KeyValue, key: str) -> tuple[bytes | None, int | None, bool]:
    """The key's last entry read on the stream leader (``STREAM.MSG.GET``): value, revision and
    whether it is a delete or purge marker; (None, None, False) when the key has none."""
    try:
        msg = await kv._js.get_msg(kv._stream, subject=f"{kv._pre}{key}", direct=False)
    except (NotFoundError, KeyNotFoundError):
        return None, None, False
    marker = (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE")
    return (None if marker else msg.data), msg.seq, marker


async def _remove(kv: KeyValue, key: str, ttl: float) -> None:
    """Removes an entry; the marker the removal leaves expires after ``ttl`` seconds."""
    _count(kv, "delete")
    try:
        # What ``KeyValue.purge`` sends, published here for its acknowledgement: the marker's
        # sequence is a read floor (reads must not show the entry again).
        ack = await kv._js.publish(f"{kv._pre}{key}", headers={"KV-Operation": "PURGE", "Nats-Rollup": "sub"},
                                   msg_ttl=ttl)
        if await BucketRequests.of(kv).checked():
            readfloor.raise_floor(kv._js._nc, kv._name, ack.seq)
        return
    except (KeyNotFoundError, NotFoundError):
        return
    except Exception as err:
        if not _ttl_refused(err):
            raise
    try:
        await kv.delete(key)
    except (KeyNotFoundError, NotFoundError):
        pass


async def read_entry(kv: KeyValue, key: str) -> tuple[bytes | None, int | None]:
    """The entry's value and revision; (None, None) when absent, deleted or purged."""
    _count(kv, "get")
    if kv._direct:
        return await BucketRequests.of(kv).last(key)
    try:
        entry = await kv.get(key)
    except (KeyNotFoundError, NotFoundError):
        return None, None
    return entry.value, entry.revision


class SnapshotStore:
    def __init__(self, kv: KeyValue, tombstone_ttl: float | None = None) -> None:
        self._kv = kv
        self.tombstone_ttl_s = tombstone_ttl or tombstone_ttl_s()
        # KV key -> (revision, uid, resourceVersion) of the live snapshot this process last
        # wrote: the next write of that object is a compare-and-set on that revision without
        # reading the entry first (another writer in between makes it fail, and then it reads).
        # Only writers (the watcher) fill it, one entry per live object; deletions drop theirs.
        self._written: dict[str, tuple[int, str, str]] = {}

    @classmethod
    async def open(cls, js: JetStreamContext) -> "SnapshotStore":
        return cls(await js.key_value(SNAPSHOTS_BUCKET))

    async def version(self) -> int:
        """The bucket's last sequence: it moves with every write or deletion of any snapshot, so
        a reader that saw it unchanged knows every listing would be the same (one stream info
        request, where a listing creates a consumer and reads every object)."""
        info = await self._kv._js.stream_info(f"KV_{self._kv._name}")
        return int(info.state.last_seq or 0)

    async def record(self, key: ObjectKey, obj: dict[str, Any], deleted: bool = False) -> bool:
        """Stores ``obj`` unless the stored snapshot is as new or newer. True when written."""
        meta = obj.get("metadata") or {}
        rv = str(meta.get("resourceVersion", ""))
        value = Snapshot(resourceVersion=rv, deleted=deleted, object=obj).model_dump_json(
            by_alias=True).encode()
        name = kv_key(key)
        for attempt in range(20):
            known = self._written.get(name)
            if known is not None:
                revision = known[0]
                if not _supersedes_parts(known[1], False, known[2], meta, rv, deleted):
                    return False
            elif attempt == 0 and not deleted:
                # Never written by this process: most often a new object, so create it without
                # reading first (an existing entry makes the create fail, and then it reads).
                revision = None
            else:
                raw, revision = await read_entry(self._kv, name)
                if raw is not None:
                    current = Snapshot.model_validate_json(raw)
                    if not _supersedes_parts((current.object.get("metadata") or {}).get("uid"), current.deleted,
                                             current.resource_version, meta, rv, deleted):
                        return False
            try:
                written = await write_entry(self._kv, name, value, revision, self.tombstone_ttl_s if deleted else None)
            except Exception as err:
                if not is_cas_conflict(err):
                    raise
                self._written.pop(name, None)
                continue
            if deleted:
                self._written.pop(name, None)
            else:
                self._written[name] = (written, str(meta.get("uid") or ""), rv)
            return True
        return False

    async def get(self, key: ObjectKey, known: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The latest live object, or None (absent or deleted). ``known``: a copy of the object
        the caller already holds (an event's); when the snapshot is that very version (same
        resourceVersion, read from the entry's head) it is returned instead of parsing the
        entry again — a JobSet is kilobytes of JSON."""
        raw, _ = await read_entry(self._kv, kv_key(key))
        if raw is not None and known is not None:
            rv = str((known.get("metadata") or {}).get("resourceVersion") or "")
            head = _SNAPSHOT_HEAD.match(raw)
            if rv and head is not None and head.group(2) == b"false" and head.group(1) == rv.encode():
                return known
        return _live_object(raw)

    async def get_many(self, keys: list[ObjectKey]) -> list[dict[str, Any] | None]:
        """:meth:`get` of each key, in one round trip where the bucket allows direct gets
        (one request names every key; the server answers with the entries that exist and an
        end-of-batch marker), else as concurrent gets."""
        if self._kv._direct and len(keys) > 1:
            try:
                found = await BucketRequests.of(self._kv).last_values([kv_key(key) for key in keys])
            except BucketRequestError as err:
                log.warning("batched read of %d snapshots failed (%s); reading them one by one", len(keys), describe(err))
            else:
                return [_live_object(found.get(kv_key(key))) for key in keys]
        return list(await asyncio.gather(*(self.get(key) for key in keys)))

    async def list(self, cluster: str, kind: str, namespace: str | None = None,
                   pick: Callable[[dict[str, Any]], Any] | None = None) -> list[Any]:
        """All live objects of one kind (and namespace), read in one pass over the bucket;
        with ``pick``, ``pick(object)`` of each instead, made as the objects stream in (a scan
        of thousands then never holds them all)."""
        def keep(snapshot: Snapshot) -> Any:
            if snapshot.deleted:
                return SKIP
            return snapshot.object if pick is None else pick(snapshot.object)

        return await self.list_snapshots(cluster, kind, namespace, keep)

    async def list_snapshots(
        self, cluster: str, kind: str, namespace: str | None = None,
        keep: Callable[[Snapshot], Any] | None = None,
    ) -> list[Any]:
        """Reads the latest value of every matching key with a short-lived pull consumer
        (deleted right after, so frequent listings do not pile consumers up). ``keep`` maps
        each snapshot to what is returned (``SKIP``: nothing)."""
        _count(self._kv, "list")
        out: list[Any] = []

        def visit(msg: Any) -> None:
            if msg.data and (msg.headers or {}).get("KV-Operation") not in ("DEL", "PURGE"):
                snapshot = Snapshot.model_validate_json(msg.data)
                kept = snapshot if keep is None else keep(snapshot)
                if kept is not SKIP:
                    out.append(kept)

        await scan_last_per_subject(self._kv._js, f"KV_{self._kv._name}",
                                    f"$KV.{self._kv._name}.{kv_prefix(cluster, kind, namespace)}", visit)
        return out


# How ``Snapshot.model_dump_json`` begins (fields in declaration order); anything else (an
# escaped resourceVersion, another writer's layout) is simply parsed.
_SNAPSHOT_HEAD = re.compile(rb'\{"resourceVersion":"([^"\\]*)","deleted":(true|false),')


def _live_object(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    snapshot = Snapshot.model_validate_json(raw)
    return None if snapshot.deleted else snapshot.object


class BucketRequestError(Exception):
    """A request that got no answer or an error status."""


_READ_ONE, _READ_BATCH, _WRITE = 0, 1, 2


class BucketRequests:
    """Requests to one bucket answered on one subscription: direct gets (the bucket must allow
    them), batched direct gets and compare-and-set writes.

    A single get asks ``DIRECT.GET.<stream>.<key subject>`` (the last entry of that key); a
    batch names several keys in one request (``multi_last``, nats-server 2.11 or later) and
    the server answers with one message per existing entry, then a status (204 end of batch,
    404 when no key exists); a write publishes to the key's subject with the expected last
    revision (and a per-message TTL) and the stream answers with its JSON acknowledgement. The
    replies of every request of the process arrive on one wildcard subscription under the
    connection's inbox prefix, routed by a token; a timer, not ``asyncio.wait_for``, bounds the
    wait, and reads involve no JSON API or timestamp parsing (measured: a 2-KiB update 128 ->
    96 us of client CPU; KV reads 11.6-11.8 % -> 2.3-3.4 % of the planner's and the status
    service's samples, docs/performance.md)."""

    TIMEOUT_S = 5.0
    _instances: "weakref.WeakKeyDictionary[KeyValue, BucketRequests]" = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, kv: KeyValue) -> "BucketRequests":
        requests = cls._instances.get(kv)
        if requests is None:
            requests = cls._instances[kv] = cls(kv)
        return requests

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._nc = kv._js._nc
        self._api = f"{kv._js._prefix}.DIRECT.GET.KV_{kv._name}"
        self._key_prefix = f"$KV.{kv._name}."
        self._inbox = ""
        self._tokens = itertools.count(1)
        # token -> (entries found: key -> (value, revision), done, kind of request)
        self._pending: dict[str, tuple[dict[str, tuple[bytes, int]], asyncio.Future[Any], int]] = {}
        self._subscribing = asyncio.Lock()
        # Whether reads are checked against the read floor (a replicated data bucket); learned
        # from the stream's config on first use.
        self._checked: bool | None = None if kv._name in CHECKED_BUCKETS else False
        self._floor_subject = self._key_prefix + FLOOR_KEY

    async def checked(self) -> bool:
        """True for a replicated snapshot, applied-plan or outcome bucket: its reads are
        batched direct gets checked against the read floor (trainyard.bus.readfloor)."""
        if self._checked is None:
            try:
                info = await self._kv._js.stream_info(f"KV_{self._kv._name}")
            except Exception as err:  # NATS away, or an identity without the grant
                # A checked read is correct with any number of copies: use it, ask again later.
                log.debug("bucket %s: copies unknown (%s); reads are checked", self._kv._name, describe(err))
                return True
            self._checked = (info.config.num_replicas or 1) > 1
        return self._checked

    async def _ensure_subscribed(self) -> None:
        if self._inbox:
            return
        async with self._subscribing:
            if not self._inbox:
                inbox = self._nc.new_inbox()
                await self._nc.subscribe(inbox + ".*", cb=self._on_reply)
                self._inbox = inbox

    async def _on_reply(self, msg: Any) -> None:
        token = msg.subject.rpartition(".")[2]
        pending = self._pending.get(token)
        if pending is None or pending[1].done():
            return  # a late reply of a request that timed out
        found, done, kind = pending
        headers = msg.headers or {}
        status = headers.get("Status")
        if status:
            if status in ("204", "404") and kind != _WRITE:
                # The end of a batch names the answering copy's last sequence (0: none named).
                done.set_result(int(headers.get("Nats-UpTo-Sequence") or 0))
            else:
                done.set_exception(BucketRequestError(f"status {status} {headers.get('Description', '')}".strip()))
            return
        if kind == _WRITE:
            done.set_result(msg.data)
            return
        subject = headers.get("Nats-Subject", "")
        if subject.startswith(self._key_prefix) and headers.get("KV-Operation") not in ("DEL", "PURGE"):
            found[subject[len(self._key_prefix):]] = (msg.data, int(headers.get("Nats-Sequence") or 0))
        if kind == _READ_ONE:
            done.set_result(None)

    async def _ask(self, subject: str, payload: bytes, kind: int,
                   headers: dict[str, str] | None = None) -> tuple[dict[str, tuple[bytes, int]], Any]:
        await self._ensure_subscribed()
        token = str(next(self._tokens))
        found: dict[str, tuple[bytes, int]] = {}
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        self._pending[token] = (found, done, kind)
        timer = loop.call_later(self.TIMEOUT_S, _expire, done)
        try:
            await self._nc.publish(subject, payload, reply=f"{self._inbox}.{token}", headers=headers)
            answer = await done
        finally:
            timer.cancel()
            del self._pending[token]
        return found, answer

    async def last(self, key: str) -> tuple[bytes | None, int | None]:
        """The key's value and revision, or (None, None) when absent, deleted or purged."""
        if await self.checked():
            try:
                found = await self._checked_read([key])
            except BucketRequestError as err:
                if "no end of batch" in str(err):
                    raise NatsTimeoutError from None
                raise
        else:
            try:
                found, _ = await self._ask(f"{self._api}.{self._key_prefix}{key}", b"", _READ_ONE)
            except asyncio.TimeoutError:
                raise NatsTimeoutError from None
        entry = found.get(key)
        return (entry[0], entry[1]) if entry is not None else (None, None)

    async def last_values(self, keys: list[str]) -> dict[str, bytes]:
        """key -> stored value of the keys that exist (deleted and purged entries left out)."""
        _count(self._kv, "get_many")
        if await self.checked():
            found = await self._checked_read(keys)
        else:
            found, _ = await self._batch(keys)
        return {key: value for key, (value, _) in found.items()}

    async def _batch(self, keys: list[str]) -> tuple[dict[str, tuple[bytes, int]], int]:
        """One batched direct get of ``keys``: the entries found, and the answering copy's last
        stream sequence (0 when it named none: no key had an entry)."""
        subjects = [self._key_prefix + key for key in keys]
        request = json.dumps({"multi_last": subjects, "batch": len(subjects)})
        try:
            return await self._ask(self._api, request.encode(), _READ_BATCH)
        except asyncio.TimeoutError:
            raise BucketRequestError(f"no end of batch within {self.TIMEOUT_S:.0f} s") from None
        except BucketRequestError:
            raise
        except Exception as err:  # not connected, subscription refused
            raise BucketRequestError(str(err) or type(err).__name__) from err

    async def _checked_read(self, keys: list[str]) -> dict[str, tuple[bytes, int]]:
        """``keys`` read on a replicated bucket without missing a write the process knows of.

        One batched direct get, whichever copy answers, with the bucket's floor marker among the
        keys (an entry that always exists, so the answer always ends with the copy's last
        sequence). A copy whose last sequence is at least the read floor has every write the
        reader depends on; one that lags (rare: a copy applies within milliseconds) is passed
        over and the keys are read on the stream leader, concurrently (one round trip of time).
        """
        nc = self._nc
        bucket = self._kv._name
        needed = readfloor.floor(nc, bucket)
        found, copy_last = await self._batch([FLOOR_KEY, *keys])
        found.pop(FLOOR_KEY, None)
        if copy_last < needed:
            _count(self._kv, "get_leader")
            entries = await asyncio.gather(*(_leader_entry(self._kv, key) for key in keys))
            found = {key: (value, revision) for key, (value, revision, _) in zip(keys, entries)
                     if value is not None and revision is not None}
        if found:
            # Monotonic reads: a later read never shows an older version of what this one saw.
            readfloor.raise_floor(nc, bucket, max(revision for _, revision in found.values()))
        return found

    async def put_if(self, key: str, value: bytes, last: int, ttl: float | None) -> int:
        """Writes ``value`` if the key's last revision is ``last`` (0: the key has none);
        returns the new revision. Raises nats-py's own errors, as ``KeyValue`` does: a
        revision mismatch is ``KeyWrongLastSequenceError``, anything else the stream's
        ``APIError``."""
        headers = {"Nats-Expected-Last-Subject-Sequence": str(last)}
        if ttl:
            headers["Nats-TTL"] = str(int(ttl))
        try:
            _, answer = await self._ask(f"{self._kv._pre}{key}", value, _WRITE, headers)
        except asyncio.TimeoutError:
            raise NatsTimeoutError from None
        except BucketRequestError as err:  # e.g. no responders: no stream takes the subject
            raise NoStreamResponseError(description=str(err)) from None
        ack = json.loads(answer)
        if "error" in ack:
            try:
                APIError.from_error(ack["error"])  # raises the error's own class
            except APIError as err:
                if err.err_code in (10071, 10164):  # wrong last sequence (nats-py maps the same codes)
                    raise KeyWrongLastSequenceError(description=err.description) from None
                raise
        sequence = int(ack["seq"])
        if await self.checked():
            readfloor.raise_floor(self._nc, self._kv._name, sequence)
        return sequence


def _expire(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_exception(asyncio.TimeoutError())


# How long a scan waits for its new consumer's leader (an election takes milliseconds; a cluster
# that has none for seconds is not a place to read from).
SCAN_LEADER_WAIT_S = 5.0


async def scan_last_per_subject(js: JetStreamContext, stream: str, filter_subject: str,
                                visit: Callable[[Any], None], headers_only: bool = False) -> None:
    """Calls ``visit(msg)`` with the last message of every subject matching ``filter_subject``,
    read with a short-lived pull consumer (deleted right after, so frequent scans do not pile
    consumers up); ``headers_only``: the messages come without their bodies."""
    name = f"scan-{uuid.uuid4().hex}"
    info = await js.add_consumer(stream, config=ConsumerConfig(
        name=name, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
        filter_subject=filter_subject, inactive_threshold=10.0, mem_storage=True,
        headers_only=headers_only or None,
    ))
    try:
        remaining = info.num_pending
        if remaining == 0:
            return
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        leaderless_until = time.monotonic() + SCAN_LEADER_WAIT_S
        try:
            while remaining > 0:
                try:
                    msgs = await sub.fetch(min(remaining, 1024), timeout=5.0)
                except ServiceUnavailableError:
                    # On a replicated stream the new consumer answers pulls once its own leader
                    # is elected; until then a pull has no responder (503). Seen as ~1 scan in
                    # 70 on a 3-node cluster, and at `trainyard up --nats-cluster 3` it made the
                    # dashboard's first scan fail its start.
                    if time.monotonic() > leaderless_until:
                        raise
                    await asyncio.sleep(0.05)
                    continue
                for msg in msgs:
                    remaining = msg.metadata.num_pending
                    visit(msg)
        finally:
            await sub.unsubscribe()
    finally:
        try:
            await js.delete_consumer(stream, name)
        except Exception:
            pass


def _supersedes_parts(current_uid: str | None, current_deleted: bool, current_rv: str,
                      meta: dict[str, Any], rv: str, deleted: bool) -> bool:
    """Whether a new snapshot (meta/rv/deleted) should replace the stored one (its uid,
    tombstone flag and resourceVersion)."""
    if (current_uid or "") != (meta.get("uid") or ""):
        return True  # another incarnation of the name: the newest event wins
    if current_deleted:
        return False  # a tombstone is final for this uid
    if deleted:
        return True
    return resource_version_newer(rv, current_rv)


def is_cas_conflict(err: Exception) -> bool:
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
    def __init__(self, kv: KeyValue, tombstone_ttl: float | None = None) -> None:
        self._kv = kv
        self.tombstone_ttl_s = tombstone_ttl or tombstone_ttl_s()

    @classmethod
    async def open(cls, js: JetStreamContext) -> "AppliedPlanStore":
        return cls(await js.key_value(APPLIED_BUCKET))

    async def read(self, key: str) -> Versioned:
        raw, revision = await read_entry(self._kv, key)
        if raw is None:
            return Versioned(None, revision)
        return Versioned(AppliedPlan.model_validate_json(raw), revision)

    async def compare_and_set(self, key: str, value: AppliedPlan, revision: int | None) -> int:
        """Writes ``value`` only if the entry is still at ``revision`` (None: must not exist)."""
        data = value.model_dump_json(by_alias=True).encode()
        _count(self._kv, "create" if revision is None else "update")
        try:
            return await _put(self._kv, key, data, revision, None)
        except Exception as err:
            if is_cas_conflict(err):
                raise CasConflict(key) from err
            raise

    async def delete(self, key: str) -> None:
        await _remove(self._kv, key, self.tombstone_ttl_s)


class Outcome(BaseModel):
    """The last planning or apply failure of a TrainJob (cleared when a later one succeeds)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)

    uid: str
    generation: int
    stage: str  # "plan" or "apply"
    reason: str
    message: str


class OutcomeStore:
    def __init__(self, kv: KeyValue, tombstone_ttl: float | None = None) -> None:
        self._kv = kv
        self.tombstone_ttl_s = tombstone_ttl or tombstone_ttl_s()

    @classmethod
    async def open(cls, js: JetStreamContext) -> "OutcomeStore":
        return cls(await js.key_value(OUTCOMES_BUCKET))

    async def get(self, key: str) -> Outcome | None:
        raw, _ = await read_entry(self._kv, key)
        if raw is None or raw == b"":
            return None
        try:
            return Outcome.model_validate_json(raw)
        except ValueError:
            return None

    async def set(self, key: str, outcome: Outcome) -> None:
        _count(self._kv, "put")
        revision = await self._kv.put(key, outcome.model_dump_json(by_alias=True).encode())
        if await BucketRequests.of(self._kv).checked():
            readfloor.raise_floor(self._kv._js._nc, self._kv._name, revision)

    async def clear(self, key: str, stage: str) -> None:
        current = await self.get(key)
        if current is not None and current.stage == stage:
            await _remove(self._kv, key, self.tombstone_ttl_s)
