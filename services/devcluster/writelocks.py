"""One write at a time per object: the read-check-admit-store sequence of a write is atomic.

A write reads the stored object, checks its preconditions (resourceVersion, uid), awaits
admission webhooks and only then stores. Without this, two writes of one object could both
pass the resourceVersion check while the webhook is called and both be stored: the second
would silently overwrite the first instead of answering 409 Conflict, as kube-apiserver
(whose storage compares the resourceVersion at commit) does. Serialising writes of the
same object gives that guarantee, and a patch without a precondition is applied to the
object as the previous write left it.
"""
from __future__ import annotations

from trainyard.keyed_locks import KeyedLocks


class ObjectWriteLocks(KeyedLocks):
    """Keyed by (storage key, namespace, name)."""
