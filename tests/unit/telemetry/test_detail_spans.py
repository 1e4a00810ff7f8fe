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
