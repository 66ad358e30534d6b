"""Traces, on OpenTelemetry's SDK: a span per agent request, per model round and per declared call, sent over OTLP.

    POST /v1/chat/completions    SERVER    child of the agent's span when it sends `traceparent` (W3C)
      ├─ chat {model}            CLIENT    one per model round; its `traceparent` goes to the model server
      └─ execute_tool {tool}     INTERNAL  one per declared call, from the check to the record: decision, status

Tracing is on when --otlp-endpoint is set or the standard variables ask for it
(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_TRACES_EXPORTER=otlp); the SDK (the
`otel` extra) is imported then only. Off, no SDK is imported and no span made: the hot path tests one None.
The SDK reads the rest from its variables: OTEL_SERVICE_NAME (default toolkeeper), OTEL_RESOURCE_ATTRIBUTES,
OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _COMPRESSION, _CERTIFICATE, OTEL_BSP_*, OTEL_TRACES_SAMPLER. Spans
leave in batches from the SDK's thread: a collector that is down loses spans, never calls.

The engine carries a `RequestTrace` on its TurnContext without knowing what it is made of.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkeeper.audit import ExecutionRecord

PROTOCOLS = {"http/protobuf": "opentelemetry-exporter-otlp-proto-http",
             "grpc": "opentelemetry-exporter-otlp-proto-grpc"}
TRACE_HEADERS = ("traceparent", "tracestate")
FAILED = ("failed", "timeout", "interrupted")  # a declared call's statuses that are errors (a denial is none)
INSTALL = "pip install 'toolkeeper[otel]'"
# The open model round's trace headers, for the model server's request (one handler task per agent request).
ROUND: ContextVar[dict[str, str] | None] = ContextVar("toolkeeper_round_trace", default=None)


class TracingUnavailable(ValueError):
    """Tracing is asked for and cannot be done: serve says so and does not start."""


def tracing_on(endpoint: str | None, environ: Mapping[str, str]) -> bool:
    """Whether traces are sent: OpenTelemetry's variables read as the SDK reads them (OTEL_SDK_DISABLED=true:
    none at all); an exporter toolkeeper does not send to is said, not ignored."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [name for name in environ.get("OTEL_TRACES_EXPORTER", "").replace(" ", "").split(",") if name]
    unknown = [name for name in exporters if name not in ("otlp", "none")]
    if unknown:
        raise TracingUnavailable(f"OTEL_TRACES_EXPORTER={','.join(unknown)}: toolkeeper sends traces to an OTLP "
                                 "collector only (otlp, or none for no traces)")
    if endpoint or "otlp" in exporters:
        return True
    return "none" not in exporters and bool(environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                                            or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def protocol_of(setting: str | None, environ: Mapping[str, str]) -> str:
    protocol = (setting or environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf")
    if protocol not in PROTOCOLS:
        raise TracingUnavailable(f"OTLP protocol {protocol!r}: toolkeeper sends traces over "
                                 f"{' or '.join(PROTOCOLS)}")
    return protocol


def check(endpoint: str | None, protocol: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether tracing is on; raises TracingUnavailable when it is and the SDK is missing. Nothing is imported:
    a supervisor checks before it forks its workers."""
    environ = os.environ if environ is None else environ
    if not tracing_on(endpoint, environ):
        return False
    import importlib.metadata  # only when tracing is on: it costs every start (`toolkeeper mcp`) 20 ms

    for package in ("opentelemetry-sdk", PROTOCOLS[protocol_of(protocol, environ)]):
        try:
            importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            raise TracingUnavailable(f"tracing is on (--otlp-endpoint or OTEL_* variables) but {package} is not "
                                     f"installed: {INSTALL}") from None
    return True


def with_trace(headers: dict[str, str]) -> dict[str, str]:
    """A model request's headers with the open round's trace headers in place of the agent's (tracing on)."""
    carrier = ROUND.get()
    if carrier is None:
        return headers
    return {**{name: value for name, value in headers.items() if name.lower() not in TRACE_HEADERS}, **carrier}


class Tracing:
    """The tracer of one app, its spans batched to the collector by the SDK."""

    def __init__(self, provider: Any):
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("toolkeeper")
        self.propagator = TraceContextTextMapPropagator()

    @classmethod
    def start(cls, endpoint: str | None, protocol: str | None, version: str,
              environ: Mapping[str, str] | None = None) -> Tracing | None:
        """The app's tracing, or None when it is off."""
        environ = os.environ if environ is None else environ
        if not check(endpoint, protocol, environ):
            return None
        try:
            from opentelemetry.sdk.resources import OTELResourceDetector, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            exporter = _exporter(endpoint, protocol_of(protocol, environ))
        except ImportError as exc:
            raise TracingUnavailable(f"tracing is on but OpenTelemetry's SDK cannot be imported ({exc}): "
                                     f"{INSTALL}") from None
        ours = {"service.name": "toolkeeper", "service.version": version, "host.name": socket.gethostname(),
                "process.pid": os.getpid()}
        provider = TracerProvider(resource=Resource.create(ours).merge(OTELResourceDetector().detect()))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        return cls(provider)

    def request(self, name: str, headers: Mapping[str, str], route: str) -> contextlib.AbstractContextManager[
            RequestTrace]:
        """One agent request's span, child of the agent's when its headers carry one."""
        return self._served(name, headers, {"http.request.method": name.split(" ", 1)[0], "http.route": route})

    def mcp_call(self, tool: str, carrier: Mapping[str, str]) -> contextlib.AbstractContextManager[RequestTrace]:
        """One MCP `tools/call`'s span (OpenTelemetry's MCP conventions), child of the client's: from its HTTP
        headers, or its request's `_meta` (`traceparent`), where MCP carries it."""
        return self._served(f"tools/call {tool}", carrier, {"mcp.method.name": "tools/call",
                                                             "gen_ai.tool.name": tool})

    @contextlib.contextmanager
    def _served(self, name: str, carrier: Mapping[str, str], attributes: dict[str, Any]) -> Iterator[RequestTrace]:
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(carrier)
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        trace = RequestTrace(self, span)
        try:
            yield trace
        except BaseException as exc:
            trace.failed(exc)
            raise
        finally:
            trace.end()

    def shutdown(self) -> None:
        """The spans still batched sent (blocking: run it off the event loop), the exporter closed."""
        self.provider.shutdown()


def _exporter(endpoint: str | None, protocol: str) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)  # http://host:4317 is sent in the clear, https:// over TLS
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    if endpoint and not endpoint.rstrip("/").endswith("/v1/traces"):  # --otlp-endpoint names the collector
        endpoint = endpoint.rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint)


class RequestTrace:
    """One agent request's span, and what the engine hangs under it: its model rounds and declared calls."""

    def __init__(self, tracing: Tracing, span: Any):
        from opentelemetry import trace

        self.tracing = tracing
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.rounds: list[RoundSpan] = []  # open: a round that never answered ends with the request

    def answered(self, response: Any) -> Any:
        """The response, its status said on the span."""
        self.span.set_attribute("http.response.status_code", response.status)
        if response.status >= 500:
            self._error(f"answered {response.status}")
        return response

    def round(self) -> RoundSpan:
        """A model round begins: its span, whose trace headers the model server's request carries."""
        from opentelemetry.trace import SpanKind

        span = self.tracing.tracer.start_span("chat", context=self.context, kind=SpanKind.CLIENT,
                                              attributes={"gen_ai.operation.name": "chat"})
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, context=_in_context(span))
        ROUND.set(carrier)
        opened = RoundSpan(span)
        self.rounds.append(opened)
        return opened

    def tool(self, record: ExecutionRecord) -> None:
        """A declared call, from its record once settled: from the record's time to now."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": record.tool,
            "gen_ai.tool.call.id": record.call_id, "gen_ai.tool.type": "function",
            "toolkeeper.decision": record.decision, "toolkeeper.decision.source": record.decision_source,
            "toolkeeper.status": record.status, "toolkeeper.record_id": record.record_id,
            "toolkeeper.request_id": record.request_id}
        if record.decision_rule:
            attributes["toolkeeper.rule"] = record.decision_rule
        if record.exit_code is not None:
            attributes["toolkeeper.exit_code"] = record.exit_code
        span = self.tracing.tracer.start_span(f"execute_tool {record.tool}", context=self.context,
                                              kind=SpanKind.INTERNAL, attributes=attributes,
                                              start_time=int(record.time * 1e9))
        if record.status in FAILED:
            span.set_status(Status(StatusCode.ERROR, record.status))
        span.end()

    def failed(self, exc: BaseException) -> None:
        if isinstance(exc, Exception):
            self.span.record_exception(exc)
        self._error("the agent went away" if not isinstance(exc, Exception) else type(exc).__name__)

    def end(self) -> None:
        for opened in self.rounds:
            opened.unanswered()
        ROUND.set(None)
        self.span.end()

    def _error(self, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self.span.set_status(Status(StatusCode.ERROR, description))


class RoundSpan:
    """One model round's span: ended by its answer, or by the request's end when none came."""

    def __init__(self, span: Any):
        self.span = span
        self.ended = False

    def answered(self, head: dict[str, Any] | None, usage: dict[str, Any] | None) -> None:
        """The round's answer: the model that gave it and the tokens it took."""
        model = (head or {}).get("model")
        if model:
            self.span.update_name(f"chat {model}")
            self.span.set_attribute("gen_ai.response.model", str(model))
        usage = usage or {}
        for name, keys in (("input", ("input_tokens", "prompt_tokens")),
                           ("output", ("output_tokens", "completion_tokens"))):
            tokens = next((usage[key] for key in keys if isinstance(usage.get(key), int)), None)
            if tokens is not None:
                self.span.set_attribute(f"gen_ai.usage.{name}_tokens", tokens)
        self._end()

    def unanswered(self) -> None:
        if not self.ended:
            from opentelemetry.trace import Status, StatusCode

            self.span.set_status(Status(StatusCode.ERROR, "the round ended without an answer"))
            self._end()

    def _end(self) -> None:
        if not self.ended:
            self.ended = True
            ROUND.set(None)
            self.span.end()


def _in_context(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)
