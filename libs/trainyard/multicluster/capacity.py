"""A worker's capacity summary, kept from a watch of its Nodes and Pods.

The summary is what placement reads: what the worker's Ready, schedulable nodes allocate, and
what its non-terminal pods request summed per owning JobSet. Each watch event changes it by one
node's or one pod's share (the pod's own previous share is kept to take it back), so keeping it
costs per change, not per pod of the worker, and a placement never lists anything.
"""
from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

from trainyard.kube import resources as r
from trainyard.kube.resources import Resource
from trainyard.multicluster.placement import Amounts, Owner, node_allocatable, pod_use_by_owner

ObjectKey = tuple[str, str]


def _key(obj: dict[str, Any]) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def _shift(total: dict[Owner, Amounts], owner: Owner, amounts: Amounts, sign: int) -> None:
    bucket = total.setdefault(owner, {})
    for name, amount in amounts.items():
        bucket[name] = bucket.get(name, Fraction(0)) + sign * amount
    if all(amount == 0 for amount in bucket.values()):
        del total[owner]


class CapacitySummary:
    """The handler of a worker's Node and Pod list+watch (trainyard.kube.watch)."""

    def __init__(self, changed: Callable[[Amounts, dict[Owner, Amounts]], None]) -> None:
        self._changed = changed  # called with (allocatable, pod use per owner) after each change
        self._nodes: dict[str, Amounts] = {}
        self._pods: dict[ObjectKey, tuple[Owner, Amounts]] = {}
        self._use: dict[Owner, Amounts] = {}
        self.synced: set[str] = set()  # the resources listed at least once

    def _allocatable(self) -> Amounts:
        total: Amounts = {}
        for amounts in self._nodes.values():
            for name, amount in amounts.items():
                total[name] = total.get(name, Fraction(0)) + amount
        return total

    def _publish(self) -> None:
        if self.synced >= {r.NODE.plural, r.POD.plural}:
            self._changed(self._allocatable(), self._use)

    @staticmethod
    def _pod_share(pod: dict[str, Any]) -> tuple[Owner, Amounts] | None:
        use = pod_use_by_owner([pod])
        return next(iter(use.items()), None)  # None: terminal, it requests nothing

    async def on_relist(self, resource: Resource, items: list[dict], resource_version: str) -> None:
        if resource.plural == r.NODE.plural:
            self._nodes = {_key(node)[1]: node_allocatable([node]) for node in items}
        else:
            self._pods = {}
            for pod in items:
                share = self._pod_share(pod)
                if share is not None:
                    self._pods[_key(pod)] = share
            self._use = pod_use_by_owner(items)
        self.synced.add(resource.plural)
        self._publish()

    async def on_event(self, resource: Resource, event_type: str, obj: dict) -> None:
        if resource.plural == r.NODE.plural:
            if event_type == "DELETED":
                self._nodes.pop(_key(obj)[1], None)
            else:
                self._nodes[_key(obj)[1]] = node_allocatable([obj])
        else:
            key = _key(obj)
            previous = self._pods.pop(key, None)
            if previous is not None:
                _shift(self._use, previous[0], previous[1], -1)
            share = None if event_type == "DELETED" else self._pod_share(obj)
            if share is not None:
                self._pods[key] = share
                _shift(self._use, share[0], share[1], 1)
        self._publish()
