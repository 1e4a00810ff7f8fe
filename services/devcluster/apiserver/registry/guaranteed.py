"""GuaranteedUpdate: a write without a client precondition is recomputed until its commit wins.

The store compares the resourceVersion a write was computed from at commit (``Store.put`` and
``Store.delete`` with ``expect_rv``); a writer that lost raises ``errors.StaleObject``. A
patch, a server-side apply, an unconditional update, a delete and the server's own controllers'
writes then read the new object and run again, as kube-apiserver's storage does: the client
gets 409 only when it named a resourceVersion (or a precondition) itself, which the recomputed
attempt finds stale. No lock is held across admission, so writers of one object never wait on
each other's webhooks, and the order per object is the store's wherever the writer runs.
"""
from __future__ import annotations

import logging
from typing import Awaitable, Callable, TypeVar

from ..errors import StaleObject
from ...storage.store import Key
from .options import WriteOptions

log = logging.getLogger("trainyard.devcluster.guaranteed")

T = TypeVar("T")
ObjectKey = tuple[Key, str, str]


async def guaranteed_update(key: ObjectKey, attempt: Callable[[], Awaitable[T]], opts: WriteOptions | None = None
                            ) -> T:
    """Run ``attempt`` until it does not lose a compare-and-swap on ``key``. A lost commit of
    another object inside it (a dependent the garbage collector writes) is that writer's answer,
    not a reason to run this write again. The warnings an attempt added to ``opts`` (unknown
    fields) and its audit annotations (admission's) are those of the attempt that commits, not
    repeated or kept from a lost attempt."""
    retries = 0
    warned = len(opts.warnings) if opts is not None else 0
    annotated = dict(opts.audit_annotations) if opts is not None else {}
    while True:
        try:
            return await attempt()
        except StaleObject as stale:
            if stale.key != key:
                raise
            if opts is not None:
                del opts.warnings[warned:]
                opts.audit_annotations.clear()  # the same dict the request's audit event reads
                opts.audit_annotations.update(annotated)
            retries += 1
            if retries % 100 == 0:
                log.warning("write of %s/%s lost %d commits in a row", key[1], key[2], retries)
