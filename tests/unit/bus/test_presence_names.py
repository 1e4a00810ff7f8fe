"""A presence's consumer name gives its replica back, for any replica name, and never one of
another role or cluster (trainyard.bus.presence)."""
from __future__ import annotations

import re

from trainyard.bus.presence import presence_name, presence_prefix, replica_of


def test_a_presence_name_gives_its_replica_back_and_is_a_valid_consumer_name() -> None:
    for replica in ("0f3a9c1b2d4e", "planner-7d9f8-x2k", "r", "h", "a.b c/d", "ünï", "x" * 80):
        name = presence_name("planner", "default", replica)
        # JetStream consumer names: no whitespace, '.', '*', '>', path separators.
        assert re.fullmatch(r"[A-Za-z0-9_-]+", name), name
        assert replica_of(name, presence_prefix("planner", "default")) == replica


def test_a_presence_of_another_role_or_cluster_is_not_counted() -> None:
    name = presence_name("applier", "default", "r1")
    assert replica_of(name, presence_prefix("planner", "default")) is None
    assert replica_of(presence_name("planner", "w1", "r1"), presence_prefix("planner", "default")) is None
    assert replica_of("applier-p0_default", presence_prefix("planner", "default")) is None
