"""Worker slots reserved by delegated TrainJobs, shared by every dispatcher replica.

One ``ty_slots`` entry per (manager cluster, worker): ``<manager>.<worker>`` holds, for every
TrainJob that may run there, what its pods request and when the hold was taken. A hold is
taken before the TrainJob's placement (or its resumption) is written and is released when it
finishes, is suspended, deleted or moved. Every write is compare-and-set on the entry's
revision, so two replicas that both saw room for one more TrainJob cannot both take it: the
second write fails, re-reads the entry, and checks again against what the first one took.

Each process keeps the entries it read or wrote: a placement reads memory and makes one write;
an entry is read again only when a write finds it changed (another replica wrote), when it
says "no room" (so a stale copy never refuses a placement), and on each resync.
"""
from __future__ import annotations

import asyncio
import enum
import json
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from trainyard.bus.kv import is_cas_conflict, read_entry, write_entry
from trainyard.bus.subjects import encode_token
from trainyard.bus.topology import SLOTS_BUCKET
from trainyard.multicluster.placement import Amounts
from trainyard.telemetry import metrics

# A write that keeps meeting other replicas' writes gives up after this many tries (each try
# means another replica made progress on the same worker).
MAX_TRIES = 64


@dataclass
class Holds:
    """One worker's entry as last read or written by this process."""

    revision: int | None = None  # None: no entry yet
    holds: dict[str, tuple[Amounts, float]] = field(default_factory=dict)  # "ns/name" -> (need, taken at)
    total: Amounts = field(default_factory=dict)
    removals: int = 0  # holds this process saw go away (placement recounts pods then)


class Reservation(enum.IntEnum):
    """What ``reserve`` did; false only when refused. A hold is one per TrainJob, whoever took
    it: ``ALREADY_HELD`` means another pass (maybe another replica's, racing this one) holds it,
    so only a pass that ``TOOK`` it may give it back when its placement write fails."""

    REFUSED = 0
    ALREADY_HELD = 1
    TOOK = 2


def hold_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _encode(holds: dict[str, tuple[Amounts, float]]) -> bytes:
    return json.dumps({"holds": {key: {"need": {res: str(amount) for res, amount in need.items()}, "at": at}
                                 for key, (need, at) in holds.items()}},
                      separators=(",", ":"), sort_keys=True).encode()


def _decode(raw: bytes | None) -> dict[str, tuple[Amounts, float]]:
    if not raw:
        return {}
    doc = json.loads(raw)
    return {key: ({res: Fraction(amount) for res, amount in (entry.get("need") or {}).items()},
                  float(entry.get("at") or 0.0))
            for key, entry in (doc.get("holds") or {}).items()}


def _sum(holds: dict[str, tuple[Amounts, float]]) -> Amounts:
    total: Amounts = {}
    for need, _ in holds.values():
        for res, amount in need.items():
            total[res] = total.get(res, Fraction(0)) + amount
    return total


class SlotLedger:
    def __init__(self, kv: KeyValue, cluster: str) -> None:
        self.kv = kv
        self.cluster = cluster
        self._entries: dict[str, Holds] = {}
        # One read-check-write at a time per worker in this process: concurrent placements of
        # one replica would otherwise mostly fail each other's compare-and-set.
        self._locks: dict[str, asyncio.Lock] = {}
        self.conflicts = 0  # writes that found another replica's write first

    @classmethod
    async def open(cls, js: JetStreamContext, cluster: str) -> "SlotLedger":
        return cls(await js.key_value(SLOTS_BUCKET), cluster)

    def _key(self, worker: str) -> str:
        return f"{encode_token(self.cluster)}.{encode_token(worker)}"

    def cached(self, worker: str) -> Holds:
        return self._entries.get(worker) or Holds()

    def holds(self, worker: str, key: str) -> bool:
        return key in self.cached(worker).holds

    async def read(self, worker: str) -> Holds:
        raw, revision = await read_entry(self.kv, self._key(worker))
        holds = _decode(raw)
        previous = self._entries.get(worker)
        removals = previous.removals if previous else 0
        if previous is not None and any(key not in holds for key in previous.holds):
            removals += 1
        entry = Holds(revision, holds, _sum(holds), removals)
        self._entries[worker] = entry
        return entry

    async def _change(self, worker: str, change: Callable[[Holds], dict[str, tuple[Amounts, float]] | None],
                      fresh: bool = False) -> bool:
        """Applies ``change`` (the new holds, or None for "nothing to write") with compare-and-
        set, re-reading the entry after a conflict. ``fresh``: read it first."""
        lock = self._locks.setdefault(worker, asyncio.Lock())
        async with lock:
            entry = await self.read(worker) if fresh or worker not in self._entries else self._entries[worker]
            for _ in range(MAX_TRIES):
                wanted = change(entry)
                if wanted is None:
                    return False
                try:
                    revision = await write_entry(self.kv, self._key(worker), _encode(wanted), entry.revision, None)
                except Exception as err:
                    if not is_cas_conflict(err):
                        raise
                    self.conflicts += 1
                    metrics.SLOT_WRITE_CONFLICTS.inc()
                    entry = await self.read(worker)
                    continue
                removed = any(key not in wanted for key in entry.holds)
                self._entries[worker] = Holds(revision, wanted, _sum(wanted), entry.removals + int(removed))
                return True
            raise RuntimeError(f"slots of worker {worker}: {MAX_TRIES} compare-and-set conflicts in a row")

    async def reserve(self, worker: str, key: str, need: Amounts,
                      fits: Callable[[Amounts], bool] | None) -> Reservation:
        """Holds ``need`` on ``worker`` for ``key`` if ``fits(what the worker's holds total)``
        (``fits`` None: unconditionally, for a TrainJob already running there). True when held
        (already, or now)."""
        refused: list[bool] = []

        def change(entry: Holds) -> dict[str, tuple[Amounts, float]] | None:
            if key in entry.holds:
                return None
            if fits is not None and not fits(entry.total):
                refused.append(True)
                return None
            return {**entry.holds, key: (dict(need), time.time())}

        if await self._change(worker, change):
            return Reservation.TOOK
        if refused and fits is not None:
            # No room in what this process last saw: ask once more (another replica may have
            # released since) before saying so.
            refused.clear()
            if await self._change(worker, change, fresh=True):
                return Reservation.TOOK
        return Reservation.REFUSED if refused else Reservation.ALREADY_HELD

    async def release(self, worker: str, key: str) -> bool:
        """Drops ``key``'s hold on ``worker``; True when there was one."""
        return await self._change(worker, lambda entry: {k: v for k, v in entry.holds.items() if k != key}
                                  if key in entry.holds else None, fresh=not self.holds(worker, key))

    async def prune(self, worker: str, stale: Callable[[str, float], bool]) -> int:
        """Drops the holds ``stale(key, taken_at)`` names, after reading the entry afresh."""
        dropped: list[str] = []

        def change(entry: Holds) -> dict[str, tuple[Amounts, float]] | None:
            dropped[:] = [key for key, (_, at) in entry.holds.items() if stale(key, at)]
            if not dropped:
                return None
            return {k: v for k, v in entry.holds.items() if k not in dropped}

        return len(dropped) if await self._change(worker, change, fresh=True) else 0
