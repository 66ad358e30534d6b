"""The trail for the tools a security team runs: the CLI's filters, `tail -n`, id prefixes, CSV times with their
zone, OPA decision-log events and OTLP spans exported (tests/test_telemetry.py sends them live)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime

import pytest
from conftest import ROOT, audit_cli

from toolkeeper.audit import ExecutionRecord, open_audit

RECORDS = [
    {"tool": "release", "status": "ok", "decision": "allow", "decision_source": "consent", "approver": "ada",
     "consent": "approved", "argv": ["./release.sh", "1.4.2"], "arguments": {"version": "1.4.2", "token": "[redacted]"},
     "redacted": ["token"], "policy_input": {"agent": {"id": "ci", "header": "deploy-pipeline"}, "tool": {}},
     "policy_revision": "3ce015debe3f", "request_id": "req-1", "exit_code": 0, "duration_ms": 12.5},
    {"tool": "release", "status": "denied", "decision": "deny", "decision_source": "rules",
     "decision_rule": "freeze", "policy_input": {"agent": {"id": "ci", "header": "nightly"}}, "request_id": "req-2"},
    {"tool": "Bash", "source": "agent", "status": "forwarded", "decision": "allow", "decision_source": "default",
     "request_id": "req-3"},
]


@pytest.fixture
def trail(tmp_path):
    path = tmp_path / "audit.sqlite3"
    audit = open_audit(path)
    ids = []
    for position, fields in enumerate(RECORDS):
        record = ExecutionRecord(agent="ci", time=time.time() - (len(RECORDS) - position) * 3600, **fields)
        record.record_id = f"{position:02d}" + record.record_id[2:]
        audit.decided(record)
        audit.completed(record)
        ids.append(record.record_id)
    audit.close()
    return path, ids


@pytest.mark.parametrize(("filters", "tools"), [
    (["--approver", "ada"], ["release"]),
    (["--rule", "freeze"], ["release"]),
    (["--source", "agent"], ["Bash (agent)"]),
    (["--header", "deploy-pipeline"], ["release"]),
    (["--until", "90m"], ["release", "release"]),
    (["--since", "150m", "--until", "90m"], ["release"]),
])
def test_list_filters_by_approver_rule_source_header_and_time(trail, filters, tools):
    path, _ = trail
    done = audit_cli(path, "list", *filters)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()[:-1]
    assert len(lines) == len(tools) and all(tool in line for line, tool in zip(lines, tools, strict=True)), lines


def test_show_takes_a_unique_start_of_an_id(trail):
    path, ids = trail
    shown = audit_cli(path, "show", ids[1][:6])
    assert shown.returncode == 0 and json.loads(shown.stdout)["decision_rule"] == "freeze"
    ambiguous = audit_cli(path, "show", "0")
    assert ambiguous.returncode == 1 and "more than one record" in ambiguous.stderr


def test_csv_times_are_iso_8601_with_their_zone(trail):
    path, _ = trail
    rows = audit_cli(path, "export", "--format", "csv").stdout.splitlines()[1:]
    stamp = next(part for part in rows[0].split(",") if re.match(r"\d{4}-\d\d-\d\dT", part))
    assert datetime.fromisoformat(stamp).utcoffset() is not None


def test_the_opa_export_has_the_fields_of_opas_decision_logs(trail):
    path, _ = trail
    events = [json.loads(line) for line in audit_cli(path, "export", "--format", "opa").stdout.splitlines()]
    assert len(events) == 3
    first = events[0]
    # https://www.openpolicyagent.org/docs/latest/management-decision-logs/
    assert isinstance(first["decision_id"], str) and first["path"] == "toolkeeper/decision"
    assert first["input"]["agent"]["header"] == "deploy-pipeline" and first["result"]["effect"] == "allow"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", first["timestamp"])
    assert all(isinstance(v, str) for v in first["labels"].values()) and first["labels"]["id"]
    assert first["bundles"] == {"toolkeeper": {"revision": "3ce015debe3f"}}
    assert first["masked"] == ["/input/arguments/token"]  # what redaction replaced, as JSON pointers
    assert events[1]["result"]["rule"] == "freeze"


def test_the_otel_export_is_one_span_per_call(trail):
    path, _ = trail
    request = json.loads(audit_cli(path, "export", "--format", "otel").stdout)
    spans = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert len(spans) == 3
    span = spans[0]
    assert len(span["traceId"]) == 32 and len(span["spanId"]) == 16 and span["name"] == "tool release"
    attributes = {a["key"]: next(iter(a["value"].values())) for a in span["attributes"]}
    assert attributes["toolkeeper.decision"] == "allow" and attributes["toolkeeper.status"] == "ok"
    assert attributes["toolkeeper.approver"] == "ada"
    assert int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]) == 12_500_000


def test_tail_prints_the_last_n_then_follows(trail):
    path, _ = trail
    follower = subprocess.Popen([sys.executable, "-m", "toolkeeper", "audit", "tail", "-n", "2", "--db", str(path)],
                                stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        first = [follower.stdout.readline() for _ in range(2)]
        assert "denied" in first[0] and "Bash" in first[1]
        audit = open_audit(path)
        newest = ExecutionRecord(tool="lookup", status="ok", decision="allow", agent="ci")
        audit.decided(newest)
        audit.close()
        assert newest.record_id in follower.stdout.readline()
    finally:
        follower.terminate()
        follower.wait(10)
        follower.stdout.close()
