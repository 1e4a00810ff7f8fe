import pytest
from hypothesis import given, strategies as st

from trainyard.bus.subjects import (
    ObjectKey, decode_token, encode_token, event_subject, key_from_subject, kv_key,
)

KV_KEY_CHARS = set("-/_=.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


@given(st.text())
def test_any_value_round_trips_and_is_one_safe_token(value):
    token = encode_token(value)
    assert decode_token(token) == value
    assert token and "." not in token and "*" not in token and ">" not in token
    assert not any(c.isspace() for c in token)


def test_dotted_names_stay_distinct_from_namespace_boundaries():
    a = ObjectKey("c1", "TrainJob", "a.b", "c")
    b = ObjectKey("c1", "TrainJob", "a", "b.c")
    assert event_subject(a) != event_subject(b)
    assert key_from_subject(event_subject(a)) == a
    assert key_from_subject(event_subject(b)) == b


def test_cluster_scoped_objects_use_the_empty_token():
    key = ObjectKey("prod", "ClusterTrainingRuntime", "", "torch-distributed")
    assert event_subject(key) == "ty.events.prod.ClusterTrainingRuntime._.torch-distributed"
    assert key_from_subject(event_subject(key)) == key


@given(st.text(min_size=1), st.text(), st.text(min_size=1))
def test_kv_keys_use_only_allowed_characters(cluster, namespace, name):
    key = kv_key(ObjectKey(cluster, "JobSet", namespace, name))
    assert set(key) <= KV_KEY_CHARS


def test_malformed_subject_is_a_clear_error():
    with pytest.raises(ValueError, match="cluster.kind.namespace.name"):
        key_from_subject("ty.events.x")
