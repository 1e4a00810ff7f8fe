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
    assert event_subject(a, 3) != event_subject(b, 3)
    assert key_from_subject(event_subject(a, 3)) == a
    assert key_from_subject(event_subject(b, 3)) == b


def test_cluster_scoped_objects_use_the_empty_token():
    key = ObjectKey("prod", "ClusterTrainingRuntime", "", "torch-distributed")
    assert event_subject(key, None) == "ty.events.prod.all.ClusterTrainingRuntime._.torch-distributed"
    assert key_from_subject(event_subject(key, None)) == key


@given(st.text(min_size=1), st.text(), st.text(min_size=1))
def test_kv_keys_use_only_allowed_characters(cluster, namespace, name):
    key = kv_key(ObjectKey(cluster, "JobSet", namespace, name))
    assert set(key) <= KV_KEY_CHARS


def test_malformed_subject_is_a_clear_error():
    with pytest.raises(ValueError, match="cluster.partition.kind.namespace.name"):
        key_from_subject("ty.events.x")


def test_trainjob_and_children_share_the_partition_runtimes_reach_all() -> None:
    from trainyard.bus.envelopes import ObjectEvent
    from trainyard.bus.subjects import partition_of_subject, partitions_setting, plan_subject, result_subject

    owner = [{"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "name": "job", "uid": "u"}]
    trainjob = ObjectEvent.from_object("c", "ADDED", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                      "metadata": {"namespace": "ns", "name": "job", "uid": "u"}})
    jobset = ObjectEvent.from_object("c", "ADDED", {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                                                    "metadata": {"namespace": "ns", "name": "job", "uid": "j",
                                                                 "ownerReferences": owner}})
    runtime = ObjectEvent.from_object("c", "ADDED", {"apiVersion": "trainer.kubeflow.org/v1alpha1",
                                                     "kind": "ClusterTrainingRuntime", "metadata": {"name": "torch"}})
    home = partition_of_subject(trainjob.subject(8))
    assert home is not None and partition_of_subject(jobset.subject(8)) == home
    assert partition_of_subject(plan_subject("c", "ns", "job", home)) == home
    assert partition_of_subject(result_subject("c", "ns", "job", home)) == home
    assert partition_of_subject(runtime.subject(8)) is None
    assert partitions_setting({}) == 16 and partitions_setting({"TRAINYARD_PARTITIONS": "4"}) == 4
    with pytest.raises(ValueError, match=r"\$TRAINYARD_PARTITIONS: must be between 1 and 256, got 0"):
        partitions_setting({"TRAINYARD_PARTITIONS": "0"})
