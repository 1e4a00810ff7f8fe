"""bus.consumer.decoding: a subscription's handler is handed decoded envelopes; one that does not
decode is dead-lettered, never handed over."""
from __future__ import annotations

import pytest

from trainyard.bus.consumer import Delivery, PermanentError, decoding
from trainyard.bus.envelopes import ObjectEvent, encode


def delivery(data: bytes) -> Delivery:
    return Delivery(subject="ty.events.c.p0.TrainJob.ns.job", data=data, headers={}, num_delivered=1,
                    stream_sequence=7)


async def test_the_handler_gets_the_decoded_event_and_its_delivery() -> None:
    seen: list[tuple[ObjectEvent, Delivery]] = []

    async def handle(event: ObjectEvent, got: Delivery) -> None:
        seen.append((event, got))

    event = ObjectEvent.from_object("c", "ADDED", {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                                                   "metadata": {"namespace": "ns", "name": "job", "uid": "u1"}})
    sent = delivery(encode(event))
    await decoding(ObjectEvent, handle)(sent)
    assert [(e.name, e.uid, d.stream_sequence) for e, d in seen] == [("job", "u1", 7)]


@pytest.mark.parametrize("data", [b"not json", b'{"kind": "TrainJob"}', b"[]"])
async def test_a_message_that_does_not_decode_is_a_permanent_error_and_never_handled(data: bytes) -> None:
    async def handle(event: ObjectEvent, got: Delivery) -> None:
        raise AssertionError("handed a message that did not decode")

    with pytest.raises(PermanentError):
        await decoding(ObjectEvent, handle)(delivery(data))
