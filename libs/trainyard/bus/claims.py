"""The ``ty_applied`` claim protocol: one applier at a time applies a TrainJob's plan, and a
plan made from an older generation never lands after a newer one (docs/bus.md, "Monotonic
plans"). The applier runs it; the planner reads the same entries (``AppliedPlan``).

Every write is a compare-and-set on the entry's revision: that, not which replica a
TrainJob's messages go to, is what keeps two appliers apart. A TrainJob's home replica is
normally the only writer of its entry, so the protocol remembers the entry it last wrote
(per partition, forgotten when the partition is handed over) and claims on that revision
without reading first; a conflict means someone else wrote, and it reads again.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from trainyard.bus.kv import AppliedPlan, AppliedPlanStore, CasConflict, Versioned
from trainyard.errortext import describe

log = logging.getLogger(__name__)

MAX_HASHES = 8  # plan hashes remembered per generation
KNOWN_PER_PARTITION = 4096  # entries remembered per partition (bounded)


class Busy(Exception):
    """Another applier holds a live claim on this TrainJob."""


class ClaimLost(Exception):
    """Our claim expired and another applier took the TrainJob over: stop applying."""


@dataclass
class Claim:
    revision: int
    previous: AppliedPlan | None
    entry: AppliedPlan
    renewed_at: float


@dataclass(frozen=True)
class Wanted:
    """What a claim is for: the plan of one TrainJob incarnation at one generation."""

    uid: str
    generation: int
    plan_hash: str
    inputs: str = ""


@dataclass
class ClaimProtocol:
    store: AppliedPlanStore
    holder: str
    lease_s: float = 30.0
    _known: dict[int, OrderedDict[str, Versioned]] = field(default_factory=dict)

    # -- per-partition memory of our own writes ------------------------------------------------

    def _remember(self, partition: int, key: str, value: AppliedPlan | None, revision: int | None) -> None:
        known = self._known.setdefault(partition, OrderedDict())
        known[key] = Versioned(value, revision)
        known.move_to_end(key)
        while len(known) > KNOWN_PER_PARTITION:
            known.popitem(last=False)

    def _forget(self, partition: int, key: str) -> None:
        self._known.get(partition, OrderedDict()).pop(key, None)

    def forget_partition(self, partition: int) -> None:
        """The partition went to another replica: what we wrote may no longer be current."""
        self._known.pop(partition, None)

    async def _read(self, partition: int, key: str, trust_memory: bool) -> Versioned:
        if trust_memory:
            known = self._known.get(partition, {}).get(key)
            if known is not None:
                return known
        current = await self.store.read(key)
        self._remember(partition, key, current.value, current.revision)
        return current

    # -- the protocol ------------------------------------------------------------------------

    async def claim(self, key: str, wanted: Wanted, partition: int = 0) -> Claim | str:
        """A live claim on ``key`` for ``wanted``, or the outcome that makes one unnecessary
        (``skipped-stale``, ``skipped-unchanged``). Waits (up to the lease) while another
        holder's claim is live; raises :class:`Busy` after that."""
        waited = 0.0
        delay = 0.02
        trust_memory = True
        while True:
            current = await self._read(partition, key, trust_memory)
            entry = current.value
            same = entry is not None and entry.uid == wanted.uid
            if same and entry.generation > wanted.generation:
                return "skipped-stale"
            if same and entry.generation == wanted.generation and entry.state == "applied" \
                    and wanted.plan_hash in (entry.hashes or [entry.plan_hash]):
                return "skipped-unchanged"
            if same and entry.claim_live() and entry.holder != self.holder:
                if waited > self.lease_s:
                    raise Busy(f"{key} claimed by {entry.holder}")
                await asyncio.sleep(delay)
                waited += delay
                delay = min(delay * 2, 0.5)
                trust_memory = False
                continue
            previous = entry if same else None
            if previous is not None and previous.state == "applying":
                # A dead holder's claim: what it had applied before is what we know (not
                # the inputs of the plan it was applying: that one may not have landed).
                previous = previous.model_copy(update={"state": "applied", "inputs": ""})
            claim = AppliedPlan(
                uid=wanted.uid, generation=wanted.generation, planHash=wanted.plan_hash, state="applying",
                holder=self.holder, claimExpires=time.time() + self.lease_s,
                owned=list(previous.owned) if previous else [],
                hashes=list(previous.hashes) if previous else [],
                inputs=wanted.inputs,
            )
            try:
                revision = await self.store.compare_and_set(key, claim, current.revision)
            except CasConflict:
                self._forget(partition, key)
                trust_memory = False
                continue
            self._remember(partition, key, claim, revision)
            return Claim(revision, previous, claim, time.monotonic())

    async def renew(self, key: str, claim: Claim, partition: int = 0) -> None:
        """Extends the claim's lease (every third of it) so a slow apply keeps it; a claim
        taken over meanwhile raises :class:`ClaimLost` before anything more is written."""
        if time.monotonic() - claim.renewed_at < self.lease_s / 3:
            return
        entry = claim.entry.model_copy(update={"claim_expires": time.time() + self.lease_s})
        try:
            claim.revision = await self.store.compare_and_set(key, entry, claim.revision)
        except CasConflict:
            self._forget(partition, key)
            raise ClaimLost(key) from None
        claim.entry = entry
        claim.renewed_at = time.monotonic()
        self._remember(partition, key, entry, claim.revision)

    async def finish(self, key: str, claim: Claim, done: AppliedPlan, partition: int = 0) -> bool:
        """Records the applied plan in place of the claim; False when the claim expired and
        someone else wrote meanwhile (then nothing is recorded)."""
        try:
            revision = await self.store.compare_and_set(key, done, claim.revision)
        except CasConflict:
            self._forget(partition, key)
            return False
        self._remember(partition, key, done, revision)
        return True

    async def release(self, key: str, claim: Claim, partition: int = 0) -> None:
        """Puts the entry back as it was before our claim (best effort; it also expires)."""
        previous = claim.previous or AppliedPlan(uid="", generation=0, planHash="")
        try:
            revision = await self.store.compare_and_set(key, previous, claim.revision)
        except Exception as err:
            self._forget(partition, key)
            log.warning("releasing claim on %s failed: %s", key, describe(err))
            return
        self._remember(partition, key, previous, revision)


def remembered_hashes(previous: AppliedPlan | None, wanted: Wanted) -> list[str]:
    """The plan hashes applied at ``wanted``'s generation, ``wanted``'s included (bounded)."""
    same_generation = previous is not None and previous.generation == wanted.generation
    hashes = list(previous.hashes) if same_generation and previous else []
    if wanted.plan_hash not in hashes:
        hashes.append(wanted.plan_hash)
    return hashes[-MAX_HASHES:]
