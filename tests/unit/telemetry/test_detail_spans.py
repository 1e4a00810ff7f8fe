"""Planning-phase and plugin spans are made only while some exporter sees them (#16): without
one, planning runs with no span of its own, and the spans that carry the trace context are
unaffected."""
from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from trainyard.pipeline import framework
from trainyard.telemetry import detail


def planned_span_names(on: bool) -> list[str]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    previous, original = detail.enabled(), framework._tracer
    detail.set_enabled(on)
    framework._tracer = tracer
    try:
        built = []
        plugin = framework.Plugin(name="Probe", enforce_ml_policy=lambda ctx: None,
                                  build=lambda ctx: built.append(1) or [{"kind": "ConfigMap"}])
        with tracer.start_as_current_span("consume"):
            objects = framework.run_planning([plugin], ctx=None)
        assert objects == [{"kind": "ConfigMap"}] and built == [1]
    finally:
        detail.set_enabled(previous)
        framework._tracer = original
    return [span.name for span in exporter.get_finished_spans()]


def test_phase_and_plugin_spans_only_when_detailed_spans_are_on() -> None:
    assert {"phase enforce_ml_policy", "Probe enforce_ml_policy", "phase build", "Probe build", "consume"} \
        <= set(planned_span_names(True))
    assert planned_span_names(False) == ["consume"]


def test_without_an_exporter_message_spans_still_carry_the_trace_and_the_trainjob() -> None:
    """No exporter: the per-message spans are not recorded, but a consumed message's trace goes
    on in what this process publishes (same trace id, a span id of its own), a watcher's
    observation starts a new trace, and the TrainJob's uid still travels as baggage."""
    from trainyard.bus.tracing import consume_span, inject_headers, publish_span
    from trainyard.telemetry.tracing import trainjob_span

    tracer = TracerProvider().get_tracer("test")
    trace_id, parent_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    previous = detail.enabled()
    detail.set_enabled(False)
    try:
        with consume_span("ty.events.c.TrainJob.ns.a", {"traceparent": f"00-{trace_id}-{parent_span}-01"}, "planner_c") as span:
            assert not span.is_recording()
            with publish_span("ty.desired.c.TrainJob.ns.a", "id-1"):
                _, sent_trace, sent_span, flags = inject_headers()["traceparent"].split("-")
        assert sent_trace == trace_id and sent_span != parent_span and flags == "01"
        with trainjob_span(tracer, "observe TrainJob", "uid-1", root=True):
            headers = inject_headers()
        assert headers["traceparent"].split("-")[1] not in (trace_id, "0" * 32)
        assert "trainjob.uid=uid-1" in headers.get("baggage", "")
    finally:
        detail.set_enabled(previous)
