"""The Messages API's conformance cases: the kinds of turn the other APIs play, plus thinking.

Each case is streamed through a real toolkeeper in front of the strict scripted model; its transcript
holds the exact SSE bytes the agent receives in turn 1, every request sent upstream, the message the
real anthropic client assembles, and the exact upstream messages of turn 2.
"""

from __future__ import annotations

from cases import post_raw, scripted_call, sse_events

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


HEADERS = {"x-api-key": "sk-conformance", "anthropic-version": "2023-06-01"}


def scenarios() -> dict[str, dict]:
    def step(n: int, kind: str, **fields) -> dict:
        return {"id": f"msg_{kind}{n}", **fields}

    word = {"word": "é\"q☃"}
    return {
        "plain": {"steps": [step(1, "p", content="A plain answer, with no tool.")], "then": "user"},
        "declared-only": {"steps": [step(1, "d", content="Let me look. ", tool_calls=[scripted_call("lookup", word, "toolu_l1")]),
                                    step(2, "d", content="It is a word.")], "then": "user"},
        "mixed": {"steps": [step(1, "m", content="Checking both. ", tool_calls=[
            scripted_call("lookup", word, "toolu_l1"), scripted_call("get_weather", {"city": "Oslo"}, "toolu_w1")])], "then": "tool"},
        "multi-round": {"steps": [step(1, "r", content="First. ", tool_calls=[scripted_call("lookup", {"word": "a"}, "toolu_a1")]),
                                  step(2, "r", content="Second. ", tool_calls=[scripted_call("lookup", {"word": "b"}, "toolu_b1")]),
                                  step(3, "r", content="Both done.")], "then": "user"},
        "thinking": {"steps": [step(1, "t", thinking="Look it up first.", tool_calls=[scripted_call("lookup", word, "toolu_t1")]),
                               step(2, "t", thinking="Now answer.", content="Found it.")], "then": "user"},
    }


def cases() -> list[str]:
    return list(scenarios())


def assemble(events: list[dict]) -> dict:
    """The message the real anthropic client's stream builds from the events."""
    from anthropic.lib.streaming._messages import accumulate_event

    snapshot, buffers = None, {}
    for event in events:
        if event["type"] != "ping":
            snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=buffers)
    return snapshot.model_dump(exclude_none=True, mode="json")


def run_case(kind: str, toolkeeper_url: str, scripted) -> dict:
    scenario = scenarios()[kind]
    question = [{"role": "user", "content": f"Conformance case messages/{kind}: look it up."}]
    request = {"model": "claude-test", "max_tokens": 1024, "messages": question, "tools": [WEATHER], "stream": True}
    scripted.script(*scenario["steps"])
    agent_bytes = post_raw(toolkeeper_url, "/messages", request, HEADERS)
    turn1_upstream = scripted.bodies()
    message = assemble(sse_events(agent_bytes))
    then = ({"role": "user", "content": "thanks"} if scenario["then"] == "user" else
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_w1", "content": "sunny"}]})
    content = [{k: v for k, v in block.items() if k != "parsed_output"} for block in message["content"]]
    turn2 = [*question, {"role": "assistant", "content": content}, then]
    scripted.script({"id": f"msg_{kind}9", "content": "ok"})
    post_raw(toolkeeper_url, "/messages", {"model": "claude-test", "max_tokens": 1024, "messages": turn2,
                                           "tools": [WEATHER]}, HEADERS)
    return {
        "case": f"messages/{kind}",
        "turn1": {"request": request, "agent_sse": agent_bytes.decode(), "upstream": turn1_upstream,
                  "agent_message": message},
        "turn2": {"agent_messages": turn2, "upstream_messages": scripted.bodies()[0]["messages"]},
    }


def golden_path(kind: str):
    from pathlib import Path

    return Path(__file__).resolve().parent / "golden" / f"messages-{kind}.json"
