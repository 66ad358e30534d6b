"""Protocol conformance: golden transcripts for OpenAI, vLLM, llama.cpp and Ollama shapes, and the Responses API.

For each plain, declared-only, mixed and multi-round turn: the exact SSE bytes
the agent receives, every request sent upstream, and the exact upstream
history of the next turn. Re-record with `python tests/conformance/record.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import check_every_call_answered, start_toolkeeper

sys.path.insert(0, str(Path(__file__).resolve().parent / "conformance"))
import messages_cases
import responses_cases
from cases import WEATHER, cases, golden_path, reassemble, run_case, sse_chunks, sse_events


@pytest.fixture(scope="module")
def conformance_tk(scripted, agent_dir):
    process = start_toolkeeper(agent_dir / "agent.yaml", scripted.base_url, "--keepalive", "60",
                               "--store", ":memory:")
    yield process
    process.stop()


@pytest.mark.parametrize(("shape", "kind"), cases(), ids=[f"{s}-{k}" for s, k in cases()])
def test_transcript_matches_the_golden_one(scripted, conformance_tk, shape, kind):
    golden = json.loads(golden_path(shape, kind).read_text())
    transcript = json.loads(json.dumps(run_case(shape, kind, conformance_tk.url, scripted)))

    assert transcript["turn1"]["agent_sse"] == golden["turn1"]["agent_sse"]  # byte for byte
    assert transcript["turn1"]["upstream"] == golden["turn1"]["upstream"]
    assert transcript["turn2"]["upstream_messages"] == golden["turn2"]["upstream_messages"]

    sse = golden["turn1"]["agent_sse"]
    chunks = sse_chunks(sse.encode())
    # nothing of a declared call reaches the agent
    assert '"lookup"' not in sse and "call_l1" not in sse and "call_a1" not in sse
    assert sse.count("data: [DONE]") == 1 and sse.endswith("data: [DONE]\n\n")
    assert len({c["id"] for c in chunks}) == 1
    assert sum(1 for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]) == 1
    assert sum(1 for c in chunks if c.get("usage")) == 1
    # the real client reassembles it
    message = reassemble(chunks)
    assert message == golden["turn1"]["agent_message"]
    if kind == "mixed":
        assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
        assert message["tool_calls"][0]["index"] == 0
    else:
        assert "tool_calls" not in message
    # and a strict server accepts the history the model gets next
    check_every_call_answered(golden["turn2"]["upstream_messages"])
    for body in golden["turn1"]["upstream"]:
        check_every_call_answered(body["messages"])
        assert body["tools"][0] == WEATHER


@pytest.mark.parametrize("kind", responses_cases.cases())
def test_responses_transcript_matches_the_golden_one(scripted, conformance_tk, kind):
    golden = json.loads(responses_cases.golden_path(kind).read_text())
    transcript = json.loads(json.dumps(responses_cases.run_case(kind, conformance_tk.url, scripted)))

    assert transcript["turn1"]["agent_sse"] == golden["turn1"]["agent_sse"]  # byte for byte
    assert transcript["turn1"]["upstream"] == golden["turn1"]["upstream"]
    assert transcript["turn2"]["upstream_input"] == golden["turn2"]["upstream_input"]
    events = sse_events(golden["turn1"]["agent_sse"].encode())
    # nothing of a declared call reaches the agent; one response, numbered without gaps
    assert '"lookup"' not in golden["turn1"]["agent_sse"] and "call_l1" not in golden["turn1"]["agent_sse"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    assert len({e["response"]["id"] for e in events if "response" in e}) == 1
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == list(range(len(added)))
    assert transcript["turn1"]["agent_response"] == golden["turn1"]["agent_response"]
    assert [i.get("call_id") for i in golden["turn1"]["agent_response"]["output"] if i.get("call_id")] == (
        ["call_w1"] if kind == "mixed" else [])


@pytest.mark.parametrize("kind", messages_cases.cases())
def test_messages_transcript_matches_the_golden_one(scripted, conformance_tk, kind):
    golden = json.loads(messages_cases.golden_path(kind).read_text())
    transcript = json.loads(json.dumps(messages_cases.run_case(kind, conformance_tk.url, scripted)))

    assert transcript["turn1"]["agent_sse"] == golden["turn1"]["agent_sse"]  # byte for byte
    assert transcript["turn1"]["upstream"] == golden["turn1"]["upstream"]
    assert transcript["turn2"]["upstream_messages"] == golden["turn2"]["upstream_messages"]
    events = sse_events(golden["turn1"]["agent_sse"].encode())
    sse = golden["turn1"]["agent_sse"]
    assert '"lookup"' not in sse and "toolu_l1" not in sse and "toolu_a1" not in sse
    assert [e["type"] for e in events].count("message_start") == 1 and events[-1]["type"] == "message_stop"
    starts = [e["index"] for e in events if e["type"] == "content_block_start"]
    assert starts == list(range(len(starts)))
    assert transcript["turn1"]["agent_message"] == golden["turn1"]["agent_message"]
    stop = golden["turn1"]["agent_message"]["stop_reason"]
    assert stop == ("tool_use" if kind == "mixed" else "end_turn")


def test_every_golden_file_is_a_case():
    expected = {golden_path(shape, kind).name for shape, kind in cases()}
    expected |= {responses_cases.golden_path(kind).name for kind in responses_cases.cases()}
    expected |= {messages_cases.golden_path(kind).name for kind in messages_cases.cases()}
    assert {p.name for p in golden_path("x", "y").parent.glob("*.json")} == expected
