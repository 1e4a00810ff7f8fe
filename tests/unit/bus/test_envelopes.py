import pytest

from trainyard.bus.envelopes import (
    EnvelopeError, ObjectEvent, PlanMessage, decode, encode,
)


def trainjob(rv="7"):
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": "my.job", "namespace": "ns", "uid": "u1",
                     "resourceVersion": rv, "generation": 2},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }


def test_event_round_trips_with_camel_case_on_the_wire():
    event = ObjectEvent.from_object("c1", "ADDED", trainjob())
    data = encode(event)
    assert b'"resourceVersion":"7"' in data and b'"v":1' in data
    assert decode(ObjectEvent, data) == event


def test_the_same_change_has_the_same_msg_id_and_another_change_does_not():
    first = ObjectEvent.from_object("c1", "MODIFIED", trainjob("7"))
    again = ObjectEvent.from_object("c1", "MODIFIED", trainjob("7"))
    later = ObjectEvent.from_object("c1", "MODIFIED", trainjob("8"))
    assert first.msg_id() == again.msg_id() != later.msg_id()


def test_unknown_version_is_rejected_not_guessed():
    data = encode(ObjectEvent.from_object("c1", "ADDED", trainjob())).replace(b'"v":1', b'"v":9')
    with pytest.raises(EnvelopeError, match="unsupported ObjectEvent version v=9"):
        decode(ObjectEvent, data)


def test_garbage_names_the_missing_field():
    with pytest.raises(EnvelopeError, match="invalid PlanMessage: .*planHash"):
        decode(PlanMessage, b'{"v":1,"cluster":"c","namespace":"n","name":"x","uid":"u","generation":1}')
    with pytest.raises(EnvelopeError, match="invalid ObjectEvent"):
        decode(ObjectEvent, b"not json")
