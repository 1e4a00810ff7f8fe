"""Stream and bucket replicas are a setting: 1 on a laptop, 3 on the NATS cluster of deploy/."""
from __future__ import annotations

import pytest

from trainyard.bus import topology


def test_one_copy_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(topology.REPLICAS_ENV, raising=False)
    assert {c.num_replicas for c in topology.stream_configs()} == {1}
    assert {b.replicas for b in topology.bucket_configs()} == {1}


def test_the_setting_reaches_every_stream_and_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(topology.REPLICAS_ENV, "3")
    streams, buckets = topology.stream_configs(), topology.bucket_configs()
    assert len(streams) == 5 and {c.num_replicas for c in streams} == {3}
    assert len(buckets) == 6 and {b.replicas for b in buckets} == {3}
    # Reads are checked direct gets (docs/bus.md, "Reads"); worker slots are read on the leader.
    assert {b.bucket for b in buckets if not b.direct} == {topology.SLOTS_BUCKET}
    assert {c.num_replicas for c in topology.stream_configs(replicas=5)} == {5}


@pytest.mark.parametrize("value,message", [
    ("three", "expected a number of replicas (1 to 5), got 'three'"),
    ("0", "must be between 1 and 5, got 0"),
    ("7", "must be between 1 and 5, got 7"),
])
def test_bad_values_name_the_setting(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"\$TRAINYARD_BUS_REPLICAS: " + message.replace("(", r"\(").replace(")", r"\)")):
        topology.replicas_setting({topology.REPLICAS_ENV: value})
