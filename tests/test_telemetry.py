"""Telemetry: /metrics on prometheus_client (one page for every worker, every series from the start, labels escaped
and bounded) and traces on OpenTelemetry's SDK, sent to in-process OTLP collector stand-ins over HTTP and gRPC."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import LOOKUP, ROOT, YOLO, Toolkeeper, audit_cli, call, start_toolkeeper, user, write_agent
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from toolkeeper.metrics import CAP, OTHER, Metrics

AGENT = YOLO + LOOKUP
REQUESTS = "toolkeeper_requests_total"
ANSWERED = {"api": "chat", "code": "200", "stream": "false"}
AGENT_TRACE, AGENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def scrape(base: str) -> dict[tuple[str, frozenset], float]:
    """One scrape of /metrics, parsed by prometheus_client's own parser: {(sample, labels): value}."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as answer:
        assert answer.headers["Content-Type"] == CONTENT_TYPE_LATEST
        text = answer.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def ask(base: str, messages: list[dict], path: str = "/v1/chat/completions") -> dict:
    """One request on a connection of its own, so the kernel hands it to any worker."""
    request = urllib.request.Request(base + path, method="POST",
                                     data=json.dumps({"model": "m", "messages": messages}).encode(),
                                     headers={"Authorization": "Bearer sk-telemetry", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.fixture
def agent(tmp_path) -> Path:
    write_agent(tmp_path, AGENT)
    return tmp_path


# -- metrics ----------------------------------------------------------------------------------------------------


def test_every_series_is_there_from_the_start_at_zero(scripted, agent):
    (agent / "rules.yaml").write_text("rules:\n  - id: would-deny-lookups\n    mode: shadow\n    effect: deny\n"
                                      "    reason: measured first\n    when: {tool: lookup}\n")
    process = start_toolkeeper(agent / "agent.yaml", scripted.base_url, "--policy", str(agent / "rules.yaml"))
    try:
        base = process.url.removesuffix("/v1")
        samples = scrape(base)
        for api in ("chat", "responses", "messages"):
            for stream in ("false", "true"):
                assert value(samples, REQUESTS, api=api, code="200", stream=stream) == 0
            assert value(samples, "toolkeeper_upstream_errors_total", api=api, status="502") == 0
        for status in ("ok", "failed", "timeout", "denied", "invalid"):
            assert value(samples, "toolkeeper_declared_calls_total", status=status, tool="lookup") == 0
        assert value(samples, "toolkeeper_tool_seconds_count", tool="lookup") == 0
        assert value(samples, "toolkeeper_decisions_total", effect="deny", source="rules") == 0
        assert value(samples, "toolkeeper_shadow_matches_total", effect="deny", rule="would-deny-lookups") == 0
        for outcome in ("hit", "miss"):
            assert value(samples, "toolkeeper_history_restorations_total", outcome=outcome) == 0
        for endpoint in ("realtime", "assistants_runs", "batches", "websocket", "completions_with_tools"):
            assert value(samples, "toolkeeper_ungoverned_refused_total", endpoint=endpoint) == 0
        assert value(samples, "toolkeeper_unspoken_requests_total", endpoint="completions") == 0
        for name in ("toolkeeper_model_rounds_total", "toolkeeper_approvals_waiting",
                     "toolkeeper_audit_write_failures_total", "toolkeeper_upstream_seconds_count",
                     "toolkeeper_approval_wait_seconds_count"):
            assert value(samples, name) == 0, name

        scripted.script({"status": 503, "body": {"error": {"message": "overloaded", "type": "server_error"}}})
        with pytest.raises(urllib.error.HTTPError):
            ask(base, user())
        samples = scrape(base)
        assert value(samples, "toolkeeper_upstream_errors_total", api="chat", status="503") == 1
        assert value(samples, REQUESTS, api="chat", code="503", stream="false") == 1
    finally:
        process.stop()


def test_one_scrape_counts_every_worker_and_what_a_dead_one_counted(scripted, agent):
    scripted.script({"answering": False, "repeat": True, "tool_calls": [call("lookup", {"word": "w"})]},
                    {"answering": True, "repeat": True, "content": "{tool_result}"})
    process = start_toolkeeper(agent / "agent.yaml", scripted.base_url, "--workers", "2", "--consent", "none")
    try:
        base = process.url.removesuffix("/v1")
        samples = scrape(base)  # every worker's series, there from the start
        assert value(samples, REQUESTS, **ANSWERED) == 0 and value(samples, "toolkeeper_approvals_waiting") == 0
        assert value(samples, "toolkeeper_declared_calls_total", status="ok", tool="lookup") == 0
        sent, pids = 0, set()
        while len(pids) < 2 and sent < 36:  # until both workers answered some: a new connection each
            for _ in range(6):
                ask(base, user())
            sent += 6
            pids = {record["pid"] for record in records(agent)}
        assert len(pids) == 2
        for _ in range(2):  # any worker's page: all of them
            samples = scrape(base)
            assert value(samples, REQUESTS, **ANSWERED) == sent
            assert value(samples, "toolkeeper_model_rounds_total") == 2 * sent
            assert value(samples, "toolkeeper_declared_calls_total", status="ok", tool="lookup") == sent
            assert value(samples, "toolkeeper_tool_seconds_count", tool="lookup") == sent

        os.kill(min(pids), signal.SIGKILL)  # what it counted stays; the worker started again counts on
        deadline = time.monotonic() + 20
        while len(children(process.popen.pid)) < 2 or min(pids) in children(process.popen.pid):
            assert time.monotonic() < deadline, "the worker was not started again"
            time.sleep(0.2)
        time.sleep(1.5)  # the new worker's app built (or failed, which the supervisor would say)
        for _ in range(4):
            ask(base, user())
        assert value(scrape(base), REQUESTS, **ANSWERED) == sent + 4
        assert "worker failed" not in process.stderr()
    finally:
        process.stop()


def records(directory: Path) -> list[dict]:
    done = audit_cli(directory / "toolkeeper-audit.sqlite3", "export", "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def children(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


FORGED = ("/v1/chat/completions/x%22,api=%22forged%22,code=%22200", "/v1/x%0Ay", "/v1/x%5C", "/v1/%22",
          "/v1/completions%5C", "/v1/realtime/x%22", "/v1/realtime/x%22%5C")  # the last: a backslash, refused as such


def test_labels_from_outside_are_escaped_and_never_forge_a_series(scripted, agent):
    process = start_toolkeeper(agent / "agent.yaml", scripted.base_url)
    tk = Toolkeeper(process, agent)
    try:
        base = process.url.removesuffix("/v1")
        host, port = base.removeprefix("http://").split(":")
        for path in FORGED:
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            connection.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
            connection.getresponse().read()
            connection.close()
        kind = 'x",api="forged\n\\_call'  # a call of a kind toolkeeper does not know, as the model names it
        scripted.script({"content": "Going. ", "items": [{"type": kind, "call_id": "c1"}]}, {"content": "No."})
        tk.client().responses.create(model="m", input="Go.")
        samples = scrape(base)  # the parser takes the whole page
        assert value(samples, "toolkeeper_unknown_calls_total", kind=kind) == 1
        assert value(samples, "toolkeeper_ungoverned_refused_total", endpoint="realtime") == 1
        every = {dict(labels).get("api") for _, labels in samples} - {None}
        assert every == {"chat", "responses", "messages"}
        endpoints = {dict(labels)["endpoint"] for _, labels in samples if "endpoint" in dict(labels)}
        assert endpoints <= {"realtime", "assistants_runs", "batches", "stored_chat_completions", "websocket",
                             "completions_with_tools", "responses_compact", "completions"}
    finally:
        tk.close_clients()
        process.stop()


def test_outside_values_past_the_cap_count_as_other_and_apps_in_one_process_keep_their_own():
    first, second = Metrics(), Metrics()
    for number in range(CAP + 5):
        first.count("toolkeeper_unknown_calls_total", kind=f"kind{number}_call")
    from toolkeeper.audit import ExecutionRecord

    first.record(ExecutionRecord(tool="Bash", source="agent", status="forwarded"))  # capped with the rest
    first.add("toolkeeper_approvals_waiting", 1)
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(first.render().decode()) for s in family.samples}
    kinds = [dict(labels)["kind"] for name, labels in samples if name == "toolkeeper_unknown_calls_total"]
    assert len(kinds) == CAP + 1 and value(samples, "toolkeeper_unknown_calls_total", kind=OTHER) == 5
    assert value(samples, "toolkeeper_declared_calls_total", status="forwarded", tool="Bash") == 1
    assert value(samples, "toolkeeper_approvals_waiting") == 1
    assert "unknown_calls_total{" not in second.render().decode()


# -- traces -----------------------------------------------------------------------------------------------------


class Spans:
    """What a collector stand-in received: every span with its resource's attributes."""

    def __init__(self):
        self.spans: list = []
        self.resources: list[dict] = []
        self.lock = threading.Lock()

    def take(self, request) -> None:  # an ExportTraceServiceRequest
        with self.lock:
            for resource_spans in request.resource_spans:
                self.resources.append(attributes(resource_spans.resource.attributes))
                self.spans += [span for scope in resource_spans.scope_spans for span in scope.spans]

    def wait(self, count: int) -> list:
        deadline = time.monotonic() + 15
        while len(self.spans) < count:
            assert time.monotonic() < deadline, f"{len(self.spans)} spans of {count} reached the collector"
            time.sleep(0.1)
        return list(self.spans)


def attributes(pairs) -> dict:
    return {pair.key: getattr(pair.value, pair.value.WhichOneof("value")) for pair in pairs}


def http_collector(spans: Spans):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
            spans.take(ExportTraceServiceRequest.FromString(body))
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join(5)

    return server.server_port, stop


def grpc_collector(spans: Spans):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Collector(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            spans.take(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Collector(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, lambda: server.stop(None).wait(5)


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_a_turn_is_one_trace_under_the_agents_span_and_the_model_server_joins_it(scripted, agent, protocol):
    spans = Spans()
    port, stop = (http_collector if protocol == "http/protobuf" else grpc_collector)(spans)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test"}
    if protocol == "grpc":  # the flags
        args = ["--otlp-endpoint", f"http://127.0.0.1:{port}", "--otlp-protocol", "grpc"]
    else:  # the standard variables alone
        args, env = [], {**env, "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    process = start_toolkeeper(agent / "agent.yaml", scripted.base_url, *args, env=env)
    tk = Toolkeeper(process, agent)
    try:
        scripted.script({"tool_calls": [call("lookup", {"word": "otel"}, "call_otel")]}, {"content": "{tool_result}"})
        asked = len(scripted.requests())
        tk.client().chat.completions.create(model="m", messages=user(), extra_headers={
            "traceparent": f"00-{AGENT_TRACE}-{AGENT_SPAN}-01", "tracestate": "agent=1"})
        received = spans.wait(4)
        upstream = [r["headers"] for r in scripted.requests()[asked:]]
    finally:
        tk.close_clients()
        process.stop()
        stop()
    assert len(received) == 4 and {span.trace_id.hex() for span in received} == {AGENT_TRACE}
    [request] = [span for span in received if span.kind == span.SPAN_KIND_SERVER]
    rounds = [span for span in received if span.kind == span.SPAN_KIND_CLIENT]
    [tool] = [span for span in received if span.kind == span.SPAN_KIND_INTERNAL]
    assert request.name == "POST /v1/chat/completions" and request.parent_span_id.hex() == AGENT_SPAN
    assert attributes(request.attributes)["http.response.status_code"] == 200
    assert len(rounds) == 2 and {span.parent_span_id for span in [*rounds, tool]} == {request.span_id}
    assert all(attributes(span.attributes)["gen_ai.operation.name"] == "chat" for span in rounds)
    assert tool.name == "execute_tool lookup" and tool.status.code != tool.status.STATUS_CODE_ERROR
    said = attributes(tool.attributes)
    assert {key: said[key] for key in ("gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.id",
                                       "gen_ai.tool.type", "toolkeeper.decision", "toolkeeper.decision.source",
                                       "toolkeeper.status")} == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call_otel",
        "gen_ai.tool.type": "function", "toolkeeper.decision": "allow", "toolkeeper.decision.source": "yolo",
        "toolkeeper.status": "ok"}
    assert len(said["toolkeeper.record_id"]) == 32
    # each model request carried its own round's traceparent, in the agent's trace, in place of the agent's
    carried = [{name.lower(): text for name, text in headers.items()}["traceparent"] for headers in upstream]
    assert carried == [f"00-{AGENT_TRACE}-{span.span_id.hex()}-01" for span in rounds]
    resource = spans.resources[0]
    assert resource["service.name"] == "toolkeeper" and resource["deployment.environment.name"] == "test"
    assert {"service.version", "host.name", "process.pid"} <= set(resource)


def test_tracing_off_imports_no_sdk(tmp_path):
    write_agent(tmp_path, AGENT)
    code = ("import sys; from toolkeeper.app import build_app; from toolkeeper.settings import Settings; "
            "from toolkeeper.tools import load_agent_file; "
            f"build_app(load_agent_file({str(tmp_path / 'agent.yaml')!r}), Settings(store=':memory:', audit=':memory:'));"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_serve_refuses_tracing_without_the_sdk_in_one_line(tmp_path):
    write_agent(tmp_path, AGENT)
    code = ("import importlib.metadata as m, sys; real = m.version\n"
            "def version(name):\n"
            "    if name.startswith('opentelemetry'): raise m.PackageNotFoundError(name)\n"
            "    return real(name)\n"
            "m.version = version\n"
            "from toolkeeper.cli import main\n"
            f"sys.exit(main(['serve', {str(tmp_path / 'agent.yaml')!r}, '--port', '0', '--workers', '2',"
            " '--consent', 'none', '--log-level', 'ERROR']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "OTEL_TRACES_EXPORTER": "otlp"})
    assert done.returncode == 2 and "listening" not in done.stdout
    assert done.stderr.strip().splitlines() == [
        "toolkeeper: tracing is on (--otlp-endpoint or OTEL_* variables) but opentelemetry-sdk is not installed: "
        "pip install 'toolkeeper[otel]'"]


def test_the_sdks_own_switches_are_read_as_the_sdk_reads_them():
    from toolkeeper.tracing import TracingUnavailable, tracing_on

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing_on(None, endpoint) and not tracing_on(None, {**endpoint, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_on("http://127.0.0.1:4318", {"OTEL_SDK_DISABLED": "TRUE"})
    assert not tracing_on(None, {**endpoint, "OTEL_TRACES_EXPORTER": "none"})
    with pytest.raises(TracingUnavailable, match="OTEL_TRACES_EXPORTER=console: toolkeeper sends traces to an OTLP"):
        tracing_on(None, {**endpoint, "OTEL_TRACES_EXPORTER": "console"})


def test_an_mcp_call_is_traced_under_the_clients_span(agent):
    import asyncio

    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    spans = Spans()
    port, stop = http_collector(spans)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
    process = start_toolkeeper(agent / "agent.yaml", "http://127.0.0.1:9/v1", env=env)

    async def call_over_mcp() -> None:
        headers = {"traceparent": f"00-{AGENT_TRACE}-{AGENT_SPAN}-01"}
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
                Client(streamable_http_client(process.url.removesuffix("/v1") + "/mcp", http_client=http)) as client:
            result = await client.call_tool("lookup", {"word": "otel"})
            assert not result.is_error

    try:
        asyncio.run(call_over_mcp())
        received = spans.wait(2)
    finally:
        process.stop()
        stop()
    [served] = [span for span in received if span.kind == span.SPAN_KIND_SERVER]
    [tool] = [span for span in received if span.kind == span.SPAN_KIND_INTERNAL]
    assert {span.trace_id.hex() for span in (served, tool)} == {AGENT_TRACE}
    assert served.name == "tools/call lookup" and served.parent_span_id.hex() == AGENT_SPAN
    assert attributes(served.attributes)["mcp.method.name"] == "tools/call"
    assert tool.name == "execute_tool lookup" and tool.parent_span_id == served.span_id
    assert attributes(tool.attributes)["gen_ai.operation.name"] == "execute_tool"
