"""Read floors: per replicated bucket, the highest stream sequence a process knows was
acknowledged there, so that a read answered by any copy can be checked (docs/bus.md, "Reads").

A replicated bucket's direct gets may be answered by a copy that has not yet stored a write
just acknowledged; nats-server (2.15 included) has no server-side read-after-write for direct
gets. A batched direct get (``multi_last``) ends with the answering copy's last sequence
(``Nats-UpTo-Sequence``); when that is at least the reader's floor, the copy holds every write
the reader depends on, otherwise the reader asks the stream leader. A floor rises with the
process's own writes (their acknowledgements), the entries it read, and the floors other
processes stamp on the messages they publish (header ``Trainyard-Kv-Seq``), which the
consumer merges before handling a message: a write that happened before a message was
published is visible to whoever handles it (causal read-your-writes).

Floors are kept per NATS connection: sequences of one JetStream are meaningless on another.
"""
from __future__ import annotations

import weakref
from typing import Any

HEADER = "Trainyard-Kv-Seq"

_FLOORS: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()


def floor(nc: Any, bucket: str) -> int:
    """The bucket's floor on this connection (0: nothing known)."""
    known = _FLOORS.get(nc)
    return known.get(bucket, 0) if known else 0


def raise_floor(nc: Any, bucket: str, sequence: int) -> None:
    known = _FLOORS.get(nc)
    if known is None:
        known = _FLOORS[nc] = {}
    if sequence > known.get(bucket, 0):
        known[bucket] = sequence


def header_value(nc: Any) -> str:
    """``bucket=seq,...`` of every floor known on this connection ("" when none: a single-copy
    bus keeps no floors and publishes no header)."""
    known = _FLOORS.get(nc)
    if not known:
        return ""
    return ",".join(f"{bucket}={sequence}" for bucket, sequence in known.items())


def merge_header(nc: Any, value: str | None) -> None:
    """Raises this connection's floors to those a message carries; a malformed part is ignored
    (the floor is a performance and freshness hint on top of compare-and-set, never trusted for
    anything else)."""
    if not value:
        return
    for part in value.split(","):
        bucket, _, sequence = part.partition("=")
        if bucket and sequence.isdigit():
            raise_floor(nc, bucket, int(sequence))
