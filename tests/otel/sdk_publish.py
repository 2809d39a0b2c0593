"""Publish one CloudEvent to gridlet with the official Azure SDK (azure-eventgrid) with
OpenTelemetry tracing on (azure-core-tracing-opentelemetry, opentelemetry-sdk), and print the
SDK's finished spans as JSON lines. Usage: sdk_publish.py <topic events URL>."""

import json
import sys

from azure.core.credentials import AzureKeyCredential
from azure.core.messaging import CloudEvent
from azure.core.settings import settings
from azure.core.tracing.ext.opentelemetry_span import OpenTelemetrySpan
from azure.eventgrid import EventGridPublisherClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

settings.tracing_implementation = OpenTelemetrySpan
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

client = EventGridPublisherClient(sys.argv[1], AzureKeyCredential("sdk-test-key"))
with trace.get_tracer("gridlet-test").start_as_current_span("app"):
    client.send([CloudEvent(source="/sdk", type="sdk.test", data={"n": 1})])

for s in exporter.get_finished_spans():
    print(json.dumps({
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent_span_id": format(s.parent.span_id, "016x") if s.parent else "",
    }), flush=True)
